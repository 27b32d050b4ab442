"""Tensor and expert parallelism on the CPU (gloo): TP = 2 and 4 against TP = 1 on the tiny
fixtures, dense (Qwen3: tied head, q/k norms, K/V heads replicated at TP 4), MoE with MLA
(DeepSeek-V3: latent cache replicated, shared expert) and Qwen3-MoE, experts split or
sharded (expert parallel). Logits within 1e-5, and greedy, seeded sampled and speculative
(DFlash, DDTree) outputs identical.

Worker processes are the slow part (each imports torch), so each (model, size) target is
started once per module and shared by its engines (`Engine(config, target=...)`).
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from blockspec.attention.metadata import AttentionBatch
from blockspec.attention.reference import ReferenceBackend
from blockspec.engine.config import EngineConfig
from blockspec.engine.engine import Engine
from blockspec.llm import LLM
from blockspec.models.loader import load_target
from blockspec.parallel.sharding import ShardPlan
from blockspec.parallel.workers import start_tensor_parallel
from blockspec.sampling import SamplingParams
from dflash_fixtures import write_dflash_drafter

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
SAMPLED = [SamplingParams(temperature=0.9, top_p=0.95, max_tokens=8, ignore_eos=True, seed=s) for s in (1, 2)]
PROMPTS = [[5, 17, 99, 3, 250, 41], [300, 12, 7]]
TARGETS = [("qwen3_dir", 2, False), ("qwen3_dir", 4, False), ("deepseek_dir", 2, True),
           ("deepseek_dir", 4, False), ("qwen3_moe_dir", 2, True)]
# Speculative equality runs on these (the others check plain greedy and sampled outputs).
# (4 ranks on a shared 2-core machine are slow: each collective waits for all four processes.)
SPEC_TARGETS = {("qwen3_dir", 2): (1, 2, 3), ("qwen3_dir", 4): (2,), ("deepseek_dir", 2): (2,),
                ("qwen3_moe_dir", 2): (1,)}


@pytest.fixture(scope="module")
def targets(request):
    """(fixture name, size, expert_parallel) → a started target. All of TARGETS start at once
    (threads: their workers import torch side by side) and stop at the end."""
    dirs = {name: request.getfixturevalue(name) for name, _, _ in TARGETS}
    with ThreadPoolExecutor(len(TARGETS)) as pool:
        futures = {(name, size, ep): pool.submit(start_tensor_parallel, dirs[name], "float32", torch.device("cpu"),
                                                  "auto", ReferenceBackend(), size, ep)
                   for name, size, ep in TARGETS}
    started = {key: f.result() for key, f in futures.items()}
    yield started.__getitem__
    with ThreadPoolExecutor(len(TARGETS)) as pool:
        list(pool.map(lambda t: t.close(), started.values()))


@pytest.fixture(scope="module")
def drafters(request, tmp_path_factory):
    made = {}

    def get(name):
        if name not in made:
            made[name] = str(write_dflash_drafter(tmp_path_factory.mktemp("drafter"), request.getfixturevalue(name),
                                                  block_size=4, std=0.2))
        return made[name]
    return get


def prefill_then_decode(model, cache) -> torch.Tensor:
    """Logits `[1, 7, V]` of a 6-token prefill then one decoded token (cache read back)."""
    ids = torch.tensor([PROMPTS[0]])
    pages = torch.tensor([[1, 2]])
    first = AttentionBatch(slots=torch.arange(6)[None] + 16, page_table=pages, prefix_lens=torch.tensor([0]),
                           new_lens=torch.tensor([6]), mask_kind="causal")
    with torch.inference_mode():
        a = model.logits(model(ids, torch.arange(6)[None], cache, first)[0])
        step = AttentionBatch(slots=torch.tensor([[22]]), page_table=pages, prefix_lens=torch.tensor([6]),
                              new_lens=torch.tensor([1]), mask_kind="causal")
        b = model.logits(model(torch.tensor([[77]]), torch.tensor([[6]]), cache, step)[0])
    return torch.cat([a, b], dim=1)


@pytest.mark.parametrize("name,size,ep", TARGETS)
def test_logits_equal_tp1(name, size, ep, targets, request):
    reference = load_target(request.getfixturevalue(name), "float32", "cpu")
    want = prefill_then_decode(reference, reference.cache_spec.allocate(4, 16, torch.float32, "cpu"))
    target = targets((name, size, ep))
    cache = target.allocate_cache(4, 16, torch.float32, torch.device("cpu"))
    got = prefill_then_decode(target, cache)
    target.free_cache(cache)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def outputs(llm: LLM) -> list[list[int]]:
    greedy = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    sampled = [o.token_ids for o in llm.generate(PROMPTS, SAMPLED)]
    return greedy + sampled


def engine_outputs(model_dir, target=None, **settings) -> list[list[int]]:
    size = target.size if target is not None else 1
    engine = Engine(EngineConfig(model=model_dir, tensor_parallel_size=size, **settings), target=target)
    try:
        return outputs(LLM.from_engine(engine))
    finally:
        engine.close()


SPECS = [dict(), dict(spec="dflash"), dict(spec="ddtree", tree_budget=6),
         dict(spec="dflash", spec_verify="rejection")]


@pytest.mark.parametrize("name,size,ep", TARGETS)
def test_greedy_sampled_and_speculative_outputs_equal_tp1(name, size, ep, targets, drafters, request):
    model_dir = request.getfixturevalue(name)
    target = targets((name, size, ep))
    for spec in [SPECS[0]] + [SPECS[i] for i in SPEC_TARGETS.get((name, size), ())]:
        settings = dict(spec, draft_model=drafters(name)) if spec else {}
        want = engine_outputs(model_dir, **settings)
        got = engine_outputs(model_dir, target, **settings)
        assert got == want, spec


def test_llm_starts_and_stops_its_workers(qwen3_dir):
    before = set(multiprocessing.active_children())
    with LLM(model=qwen3_dir, tensor_parallel_size=2) as llm:
        workers = [p for p in multiprocessing.active_children() if p not in before]
        assert [p.name for p in workers] == ["blockspec-tp-rank1"]
        assert llm.generate(PROMPTS[0], GREEDY)[0].token_ids == LLM(model=qwen3_dir).generate(
            PROMPTS[0], GREEDY)[0].token_ids
    assert all(not p.is_alive() for p in workers) and workers[0].exitcode == 0
    with pytest.raises(RuntimeError, match="stopped"):
        llm.generate(PROMPTS[0], GREEDY)


def test_worker_failure_is_raised_with_its_traceback(tmp_path, qwen3_dir):
    """A checkpoint whose heads do not split over 3 ranks: the error names the field, and no
    worker is left running."""
    before = set(multiprocessing.active_children())
    with pytest.raises((ValueError, RuntimeError), match="num_attention_heads"):
        LLM(model=qwen3_dir, tensor_parallel_size=3)
    assert all(not p.is_alive() for p in multiprocessing.active_children() if p not in before)


def test_shard_plan_splits():
    assert ShardPlan(1, 4).kv_part(2) == (0, 1) and ShardPlan(2, 4).kv_part(2) == (1, 2)
    assert ShardPlan(1, 2).kv_part(4) == (2, 4)
    assert ShardPlan(3, 4).vocab_part(510) == (384, 510, 128)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        ShardPlan(0, 4).kv_part(3)
    with pytest.raises(ValueError, match="intermediate_size"):
        ShardPlan(0, 3).part(128, "intermediate_size")


def test_engine_settings_are_checked():
    with pytest.raises(ValueError, match="expert_parallel"):
        EngineConfig(model="m", expert_parallel=True).validate()
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        EngineConfig(model="m", tensor_parallel_size=0).validate()
