"""Drafters as the engine sees them: propose a tree per step, learn from what was committed.

`propose(seqs, inputs)` returns `(tree, draft_probs)`: draft_probs is None for point-mass
drafts (verified target-only) and the filtered draft distribution q `[B, L, V]` when the
drafts were sampled from q (verified by rejection sampling; sampled chains draw with
`inputs.uniforms[:, :L]`, sampled trees with `[:, :N]`, see `speculative/step.py`). Trees stay
on the device.

Each proposer has static sizes, known before anything is loaded, so that the engine can size
the cache and every step has the same shapes:
  max_depth   L: deepest draft node; a verify step draws L + 1 uniforms per request
  max_nodes   N: draft nodes per request (verify width N + 1)
  block_size  drafter cache positions a step writes past the committed length
"""

from __future__ import annotations

import logging

import torch

from blockspec.attention.backend import AttentionBackend
from blockspec.attention.metadata import AttentionBatch
from blockspec.batch import StepInputs
from blockspec.sampling import filtered_probs, sample_from_probs, tempered_probs
from blockspec.seeded_sampling import pin_seeded_rows
from blockspec.speculative.kernel_probe import kernel_mismatch
from blockspec.speculative.ngram import propose_ngram_batch
from blockspec.speculative.ring_kernel import append_rows, append_rows_triton
from blockspec.speculative.sampled_tree import fill_with_samples, race_ranked_scores, sample_children, shape_scores
from blockspec.speculative.tree import DraftTree, build_tree, chain_tree, with_rows

log = logging.getLogger("blockspec.proposers")


class Proposer:
    """The interface the engine drives; hooks a drafter needs no state for are no-ops.

    load(target, num_pages, page_size, backend)  load weights and any cache sharing the target's pages
    on_prefill(features, batch, positions)  committed prompt chunks' target features
    propose(seqs, inputs) -> (DraftTree, draft_probs | None)
    on_verify(inputs, accept_len, path_features)  the committed path's target features
    """

    target_layer_ids: tuple[int, ...] = ()
    block_size = 0
    max_depth = 0
    max_nodes = 0
    builds_trees = True      # False only when every tree is a chain (verify needs no compaction)
    greedy_chains = False    # True when greedy rows always draft chains and sampled rows trees (`sampled_trees`)
    drafts_on_device = False  # True when propose() is device work only (capturable in a CUDA graph)

    def load(self, target, num_pages: int, page_size: int, backend: AttentionBackend) -> None:
        pass

    def on_prefill(self, features, batch: AttentionBatch, positions) -> None:
        pass

    def propose(self, seqs, inputs: StepInputs, width: int | None = None) -> tuple[DraftTree, torch.Tensor | None]:
        """The step's tree (and q where drafts were sampled). `width`: the verify width the step
        will keep (None: the full width); a proposer may draft less for it, and what it drafts
        is the full tree cut to that width (`truncate_tree`), up to rounding."""
        raise NotImplementedError

    def on_verify(self, inputs: StepInputs, accept_len: torch.Tensor, path_features: torch.Tensor) -> None:
        pass

    def flush_context(self) -> None:
        pass

    def context_pending(self) -> bool:
        """Whether `flush_context` has writes to make (what a drafting step would do first)."""
        return False

    def after_plain_replay(self, rows: int) -> None:
        pass


# The deferred rows' ring holds this many bytes of rows (target features and position, slot), at
# least MIN_DEFERRED_ROWS rows, and is written out at half full. By bytes, not rows: a write is
# ≈ 25 eager launches (host time: at 1,024 rows the bundled pair's 3.2 KB rows flushed every 16
# steps at 64 rows), while the memory held is what must stay bounded (an 8B target's rows are 40 KB).
MAX_DEFERRED_BYTES = 64 << 20
MIN_DEFERRED_ROWS = 2048


def capturing(t: torch.Tensor) -> bool:
    """Whether `t`'s step is being captured into a CUDA graph (its Python will not run at replay)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


class DeferredContext:
    """The drafter's context writes of plain steps (width 1), held back and written in one batch
    before the drafter next reads its context (issue 15: a speculative engine's plain step
    should cost what a plain engine's does; the context write was ≈ 1 ms of a 12 ms CPU step at
    batch 1, and 0.08 ms of GPU launches in a 0.6 ms H200 step).

    Exact: the write of a token's context depends only on its own target features, position
    and slot (no attention among context rows), so writing N rows late in one call stores what N
    writes would have, up to the batched product's rounding. Order is kept: rows are written
    first-in first-out, and the engine flushes before anything else writes or reads the
    drafter's context — a drafting step, a prefill (a finished request's slots may be reused by
    a new one; its stale rows land first and are overwritten).

    The rows go to a ring on the device, `capacity` rows plus one scratch row, by device work
    only: a captured plain step's replays append their rows with no host work (copying them out
    of the graph's static tensors after each replay cost 82 µs of host time a step on the H100,
    the largest part of the speculative engine's extra over a plain engine's plain step). The
    device's write position (`head`) advances in the step by its live rows; the host mirrors it
    (`rows`), counting a replay's real rows (`count`, after the replay) or, eagerly, the live rows.
    Padding rows (a graph bucket's rows past the batch) have position 0 — a decode row's position
    is its cached length, at least 1 — and go to the scratch row."""

    def __init__(self, write, features: int, dtype: torch.dtype, device, capacity: int | None = None):
        self.write = write              # write(features [N, 1, F], positions [N, 1], slots [N, 1])
        row_bytes = features * dtype.itemsize + 2 * torch.int64.itemsize
        self.capacity = capacity or max(MIN_DEFERRED_ROWS, MAX_DEFERRED_BYTES // row_bytes)
        self.features = torch.zeros(self.capacity + 1, features, dtype=dtype, device=device)   # [R + 1, F]
        self.meta = torch.zeros(self.capacity + 1, 2, dtype=torch.int64, device=device)        # position, slot
        self.head = torch.zeros(1, dtype=torch.int64, device=device)    # rows ever appended (device)
        self.tail = 0                   # rows ever written out (host)
        self.rows = 0                   # rows appended and not written out (host)
        self.append = append_rows       # on CUDA the same as two launches (`use_kernel`)
        # Rows a write takes at most (None: all). The engine sets its prefill warm-up's widest chunk:
        # a write is shaped as a prefill's, one sequence `[1, n]`, so every write runs kernels the
        # warm-up compiled (engine/warmup.py). Written as `[n, 1]` rows, up to half the ring at
        # once (13,000 rows for the bundled pair), a write could meet shape classes nothing had
        # compiled, and a compile mid-run costs 0.3–2 s on a GPU host.
        self.max_write_rows: int | None = None

    def use_kernel(self) -> None:
        """Append with `append_rows_triton` (two launches where the torch form makes about eleven)
        once it matches the reference on a probe that wraps the ring and holds padding; the log
        says when it does not."""
        F, device = self.features.shape[1], self.head.device
        error = kernel_mismatch(lambda: _probe_append(append_rows_triton, F, device),
                                lambda: _probe_append(append_rows, F, "cpu"), (), device)
        if error:
            log.warning("the deferred context's append kernel is unusable (%s): torch ops append its rows", error)
        else:
            self.append = append_rows_triton

    def add(self, features: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> None:
        """A plain step's rows: features `[B, 1, F]`, positions and slots `[B, 1]`; device work
        only (captured in a plain step's graph). Counted here when run eagerly."""
        B = features.shape[0]
        if B > self.capacity // 2:
            raise ValueError(f"a plain step of {B} rows exceeds half the deferred context's {self.capacity}")
        self.append(self.features, self.meta, self.head, features, positions, slots)
        if not capturing(features):
            self.count(int((positions[:, 0] > 0).sum()))

    def count(self, rows: int) -> None:
        """`rows` rows were appended: by `add` run eagerly, or by a replay of a captured plain step."""
        self.rows += rows
        if self.rows > self.capacity // 2:    # room left for any step's rows (`add` refuses more)
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        index = (self.tail + torch.arange(self.rows, device=self.meta.device)) % self.capacity
        features, meta = self.features.index_select(0, index), self.meta.index_select(0, index)
        self.tail, self.rows = self.tail + self.rows, 0
        positions, slots = meta[:, 0].contiguous(), meta[:, 1].contiguous()
        chunk = self.max_write_rows or len(index)
        for start in range(0, len(index), chunk):     # in order: a later row may reuse an earlier one's slot
            end = start + chunk
            self.write(features[None, start:end], positions[None, start:end], slots[None, start:end])


def _probe_append(append, features: int, device) -> tuple[torch.Tensor, ...]:
    """A ring of 5 rows after three appends (the last wraps its end; padding rows mid-batch)."""
    ring = torch.zeros(6, features, device=device)
    meta = torch.zeros(6, 2, dtype=torch.int64, device=device)
    head = torch.zeros(1, dtype=torch.int64, device=device)
    for step, live in enumerate([(1, 1, 0), (1, 0, 1), (1, 1, 1)]):
        # Made on the CPU and moved: a device's sin may round differently from the CPU's.
        positions = torch.tensor(live)[:, None] * (10 * step + torch.arange(1, 4)[:, None])
        rows = torch.arange(3 * features, dtype=torch.float32).view(3, 1, features).sin() + step
        append(ring, meta, head, rows.to(device), positions.to(device), positions.to(device) + 100)
    return ring[:5].cpu(), meta[:5].cpu(), head.cpu()


class NgramProposer(Proposer):
    """Prompt lookup: continue the most recent earlier match of the last n tokens."""

    builds_trees = False

    def __init__(self, num_draft: int, max_ngram: int = 3):
        self.max_depth = self.max_nodes = num_draft
        self.max_ngram = max_ngram

    def propose(self, seqs, inputs: StepInputs, width: int | None = None):
        drafts, counts = propose_ngram_batch([s.tokens for s in seqs], self.max_nodes, self.max_ngram)
        return chain_tree(drafts, inputs.roots, counts), None


class DFlashProposer(Proposer):
    """Linear DFlash (a chain of argmax drafts) or DDTree (a best-first tree) from one drafter pass."""

    def __init__(self, config, block_size: int | None, tree_budget: int | None = None,
                 tree_topk: int | None = None, sample_drafts: bool = False, draft_dir: str | None = None,
                 sampled_trees: bool = False):
        """`config`: the drafter's `DFlashConfig` (sizes are fixed here, weights come later:
        from `draft_dir` in `load`, or an in-memory drafter through `attach`).
        `sample_drafts`: draw drafts from the filtered drafter distribution q: a chain of draws,
        or (DDTree) the tree's children as draws without replacement (`sampled_tree`).
        `sampled_trees` (linear DFlash with `sample_drafts`): sampled rows draft such a tree of
        the block's node count instead of a chain of draws, and greedy rows keep the argmax
        chain (`greedy_chains`): a sampled row's drafts accept Σ min(p, q) a position as a chain,
        and its sibling draws raise that further (at T = 1 on the bundled pair 1.67 against 2.00
        tokens a step: bench/results/sampled_trees_dflash_cpu/), while a greedy row's chain costs
        what DFlash's does. (A greedy row beside sampled ones drafts its plain argmax chain: a
        grammar's guided chain is for all-greedy batches; its cutter still trims the tree.)"""
        self.sample_drafts = sample_drafts
        self.draft_dir = draft_dir
        self.config = config
        trained = config.block_size
        self.block_size = block_size or trained
        if not 2 <= self.block_size <= trained:
            raise ValueError(f"block_size must be between 2 and the drafter's trained block size {trained}, "
                             f"got {self.block_size}")
        self.max_depth = self.block_size - 1
        if sampled_trees and (tree_budget is not None or not sample_drafts):
            raise ValueError("sampled_trees is for linear DFlash with sampled drafts (no tree_budget, sample_drafts)")
        self.tree_budget = tree_budget
        self.tree_topk = tree_topk
        self.max_nodes = tree_budget if tree_budget is not None else self.max_depth
        self.greedy_chains = sampled_trees
        self.builds_trees = tree_budget is not None or sampled_trees
        # A narrower width drafts a block of its own width (the engine sets it: `draft_block`),
        # or the whole block, cut.
        self.width_blocks = False
        self.drafts_on_device = True
        self.build_tree = build_tree     # DDTree's search; on CUDA the same search as a kernel (attach)
        self.sample_children = sample_children   # a sampled tree's draws; on CUDA a kernel too (attach)
        self.target_layer_ids = config.target_layer_ids
        self.mask_token_id = config.mask_token_id

    def load(self, target, num_pages: int, page_size: int, backend: AttentionBackend) -> None:
        """Weights in the target's dtype and device."""
        from blockspec.models.dflash import load_drafter
        weight = target.lm_head.weight
        self.attach(load_drafter(self.draft_dir, target.config, weight.dtype, weight.device, backend),
                    target, num_pages, page_size)

    def attach(self, drafter, target, num_pages: int, page_size: int) -> None:
        """Use a drafter already in memory; its context cache shares the target's pages (same
        slots, own tensors)."""
        self.drafter, self.target = drafter, target
        weight = target.lm_head.weight
        if weight.device.type == "cuda":
            # The drafter gets the target's fast path: merged products, and the fused kernels
            # when the target uses any (so --disable-fused-ops reaches it), each checked exact.
            from blockspec.models.fast_path import prepare_drafter_for_cuda
            prepare_drafter_for_cuda(drafter, fused_ops=any(getattr(m, "fused", False) for m in target.modules()))
        if weight.device.type == "cuda" and self.builds_trees:
            self._use_tree_kernel(weight.device)
        self.cache = drafter.config.cache_spec.allocate(num_pages, page_size, weight.dtype, weight.device)
        self.deferred = DeferredContext(lambda f, p, s: drafter.write_context(f, p, s, self.cache),
                                        len(drafter.config.target_layer_ids) * drafter.config.hidden_size,
                                        weight.dtype, weight.device)
        if weight.device.type == "cuda":
            self.deferred.use_kernel()

    def _use_tree_kernel(self, device: torch.device) -> None:
        """On CUDA the tree is built by a kernel, so draft → tree → verify is one CUDA graph (on
        the CPU the host heap is the faster; both give the same tree, tested), and a sampled
        tree's children are drawn by one kernel a step (`children_kernel.py`) instead of ~25
        batch-wide ops a draw (checked only when this proposer samples drafts). Each is checked against its reference once here; one that cannot
        run or differs is not used (trees built on the host, or the reference draws), and the
        log says so."""
        from blockspec.speculative.children_kernel import sample_children_triton
        from blockspec.speculative.tree_kernel import build_tree_triton
        fields = lambda tree: (tree.tokens, tree.parents, tree.depths)  # noqa: E731
        probe = torch.log_softmax(torch.arange(2 * 3 * 8, dtype=torch.float32).reshape(2, 3, 8).sin() * 4, -1)
        error = kernel_mismatch(build_tree_triton, build_tree, (probe, 6), device, fields)
        if not error:
            self.build_tree = build_tree_triton
        else:
            log.warning("DDTree's tree kernel is unusable (%s): trees are built on the host, outside the CUDA graph", error)
            self.drafts_on_device = False
        if not self.sample_drafts:
            return
        q = torch.softmax(torch.arange(2 * 3 * 7, dtype=torch.float32).reshape(2, 3, 7).cos() * 3, -1)
        q[:, :, 5:] = 0.0                                        # a support smaller than the children
        shape = build_tree(torch.log_softmax(torch.arange(2 * 3 * 7, dtype=torch.float32).reshape(2, 3, 7).sin(), -1), 9)
        uniforms = torch.linspace(0.03, 0.97, 18, dtype=torch.float64).reshape(2, 9)
        error = kernel_mismatch(sample_children_triton, sample_children, (shape.parents, shape.depths, q, uniforms), device)
        if not error:
            self.sample_children = sample_children_triton
        else:
            log.warning("the sampled tree's children kernel is unusable (%s): the reference ops draw them", error)

    @torch.inference_mode()
    def on_prefill(self, features, batch: AttentionBatch, positions) -> None:
        self.drafter.write_context(features, positions, batch.slots, self.cache)

    @torch.inference_mode()
    def propose(self, seqs, inputs: StepInputs, width: int | None = None):
        """One drafter pass over the whole block; the target's head only on the depths a step
        at `width` can use (a chain of w nodes drafts w − 1, a tree of budget w − 1 reaches no
        deeper): at narrow widths most of the drafter's head is skipped. The block is the same,
        so the drafts are the full pass's up to the head's rounding (a product over fewer rows
        may round its last bit differently); any drafts verify exactly, so that is no matter.

        With `width_blocks` the pass is over a block of only the depths used (root and depth
        masks), as a static engine of that block size drafts: on a CPU the drafter's cost grows
        with the block (a width-4 step of 4 rows cost 21.0 ms drafting the whole block of 16,
        16.2 ms a block of 4, as the static block-4 engine does), where its drafts lose little
        (bench/results/block_size_cpu: 2.56 accepted at block 4 against the block of 16 cut to
        3 drafts' 2.58; 3.18 against 3.39 at 8)."""
        S, B = self.block_size, inputs.batch_size
        depth = self.max_depth if width is None else max(1, min(self.max_depth, width - 1))
        if self.width_blocks:
            S = depth + 1
        budget = None if not self.builds_trees else (
            self.max_nodes if width is None else max(1, min(self.max_nodes, width - 1)))
        if self.greedy_chains and inputs.all_greedy:
            budget = None           # every row's draft is its argmax chain: DFlash's step, as captured
        block = torch.full((B, S), self.mask_token_id, dtype=torch.long, device=inputs.device)
        block[:, 0] = inputs.roots
        batch = inputs.attention_batch(S, torch.full((B,), S, device=inputs.device), "full")
        hidden = self.drafter(self.target.embed(block), inputs.positions(S), self.cache, batch)
        logits = self.target.logits(hidden[:, 1:1 + depth])              # [B, depth, V]
        if self.sample_drafts and budget is None and not inputs.all_greedy:
            # (An all-greedy batch takes the argmax chain below: the same drafts as sampling from
            # its point-mass q, verified by the greedy walk without probabilities.)
            q = filtered_probs(logits, inputs.sampling)
            if inputs.race_keys is not None:
                # A seeded row drafts the winner of its own race run on q (seeded_sampling.py).
                pin_seeded_rows(q, inputs.race_keys, self._draft_positions(inputs)[:, :depth])
            drafts = sample_from_probs(q, inputs.uniforms[:, :depth])
            return chain_tree(drafts, inputs.roots), q
        if budget is None:
            drafts = logits.argmax(-1)
            for guide in (p for p in inputs.processors if hasattr(p, "guide_chain")):
                drafts = guide.guide_chain(seqs, logits, drafts)  # e.g. a grammar's allowed tokens
            return chain_tree(drafts, inputs.roots), None
        if self.sample_drafts and not inputs.all_greedy:
            return self.sampled_tree(logits, inputs, budget)
        return self.build_tree(torch.log_softmax(logits, -1), budget, self.tree_topk, inputs.roots), None

    def _draft_positions(self, inputs: StepInputs) -> torch.Tensor:
        """`[B, L]` the absolute position of the token each depth drafts (the root sits at prefix_len)."""
        return inputs.positions(self.max_depth + 1)[:, 1:]

    def sampled_tree(self, logits: torch.Tensor, inputs: StepInputs, budget: int) -> tuple[DraftTree, torch.Tensor]:
        """DDTree with sampled children for unseeded sampled rows, drawn from q at the row's
        temperature without its truncation filters (`tempered_probs`: p keeps them, and the
        verifier needs only the law the children came from). Greedy rows keep today's top-k
        tree; seeded rows (walked on one-hot targets) a top-k tree in the order of their race on
        the filtered q, whose first child is the race's winner (seeded_sampling.py)."""
        q = tempered_probs(logits, inputs.sampling)
        walked = inputs.walked_rows
        scores = shape_scores(logits, q, ~walked)
        if inputs.race_keys is not None:
            raced = filtered_probs(logits, inputs.sampling)
            scores = race_ranked_scores(scores, raced, inputs.race_keys,
                                        self._draft_positions(inputs)[:, :logits.shape[1]])
        tree = self.build_tree(scores, budget, self.tree_topk, inputs.roots)
        # Node i draws with uniform i − 1 whatever the budget: a smaller tree's draws are the full one's.
        tree = fill_with_samples(tree, q, inputs.uniforms[:, :budget], ~walked, self.sample_children)
        if self.greedy_chains:
            # Greedy rows draft the argmax chain (as long as the tree's budget: the logits hold
            # that many depths), so the greedy walk accepts what DFlash's chain would; the rows
            # are swapped in the [B, W] tree, not steered through the [B, L, V] scores.
            tree = with_rows(tree, chain_tree(logits.argmax(-1), inputs.roots), inputs.sampling.greedy)
        return tree, q

    @torch.inference_mode()
    def on_verify(self, inputs: StepInputs, accept_len: torch.Tensor, path_features: torch.Tensor) -> None:
        """Append the committed root + accepted nodes' features to the drafter's context; a plain
        step's (one row each, no drafts) is deferred (`DeferredContext`)."""
        width = path_features.shape[1]
        if width == 1:       # the root is always kept: its slot needs no mask by accept_len
            self.deferred.add(path_features, inputs.positions(1), inputs.slots(1))
            return
        self.drafter.write_context(path_features, inputs.positions(width), inputs.slots(width, accept_len + 1),
                                   self.cache)

    def context_pending(self) -> bool:
        return self.deferred.rows > 0

    def flush_context(self) -> None:
        if self.deferred.rows:             # (checked first: the engine asks before every drafting step)
            with torch.inference_mode():
                self.deferred.flush()

    def after_plain_replay(self, rows: int) -> None:
        self.deferred.count(rows)


def build_proposer(config, target_config):
    """The proposer for `config.spec`, or a clear error when it cannot be honoured."""
    from blockspec.models.dflash import read_drafter_config
    if config.spec == "ngram":
        if config.spec_verify == "rejection":
            raise ValueError("spec_verify 'rejection' needs sampled drafts; n-gram drafts are point masses")
        if config.draft_model:
            raise ValueError("spec 'ngram' uses no draft model; drop --draft-model")
        block = config.block_size or 8
        if block < 2:
            raise ValueError("block_size must be at least 2 for speculative decoding")
        return NgramProposer(num_draft=block - 1)
    if config.spec in ("dflash", "ddtree"):
        if not config.draft_model:
            raise ValueError(f"spec {config.spec!r} needs a draft model (draft_model / --draft-model)")
        drafter_config = read_drafter_config(config.draft_model, target_config)
        if config.spec == "dflash":
            return DFlashProposer(drafter_config, config.block_size, sample_drafts=config.spec_verify != "target-only",
                                  draft_dir=config.draft_model, sampled_trees=config.sampled_trees)
        return DFlashProposer(drafter_config, config.block_size, config.tree_budget or 16, config.tree_topk,
                              sample_drafts=config.spec_verify != "target-only", draft_dir=config.draft_model)
    raise ValueError(f"unknown spec {config.spec!r}")
