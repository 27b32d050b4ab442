"""DDTree through the engine: top-k 1 equals linear DFlash, greedy trees equal plain greedy,
sampled trees are lossless (chi-square with a negative control), and after compaction the
K/V cache equals one that only ever saw the accepted path."""

import pytest
import torch

import blockspec.speculative.step as step_module
from blockspec.batch import prefill_inputs
from blockspec.engine.config import EngineConfig
from blockspec.engine.engine import Engine
from blockspec.llm import LLM
from blockspec.speculative.proposers import Proposer
from blockspec.speculative.tree import PAD_PARENT, ROOT_PARENT, DraftTree
from blockspec.sampling import SamplingParams
from dflash_fixtures import write_dflash_drafter
from test_lossless import ALPHA, exact_law_llm, exact_laws, law_fit, over_accepting_verify_tree
from test_spec_greedy import prompts_for

GREEDY = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"    # the kernels' tests: interpreted on a CPU


@pytest.fixture(scope="module")
def drafter(qwen3_dir, tmp_path_factory):
    return str(write_dflash_drafter(tmp_path_factory.mktemp("tree_drafter"), qwen3_dir, block_size=8))


@pytest.mark.parametrize("budget", [3, 7])
def test_topk1_tree_equals_linear_dflash(qwen3_dir, drafter, budget):
    prompts = prompts_for(512, [6, 13, 21], seed=7)
    sampled = SamplingParams(temperature=0.8, max_tokens=32, seed=5, ignore_eos=True)
    # Target-only verification (a top-1 tree's one child per node is the chain's argmax draft),
    # static widths (two engines compared step for step; adaptive widths follow each one's timings).
    chain = LLM(model=qwen3_dir, spec="dflash", draft_model=drafter, block_size=budget + 1, spec_verify="target-only",
                spec_policy="static")
    tree = LLM(model=qwen3_dir, spec="ddtree", draft_model=drafter, block_size=budget + 1, budget=budget, topk=1,
               spec_verify="target-only", spec_policy="static")
    for params in (GREEDY, sampled):
        a, b = chain.generate(prompts, params), tree.generate(prompts, params)
        for x, y in zip(a, b):
            assert x.token_ids == y.token_ids
            same = {"algorithm": None, "configurations": None}   # (chain4 vs tree3: the same width, named per method)
            assert x.metrics.to_dict() | same == y.metrics.to_dict() | same
            assert x.metrics.accepted_per_position == y.metrics.accepted_per_position


@pytest.mark.parametrize("budget, topk", [(4, None), (16, None), (12, 3)])
def test_greedy_tree_equals_plain(qwen3_dir, drafter, budget, topk):
    prompts = prompts_for(512, [5, 18, 9, 27], seed=8)
    expected = [o.token_ids for o in LLM(model=qwen3_dir).generate(prompts, GREEDY)]
    tree = LLM(model=qwen3_dir, spec="ddtree", draft_model=drafter, budget=budget, topk=topk)
    outs = tree.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == expected
    assert tree.engine.allocator.num_used_pages == 0


def test_greedy_tree_walked_by_the_kernel_equals_plain(qwen3_dir, drafter):
    """The engine with the greedy walk kernel (CUDA's, here under Triton's interpreter)."""
    from blockspec.speculative.walk_kernel import verify_tree_greedy_triton
    prompts = prompts_for(512, [5, 18, 9, 27], seed=8)
    expected = [o.token_ids for o in LLM(model=qwen3_dir, device=DEVICE).generate(prompts, GREEDY)]
    tree = LLM(model=qwen3_dir, spec="ddtree", draft_model=drafter, budget=16, spec_policy="static", device=DEVICE)
    tree.engine.spec_step.use_verify_kernels(tree.engine.device)
    assert tree.engine.spec_step.greedy_walk is verify_tree_greedy_triton
    outs = tree.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == expected
    assert sum(o.metrics.accepted_tokens for o in outs) > 0


@pytest.mark.parametrize("method", [{"spec": "ddtree", "budget": 8}, {"spec": "dflash", "sampled_trees": True}])
def test_sampled_tree_verified_by_the_kernels_equals_the_reference(qwen3_dir, drafter, method):
    """Sampled DDTree rows beside greedy ones (and DFlash's sampled trees beside greedy chains),
    drafted (tree search, children draws) and verified by CUDA's kernels (here under Triton's
    interpreter) and by the reference ops, with the same engine seed: the same tokens, so the
    kernels inherit the reference's exact law (tests/test_sampled_tree.py)."""
    from blockspec.speculative import walk_kernel
    from blockspec.speculative.children_kernel import sample_children_triton
    from blockspec.speculative.sampled_tree import sample_children
    from blockspec.speculative.verify import verify_sampled_tree, verify_tree_greedy
    prompts = prompts_for(512, [5, 18, 9, 27, 12, 7], seed=9)
    params = [SamplingParams(temperature=t, top_p=p, max_tokens=24, ignore_eos=True)
              for t, p in ((0.0, 1.0), (1.0, 1.0), (0.7, 0.9), (1.0, 1.0), (0.0, 1.0), (1.3, 0.95))]
    outs = []
    for kernels in (False, True):
        llm = LLM(model=qwen3_dir, draft_model=drafter, spec_verify="rejection", spec_policy="static", seed=123,
                  cuda_graph=False, device=DEVICE, **method)
        step, proposer = llm.engine.spec_step, llm.engine.proposer
        # (A CUDA engine adopts the kernels itself: the reference arm puts the reference ops back.)
        step.greedy_walk, step.sampled_tree_verify = verify_tree_greedy, verify_sampled_tree
        proposer.sample_children = sample_children
        if kernels:
            llm.engine.spec_step.use_verify_kernels(llm.engine.device)
            llm.engine.proposer._use_tree_kernel(llm.engine.device)
            assert llm.engine.spec_step.sampled_tree_verify is walk_kernel.verify_sampled_tree_triton
            assert llm.engine.proposer.sample_children is sample_children_triton
        outs.append(llm.generate(prompts, params))
    assert [o.token_ids for o in outs[1]] == [o.token_ids for o in outs[0]]
    assert sum(o.metrics.accepted_tokens for o in outs[1][1:4]) > 0      # sampled rows accepted drafts


@pytest.fixture(scope="module")
def tiny_law(tiny_vocab_dir):
    return exact_laws(tiny_vocab_dir)


@pytest.fixture(scope="module")
def tiny_drafter(tiny_vocab_dir, tmp_path_factory):
    return str(write_dflash_drafter(tmp_path_factory.mktemp("tiny_tree"), tiny_vocab_dir, block_size=8, std=0.3))


def tree_llm(model, drafter, budget):
    """Target-only trees (the walk the negative control breaks; sampled trees: test_sampled_tree_engine.py)."""
    return exact_law_llm(model, 28, spec="ddtree", draft_model=drafter, budget=budget, spec_verify="target-only")


@pytest.mark.parametrize("budget, setting", [(4, "t13_topp_minp"), (8, "t1"), (16, "t07_topk5")])
def test_sampled_tree_is_lossless(tiny_vocab_dir, tiny_drafter, tiny_law, budget, setting):
    llm = tree_llm(tiny_vocab_dir, tiny_drafter, budget)
    res = law_fit(llm, tiny_law, setting)
    assert res.p_value > ALPHA, f"{budget=} {setting=} chi2={res.statistic:.1f} p={res.p_value:.2e}"
    assert llm.engine.allocator.num_used_pages == 0


def test_sampled_tree_negative_control_fails(tiny_vocab_dir, tiny_drafter, tiny_law, monkeypatch):
    monkeypatch.setattr(step_module, "verify_tree", over_accepting_verify_tree)
    assert law_fit(tree_llm(tiny_vocab_dir, tiny_drafter, 8), tiny_law, "t1").p_value < ALPHA


class DecoyTreeOracle(Proposer):
    """A tree whose accepted path is never contiguous: at each depth a wrong sibling (decoy)
    comes before the right token, so the accepted nodes are 2, 4, 6, … and must be compacted."""


    def __init__(self, continuation: list[int], depth: int, vocab: int):
        self.cont, self.max_depth, self.vocab = continuation, depth, vocab
        self.max_nodes = 2 * depth


    def propose(self, seqs, inputs, width=None):
        (s,) = seqs
        right = self.cont[s.num_output:s.num_output + self.max_depth]
        tokens, parents, depths = [s.last_token], [ROOT_PARENT], [0]
        parent = 0
        for d, t in enumerate(right, start=1):
            tokens += [(t + 1) % self.vocab, t]
            parents += [parent, parent]
            depths += [d, d]
            parent = len(tokens) - 1
        pad = 2 * self.max_depth + 1 - len(tokens)
        tokens += [0] * pad
        parents += [PAD_PARENT] * pad
        depths += [0] * pad
        return DraftTree(torch.tensor([tokens]), torch.tensor([parents]), torch.tensor([depths]),
                         torch.tensor([2 * len(right)]), torch.zeros(1, len(tokens)), self.max_depth), None


def test_compacted_cache_equals_cache_of_accepted_path(qwen3_dir):
    """After tree verify steps with gaps in the accepted path, the target K/V of every committed
    position equals what a plain prefill of the committed tokens writes."""
    prompt = prompts_for(512, [10], seed=9)[0]
    cont = LLM(model=qwen3_dir).generate(prompt, GREEDY)[0].token_ids
    engine = Engine(EngineConfig(model=qwen3_dir, spec="ddtree", spec_policy="static"), proposer=DecoyTreeOracle(cont, 4, 512))
    engine.add_request("r", prompt, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    for _ in range(5):
        engine.step()
    seq = engine.scheduler.running[0]
    assert seq.output_ids == cont[:seq.num_output]
    assert seq.metrics.accepted_tokens == 4 * seq.metrics.verify_steps  # every right node accepted
    n = seq.num_cached
    slots = torch.tensor([seq.page_table.slot(p) for p in range(n)])

    plain = LLM(model=qwen3_dir).engine
    plain.add_request("p", seq.tokens[:n], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    pseq = plain.scheduler.waiting[0]
    sched = plain.scheduler.schedule()
    plain.runner.prefill(prefill_inputs(sched.seqs, sched.chunk_lens, torch.zeros(1, 1, dtype=torch.float64),
                                        plain.cache.page_size, plain.device))
    pslots = torch.tensor([pseq.page_table.slot(p) for p in range(n)])
    torch.testing.assert_close(engine.cache.k[:, slots], plain.cache.k[:, pslots], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(engine.cache.v[:, slots], plain.cache.v[:, pslots], rtol=1e-5, atol=1e-5)


class MixedBatchOracle(Proposer):
    """One request gets a full-depth chain (its deepest node at the last verify slot), the other
    a decoy tree whose accepted path has gaps: the batch's max depth then equals width − 1 although
    one row branches, and that row must still be compacted."""

    def __init__(self, continuations: dict[str, list[int]], depth: int, vocab: int):
        self.conts, self.depth, self.vocab = continuations, depth, vocab
        self.max_depth = self.max_nodes = 2 * depth

    def row(self, seq):
        right = self.conts[seq.request_id][seq.num_output:]
        tokens, parents, depths = [seq.last_token], [ROOT_PARENT], [0]
        if seq.request_id == "chain":
            for d, t in enumerate(right[:2 * self.depth], start=1):
                tokens.append(t), parents.append(d - 1), depths.append(d)
        else:
            parent = 0
            for d, t in enumerate(right[:self.depth], start=1):
                tokens += [(t + 1) % self.vocab, t]
                parents += [parent, parent]
                depths += [d, d]
                parent = len(tokens) - 1
        pad = 2 * self.depth + 1 - len(tokens)
        return tokens + [0] * pad, parents + [PAD_PARENT] * pad, depths + [0] * pad, len(tokens) - 1

    def propose(self, seqs, inputs, width=None):
        rows = [self.row(s) for s in seqs]
        tensors = [torch.tensor([r[i] for r in rows]) for i in range(4)]
        depth = int(tensors[2].max())
        return DraftTree(*tensors, torch.zeros(len(seqs), 2 * self.depth + 1), depth), None


def test_branching_row_is_compacted_when_another_row_is_a_full_chain(qwen3_dir):
    prompts = dict(zip(("chain", "tree"), prompts_for(512, [10, 7], seed=11)))
    conts = {rid: LLM(model=qwen3_dir).generate(p, GREEDY)[0].token_ids for rid, p in prompts.items()}
    engine = Engine(EngineConfig(model=qwen3_dir, spec="ddtree", spec_policy="static"), proposer=MixedBatchOracle(conts, 3, 512))
    for rid, p in prompts.items():
        engine.add_request(rid, p, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    got = {rid: [] for rid in prompts}
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            got[out.request_id] += out.new_token_ids
        steps += 1
    assert got == {rid: c[:40] for rid, c in conts.items()}
    assert steps < 30                                       # the oracle's drafts were accepted

