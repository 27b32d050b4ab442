"""One decode step: draft → verify → accept. This file owns the step's uniforms layout.

Without a proposer the step is plain decoding: a tree of just the root, verified by the same
walk (one uniform). The target forward is the runner's; this room only decides what to feed it
and what to keep. The single host synchronisation of a step is `StepResult.from_device`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import torch

from blockspec.batch import StepInputs
from blockspec.speculative.logits_processing import VerifyPositions, process_logits
from blockspec.logprobs import TokenLogprob, pack_logprobs, path_logprobs, unpack_logprobs
from blockspec.sampling import filtered_probs
from blockspec.seeded_sampling import pin_seeded_rows
from blockspec.speculative.kernel_probe import kernel_mismatch
from blockspec.speculative.tree import DraftTree, accepted_kv_indices, build_tree, chain_tree, truncate_tree
from blockspec.speculative.verify import (VerifyResult, verify_chain_rejection, verify_mixed_tree, verify_sampled_tree,
                                          verify_tree, verify_tree_greedy)

log = logging.getLogger("blockspec.speculative")


class TargetForward(Protocol):
    """What the step needs of the engine's model runner."""

    def verify(self, inputs: StepInputs, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def compact(self, inputs: StepInputs, width: int, src: torch.Tensor, keep: torch.Tensor) -> None: ...


@dataclass
class StepResult:
    """Per row: committed tokens, how many were accepted drafts, how many were drafted, the
    accepted drafts' node indices (what the adaptive policy learns from: `engine/acceptance.py`)
    and (when the step was asked for them) the committed tokens' log-probabilities with the k
    alternatives the step computed (each request keeps as many as it asked for)."""

    committed: list[list[int]]
    accepted: list[int]
    drafted: list[int]
    path_nodes: list[list[int]] | None = None
    logprobs: list[list[TokenLogprob]] | None = None

    @classmethod
    def from_device(cls, result: VerifyResult, num_nodes: torch.Tensor) -> "StepResult":
        """One device→host copy for the whole step (float64 when log-probabilities come along:
        token ids and counts are exact in it)."""
        lp = result.logprobs
        if lp is None:
            return cls.from_rows(packed_result(result, num_nodes).tolist())
        packed = torch.cat([packed_result(result, num_nodes).double(), pack_logprobs(lp)], dim=1).tolist()
        width, k = result.committed.shape[1], lp.top_ids.shape[-1]
        step = cls.from_rows([[int(x) for x in row[:2 + 2 * width]] for row in packed])
        step.logprobs = [unpack_logprobs(row[2 + 2 * width:], tokens, width, k)
                         for row, tokens in zip(packed, step.committed)]
        return step

    @classmethod
    def from_rows(cls, rows: list[list[int]]) -> "StepResult":
        """From `packed_result`'s rows `[2 + 2 (D + 1)]`, read on the host."""
        accepted = [row[0] for row in rows]
        w = (len(rows[0]) - 2) // 2 if rows else 0
        return cls([row[2:2 + a + 1] for row, a in zip(rows, accepted)], accepted, [row[1] for row in rows],
                   [row[2 + w + 1:2 + w + 1 + a] for row, a in zip(rows, accepted)])

    def rows(self, keep: list[int]) -> "StepResult":
        """The result of rows `keep` only (logprobs dropped: overlapped steps have none)."""
        pick = lambda xs: None if xs is None else [xs[i] for i in keep]  # noqa: E731
        return StepResult(pick(self.committed), pick(self.accepted), pick(self.drafted), pick(self.path_nodes))


def packed_result(result: VerifyResult, num_nodes: torch.Tensor) -> torch.Tensor:
    """`[B, 2 + 2 (D + 1)]` per row: accepted drafts, drafted nodes, the committed tokens, the
    accepted path's node indices — what the host reads of a step, as one tensor (one copy)."""
    return torch.cat([result.accept_len[:, None], num_nodes[:, None].to(result.committed.dtype),
                      result.committed, result.path.to(result.committed.dtype)], dim=1)


def resolve_verify_rule(spec_verify: str, proposer) -> str:
    """The rule sampled rows are verified by. "auto" takes the one that accepts most: rejection
    sampling of drafts drawn from the drafter's q (Σ min(p, q) per position, against p(draft)
    for a point-mass draft; bench/results/sampled_tree_cpu/) where the proposer samples its
    drafts (DFlash and DDTree do under "auto": `build_proposer`), else target-only (n-gram
    drafts, or an injected proposer, are point masses). Greedy rows always walk the argmax."""
    if spec_verify != "auto":
        return spec_verify
    return "rejection" if getattr(proposer, "sample_drafts", False) else "target-only"


def _roots_only(inputs: StepInputs) -> DraftTree:
    """A chain of no drafts: the step is a plain decode of each row's root."""
    empty = torch.zeros(inputs.batch_size, 0, dtype=torch.long, device=inputs.device)
    return chain_tree(empty, inputs.roots)


class SpeculativeStep:
    """Drives a proposer (or none) and the verifier for decode steps."""

    def __init__(self, proposer, spec_verify: str = "target-only", device: torch.device | None = None):
        self.proposer = proposer
        # Tree verification: the reference's batch-wide tensor ops, or on CUDA one kernel a step
        # each (`use_verify_kernels`).
        self.greedy_walk, self.sampled_tree_verify = verify_tree_greedy, verify_sampled_tree
        self.rejection = spec_verify == "rejection"
        # Rejection sampling of trees whose children were sampled from q (ddtree), not chains.
        self.sampled_trees = self.rejection and bool(proposer and proposer.builds_trees)
        self.max_depth = proposer.max_depth if proposer else 0
        if device is not None and torch.device(device).type == "cuda":
            self.use_verify_kernels(torch.device(device), sampled_trees=self.sampled_trees)

    def use_verify_kernels(self, device: torch.device, sampled_trees: bool = True) -> None:
        """Verify trees with one kernel a step each (`walk_kernel.py`) instead of ~12 small ops a
        depth (greedy walk) or ~25 a node (sampled trees; checked only when `sampled_trees`: a
        step that never verifies one does not compile it), each checked here against its
        reference on a probe tree; one that cannot run or differs is not used, and the log says so."""
        from blockspec.speculative import walk_kernel
        probe = build_tree(torch.log_softmax(torch.arange(2 * 4 * 6, dtype=torch.float32).reshape(2, 4, 6).sin() * 3, -1),
                           9, None, torch.tensor([1, 2]))
        targets = probe.tokens[:, [1, 5, 2, 3, 7, 8, 9, 4, 6, 0]]          # leads the walk a few nodes deep
        p = torch.softmax(torch.arange(2 * 10 * 6, dtype=torch.float32).reshape(2, 10, 6).cos() * 3, -1)
        q = torch.softmax(torch.arange(2 * 4 * 6, dtype=torch.float32).reshape(2, 4, 6).sin() * 2, -1)
        uniforms = torch.linspace(0.05, 0.95, 2 * 10, dtype=torch.float64).reshape(2, 10)
        checks = (("greedy_walk", verify_tree_greedy, walk_kernel.verify_tree_greedy_triton,
                   (targets, probe.tokens, probe.parents, 4)),
                  ("sampled_tree_verify", verify_sampled_tree, walk_kernel.verify_sampled_tree_triton,
                   (p, q, probe.tokens, probe.parents, uniforms[:, :9], uniforms[:, 9], 4)))
        for name, reference, kernel, args in checks[:2 if sampled_trees else 1]:
            error = kernel_mismatch(kernel, reference, args, device, lambda r: (r.accept_len, r.path, r.committed))
            if not error:
                setattr(self, name, kernel)
            else:
                log.warning("the %s kernel is unusable (%s): the reference ops verify instead", name, error)

    @property
    def uniforms_per_row(self) -> int:
        """Every request draws this many uniforms per step, whatever is accepted (fixed shapes:
        the step is one capturable function). Target-only verification uses one per
        depth (L + 1); rejection sampling of a chain [draft L | accept L | residual L + 1]; of
        a sampled tree of N nodes [draw N | accept N | bonus 1]."""
        if self.sampled_trees:
            return 2 * self.proposer.max_nodes + 1
        return 3 * self.max_depth + 1 if self.rejection else self.max_depth + 1

    def uniforms_at(self, width: int) -> int:
        """The uniforms per row of a step whose whole batch runs at `width`: a plain step (width
        1) draws one, its token's (a plain engine's layout: drawing and shipping the 2 N + 1 of a
        64-node tree's layout was host time a plain engine does not spend); a wider step
        `uniforms_per_row`. Lossless: the width, and so the layout, depends on past steps only,
        and every uniform a step reads is fresh. (A row cut to width 1 inside a wider verify
        keeps the full layout: its token's uniform is its bonus's there, at a fixed offset.)"""
        return 1 if width == 1 else self.uniforms_per_row

    @property
    def drafts_on_device(self) -> bool:
        """True when drafting is device work too (no proposer, DFlash chains): the whole step,
        draft included, is then one capturable function (`device_step`)."""
        return self.proposer is None or self.proposer.drafts_on_device

    @property
    def full_width(self) -> int:
        """The method's verify width N + 1 (1 without a proposer)."""
        return 1 + (self.proposer.max_nodes if self.proposer else 0)

    def draft(self, inputs: StepInputs, width: int | None = None,
              row_widths: torch.Tensor | None = None) -> tuple[DraftTree, torch.Tensor | None]:
        """The step's tree: the proposer's, cut to `width` nodes (root included) and per row to
        `row_widths` (`truncate_tree`). Width 1 for the whole batch skips the drafter: plain
        decoding (its context still learns the committed token in `on_verify`).

        Why a chosen width keeps verification lossless: `width` and `row_widths` are fixed
        before the step from past steps only (the adaptive policy never sees this step's target
        output), the uniforms' layout does not depend on them (`uniforms_per_row`, the fixed
        offsets in `verify`), and every verifier is exact for any tree it is given, so every
        committed token is still an exact draw from the target whatever was chosen."""
        if self.proposer is None or (width == 1 and row_widths is None):
            return _roots_only(inputs), None
        tree, draft_probs = self.proposer.propose(inputs.seqs, inputs, width)
        tree = tree.to(inputs.device)
        if (width is not None and width < tree.width) or row_widths is not None:
            tree = truncate_tree(tree, min(width or tree.width, tree.width), row_widths)
        return tree, draft_probs

    def run(self, runner: TargetForward, inputs: StepInputs, graphed=None, width: int | None = None,
            row_widths: torch.Tensor | None = None) -> StepResult:
        """One decode step at verify `width` (None: the method's full width; see `draft`).
        `graphed(inputs, tree)`, when given and able to take this batch, replays a captured
        `device_step` at that width (CUDA graphs) and must return exactly what it would."""
        tree = draft_probs = None
        cutters = [p for p in inputs.processors if hasattr(p, "constrain_tree")]
        if not self.drafts_on_device or cutters or row_widths is not None:
            # Host-side drafting (n-gram lookup, DDTree's heap), or per-row widths (eager).
            tree, draft_probs = self.draft(inputs, width, row_widths)
            graphed = None if row_widths is not None else graphed
        for cutter in cutters:
            # Drafts a processor forbids (a grammar's) are cut before the target forward.
            tree = cutter.constrain_tree(inputs.seqs, tree, sampled_drafts=draft_probs is not None)
        if graphed is not None and draft_probs is None and graphed.can_run(inputs.batch_size, inputs.needs_eager):
            result, num_nodes = graphed(inputs, tree)
        else:   # eager at the same width (drafting on the device happens in device_step)
            result, num_nodes = self.device_step(runner, inputs, tree, draft_probs, width=width)
        return StepResult.from_device(result, num_nodes)

    def device_step(self, runner: TargetForward, inputs: StepInputs, tree: DraftTree | None = None,
                    draft_probs: torch.Tensor | None = None,
                    width: int | None = None) -> tuple[VerifyResult, torch.Tensor]:
        """Draft at verify `width` (unless `tree` is given), verify, accept, feed the drafter the
        committed path. Device work only, no host sync. Returns the verify result and the
        drafted node counts."""
        if tree is None:
            tree, draft_probs = self.draft(inputs, width)
        result, path_features = self.verify_accept(runner, inputs, tree, draft_probs)
        if self.proposer is not None and path_features is not None:
            self.proposer.on_verify(inputs, result.accept_len, path_features)
        return result, tree.num_nodes

    def verify_accept(self, runner: TargetForward, inputs: StepInputs, tree: DraftTree,
                      draft_probs: torch.Tensor | None = None) -> tuple[VerifyResult, torch.Tensor | None]:
        """Target forward over the tree, verification, K/V compaction of the accepted path.
        Pure device work, no host sync: the part of a step a CUDA graph captures. Returns the
        result and the accepted path's target features `[B, D+1, F]` (None without capture)."""
        raw_logits, features = runner.verify(inputs, tree)
        # The per-position seam: each node's logits see the history up to that node (prompt,
        # committed tokens, the draft path), so verification samples exactly the processed target.
        # The drafter's q is left unprocessed: target-only verification accepts any proposal, and
        # rejection sampling is exact for any q the drafts were really drawn from.
        logits = process_logits(raw_logits, inputs.processors, VerifyPositions(inputs.seqs, tree))
        if inputs.all_greedy and draft_probs is None:
            # No filters, no probabilities: the same walk over the argmax (a batch-wide fact
            # known on the host, so a graph is captured for each case).
            # The tree's own depth: a tree cut to a narrower width (adaptive) walks only its levels.
            result = self.greedy_walk(logits.argmax(-1), tree.tokens, tree.parents, tree.max_depth, tree.is_chain)
        else:
            probs = filtered_probs(logits, inputs.sampling)
            if inputs.race_keys is not None:
                # Seeded rows: p pinned to the race winner of the position each node predicts,
                # so every verifier commits what seeded plain decoding would (seeded_sampling.py).
                pin_seeded_rows(probs, inputs.race_keys, inputs.prefix_lens[:, None] + tree.depths + 1)
            result = self.verify(probs, tree, draft_probs, inputs.uniforms, inputs.walked_rows)
        if inputs.num_logprobs is not None:
            result.logprobs = path_logprobs(raw_logits, result.path, result.committed, inputs.num_logprobs)
        if tree.width == 1:
            # Plain decoding: the root alone is kept where it was written, and its features are
            # the path's (a few kernels less in every plain step, the policy's commonest).
            return result, features
        src, keep = accepted_kv_indices(result.path, result.accept_len)
        # Any row that branches may accept a path with gaps. (A batch's deepest row being a full
        # chain says nothing about the other rows: each row is checked when the tree is built.)
        if not tree.is_chain:
            runner.compact(inputs, tree.width, src, keep)
        path_features = None
        if features is not None:
            idx = src.clamp(min=0)[:, :, None].expand(-1, -1, features.shape[-1])
            path_features = features.gather(1, idx)
        return result, path_features

    def verify(self, probs: torch.Tensor, tree: DraftTree, draft_probs: torch.Tensor | None,
               uniforms: torch.Tensor, greedy_rows: torch.Tensor | None = None) -> VerifyResult:
        """Target-only tree walk, rejection sampling of a chain sampled from q, or recursive
        rejection sampling of a tree sampled from q with greedy rows walked (docs/verification.md)."""
        if tree.width == 1:
            # Plain decoding (the adaptive policy's width 1): no drafts, one draw from p with the
            # step's one uniform per row (`uniforms_at`).
            return verify_tree(probs, tree.tokens, tree.parents, uniforms[:, :1])
        if self.sampled_trees:
            if draft_probs is None:
                # Sampled rows' children came from q: without it they cannot be verified, and
                # no q is made up for them.
                raise ValueError("spec_verify 'rejection' on a tree: the proposer gave no draft distribution q")
            return verify_mixed_tree(probs, draft_probs, tree, uniforms, greedy_rows, tree.max_depth,
                                     layout_nodes=self.proposer.max_nodes, greedy_walk=self.greedy_walk,
                                     sampled_verify=self.sampled_tree_verify)
        if draft_probs is None:
            return verify_tree(probs, tree.tokens, tree.parents, uniforms[:, :tree.max_depth + 1])
        # The uniforms' layout is the full chain's (M = max depth): a shorter chain (adaptive)
        # reads the first L of each part, never the draft part's uniforms.
        L, M = tree.width - 1, self.max_depth
        return verify_chain_rejection(probs, draft_probs[:, :L], tree.tokens[:, 1:], uniforms[:, M:M + L],
                                      uniforms[:, 2 * M:2 * M + L + 1], tree.num_nodes)
