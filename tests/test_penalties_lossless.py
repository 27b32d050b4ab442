"""Penalties and logit_bias keep speculative sampling exact (docs/logits_processing.md).

The law of a penalised process depends on its history, so the exact law of the first 3 tokens
over the 12-token fixture is enumerated with each prefix's logits processed by the per-sequence
rule (`reference_processed_logits`); plain decoding, DFlash chains and DDTree trees, verified
target-only and by rejection sampling, must fit it. The negative control is the bug this seam
exists to prevent: penalising every verify position with the committed history only (ignoring
the draft path before it), which must fail the same test.

The random tiny drafter's drafts are rarely accepted under strong penalties (accept length
≈ 1.01), which would leave the draft-path history almost untested; so the target-only cases
draft with an oracle of the exact law (a chain of its most likely continuation, or a tree of
the two most likely children per node), whose drafts are accepted often (checked), and the
rejection cases keep the real drafter (they need its q).
"""

import pytest
import torch

from blockspec.engine.engine import Engine
from blockspec.llm import LLM, engine_config
from blockspec.speculative.logits_processing import VerifyPositions
from blockspec.sampling import SamplingParams
from blockspec.speculative.proposers import Proposer
from blockspec.speculative.tree import PAD_PARENT, ROOT_PARENT, DraftTree
from dflash_fixtures import write_dflash_drafter
from test_lossless import ALPHA, NUM_TOKENS, PROMPT, exact_law_llm, exact_laws, law_fit

PENALISED = {
    "presence_frequency_bias": SamplingParams(temperature=1.0, presence_penalty=1.5, frequency_penalty=0.8,
                                              logit_bias={3: 1.5, 0: -100.0}),
    "repetition_topk_bias": SamplingParams(temperature=0.8, top_k=6, repetition_penalty=1.8, logit_bias={5: -2.0}),
    "negative_frequency_topp": SamplingParams(temperature=1.2, top_p=0.9, frequency_penalty=-1.2,
                                              presence_penalty=0.6, repetition_penalty=0.7),
}
# (drafts, verification, setting): every setting; plain, oracle chains and trees, the real drafter's
# sampled chains and trees.
CASES = [("none", "target-only", "repetition_topk_bias"),
         ("oracle-chain", "target-only", "negative_frequency_topp"), ("dflash", "rejection", "presence_frequency_bias"),
         ("oracle-tree", "target-only", "presence_frequency_bias"), ("ddtree", "rejection", "negative_frequency_topp")]


class LawOracle(Proposer):
    """Drafts from the exact law of `law` (the first NUM_TOKENS tokens): at each node its
    `branching` most likely next tokens given the path so far, to depth NUM_TOKENS − 1
    (host-side, point-mass drafts: verified target-only)."""

    def __init__(self, law: dict, branching: int):
        self.branching, self.max_depth = branching, NUM_TOKENS - 1
        self.max_nodes = sum(branching ** d for d in range(1, self.max_depth + 1))
        self.builds_trees = branching > 1
        self.marginal: dict = {}
        for outcome, p in law.items():
            for n in range(len(outcome) + 1):
                self.marginal[outcome[:n]] = self.marginal.get(outcome[:n], 0.0) + p

    def _best_next(self, prefix: tuple) -> list[int]:
        nxt = [(self.marginal.get(prefix + (t,), 0.0), -t) for t in range(12)]
        return [-t for _, t in sorted(nxt, reverse=True)[:self.branching]]

    def propose(self, seqs, inputs, width=None):
        rows = []
        for s in seqs:
            tokens, parents = [s.tokens[-1]], [ROOT_PARENT]
            frontier = [(0, tuple(s.tokens[len(PROMPT):]))]
            for _ in range(self.max_depth):
                frontier = [(len(tokens) - 1, prefix + (t,)) for node, prefix in frontier
                            for t in self._best_next(prefix) if not tokens.append(t) and not parents.append(node)]
            rows.append((tokens, parents))
        width = 1 + self.max_nodes
        tokens = torch.tensor([t + [0] * (width - len(t)) for t, _ in rows])
        parents = torch.tensor([p + [PAD_PARENT] * (width - len(p)) for _, p in rows])
        depths = torch.zeros_like(parents)
        for i in range(1, width):
            depths[:, i] = torch.where(parents[:, i] >= 0, depths.gather(1, parents[:, i:i + 1].clamp(min=0))[:, 0] + 1, 0)
        return DraftTree(tokens, parents, depths, (parents >= 0).sum(1), torch.zeros(tokens.shape), self.max_depth,
                         is_chain=self.branching == 1), None


@pytest.fixture(scope="module")
def laws(tiny_vocab_dir):
    return exact_laws(tiny_vocab_dir, PENALISED)


@pytest.fixture(scope="module")
def drafter(tiny_vocab_dir, tmp_path_factory):
    return str(write_dflash_drafter(tmp_path_factory.mktemp("tiny_pen_drafter"), tiny_vocab_dir, block_size=8, std=0.3))


def penalised_llm(model, drafter, spec, verify, law=None):
    if spec == "none":
        return exact_law_llm(model, 12)
    if spec.startswith("oracle"):
        oracle = LawOracle(law, 1 if spec == "oracle-chain" else 2)
        config = engine_config(model, max_running_requests=4096, max_prefill_tokens=4096 * len(PROMPT),
                               kv_cache_tokens=4096 * 20, page_size=4, detokenize=False)
        return LLM.from_engine(Engine(config, proposer=oracle))
    if spec == "dflash":
        return exact_law_llm(model, 24, spec="dflash", draft_model=drafter, block_size=8, spec_verify=verify)
    return exact_law_llm(model, 28, spec="ddtree", draft_model=drafter, budget=8, spec_verify=verify)


@pytest.mark.parametrize("spec, verify, setting", CASES)
def test_penalised_sampling_matches_exact_law(tiny_vocab_dir, drafter, laws, spec, verify, setting):
    llm = penalised_llm(tiny_vocab_dir, drafter, spec, verify, laws[setting])
    res = law_fit(llm, laws, setting, PENALISED)
    assert res.p_value > ALPHA, f"{spec=} {verify=} {setting=}: chi2={res.statistic:.1f} dof={res.dof} p={res.p_value:.2e}"
    assert llm.engine.allocator.num_used_pages == 0
    if spec.startswith("oracle"):  # the draft path's history really was exercised
        probe = llm.generate([PROMPT] * 64, SamplingParams(**_penalty_fields(PENALISED[setting]), max_tokens=NUM_TOKENS,
                                                           ignore_eos=True))
        assert LLM.aggregate_metrics(probe).accept_length > 1.3


def test_negative_control_penalising_without_the_draft_path_fails(tiny_vocab_dir, drafter, laws, monkeypatch):
    def committed_history_only(self, vocab):
        return torch.zeros(*self.tree.tokens.shape, vocab, dtype=torch.int32, device=self.device)
    monkeypatch.setattr(VerifyPositions, "path_counts", committed_history_only)
    res = law_fit(penalised_llm(tiny_vocab_dir, drafter, "oracle-chain", "target-only", laws["presence_frequency_bias"]),
                  laws, "presence_frequency_bias", PENALISED)
    assert res.p_value < ALPHA, f"penalties blind to the draft path passed: p={res.p_value:.3f}"


def _penalty_fields(params: SamplingParams) -> dict:
    return {k: getattr(params, k) for k in ("temperature", "top_k", "top_p", "presence_penalty", "frequency_penalty",
                                            "repetition_penalty", "logit_bias")}
