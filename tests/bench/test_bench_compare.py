"""`blockspec bench offline --compare-static` (bench/compare.py): static configurations vs adaptive."""

from __future__ import annotations

import json

import pytest

from blockspec.bench.compare import median_record, static_configurations, summarise
from bench_servers import run_cli
from dflash_fixtures import write_dflash_drafter


def test_static_configurations_name_each_width():
    assert static_configurations("dflash", 16, [4, 16]) == {
        "plain": {"spec": "none"}, "static-chain4": {"block_size": 4, "spec_policy": "static"},
        "static-chain16": {"block_size": 16, "spec_policy": "static"}}
    assert list(static_configurations("ddtree", 8, None)) == ["plain", "static-tree1", "static-tree3", "static-tree7"]
    with pytest.raises(ValueError, match="static widths"):
        static_configurations("dflash", 8, [16])


def test_summary_compares_adaptive_with_the_best_static_and_plain():
    records = [{"configuration": n, "concurrency": 1, "tok_s": t}
               for n, t in (("plain", 10.0), ("static-chain4", 20.0), ("adaptive", 19.0))]
    (s,) = summarise(records)
    assert s["best_static"] == "static-chain4"
    assert s["adaptive_vs_best_static"] == pytest.approx(0.95) and s["adaptive_vs_plain"] == pytest.approx(1.9)
    rounds = [{"tok_s": 3.0, "triton_compiles": 0}, {"tok_s": 1.0, "triton_compiles": 4}, {"tok_s": 2.0}]
    assert median_record(rounds) == {"tok_s": 2.0, "tok_s_rounds": [3.0, 1.0, 2.0], "compiles_rounds": [0, 4, 0]}


def test_compare_static_cli_writes_json_and_plot(qwen3_dir, tmp_path, capsys):
    drafter = write_dflash_drafter(tmp_path / "drafter", qwen3_dir, block_size=4)
    out = tmp_path / "compare.json"
    code = run_cli(["bench", "offline", "--model", qwen3_dir, "--draft-model", str(drafter), "--dataset", "random",
                    "--num-prompts", "2", "--max-tokens", "6", "--random-input-len", "8", "--compare-static",
                    "--concurrency", "1,2", "--static-widths", "4", "--waves", "3", "--output", str(out), "--no-progress"])
    assert code == 0
    doc = json.loads(out.read_text())
    assert {(r["configuration"], r["concurrency"]) for r in doc["records"]} == {
        (n, c) for n in ("plain", "static-chain4", "adaptive") for c in (1, 2)}
    assert all(r["output_tokens"] > 0 and r["tok_s"] > 0 for r in doc["records"])
    assert doc["num_prompts"] == {"1": 3, "2": 6}                # max(--num-prompts, waves × concurrency)
    assert [s["concurrency"] for s in doc["summary"]] == [1, 2]
    assert out.with_suffix(".png").stat().st_size > 0
    # The adaptive policy's timed widths per bucket it ran (ms), beside the statics' tok/s.
    # (6 tokens a request: not every width reaches a steady-state timing, engine/spec_policy.py)
    tables = doc["cost_tables"].values()
    assert set(doc["cost_tables"]) <= {"1", "2"} and all(v is None or v > 0 for t in tables for v in t.values())
    assert any(v is not None for t in tables for v in t.values())
    # The samples behind them: a measured entry is one of its key's samples (the lower quartile).
    samples = doc["cost_samples"]
    assert doc["cost_priors_ms"] == {}                              # no CUDA graphs on a CPU: no GPU priors
    assert all(v is None or v in samples[b][w] for b, t in doc["cost_tables"].items() for w, v in t.items())
    # Each round records what its tok/s may hide: compiles (none on a CPU) and its slowest steps.
    assert all(r["triton_compiles"] == 0 and r["compiles_rounds"] == [0] and len(r["slowest_steps_ms"]) == 3
               and r["slowest_steps_ms"][0] >= r["median_step_ms"] > 0 for r in doc["records"])
    assert "÷ best" in capsys.readouterr().out


def test_compare_keeps_each_finished_concurrency(qwen3_dir, tmp_path):
    """The JSON is written after each concurrency: a run stopped midway keeps what it measured."""
    from blockspec.bench.compare import run_compare
    from blockspec.bench.offline import OfflineBenchConfig, _warm_up
    drafter = write_dflash_drafter(tmp_path / "drafter", qwen3_dir, block_size=4)
    config = OfflineBenchConfig(model=qwen3_dir, draft_model=str(drafter), spec="dflash", datasets=["random"],
                                num_prompts=1, max_tokens=4, random_input_len=8, progress=False)
    seen = []
    doc = run_compare(config, [1, 2], [4], _warm_up, on_progress=lambda d: seen.append(d["concurrencies"]))
    assert seen == [[1], [1, 2]] and doc["concurrencies"] == [1, 2]


def test_warmup_rounds_run_every_configuration_untimed_first(qwen3_dir, tmp_path, monkeypatch):
    """`--warmup-rounds 1`: each configuration runs once per concurrency before the timed rounds,
    and only the timed rounds make the cell."""
    import blockspec.bench.compare as compare
    from blockspec.bench.offline import OfflineBenchConfig, _warm_up
    drafter = write_dflash_drafter(tmp_path / "drafter", qwen3_dir, block_size=4)
    config = OfflineBenchConfig(model=qwen3_dir, draft_model=str(drafter), spec="dflash", datasets=["random"],
                                num_prompts=1, max_tokens=4, random_input_len=8, progress=False)
    calls = []
    real = compare.run_concurrency
    monkeypatch.setattr(compare, "run_concurrency", lambda llm, *a: calls.append(llm) or real(llm, *a))
    doc = compare.run_compare(config, [1], [4], _warm_up, repeats=2, warmup_rounds=1)
    assert len(calls) == 3 * 3 and len(set(map(id, calls[:3]))) == 3      # 3 configurations: 1 untimed + 2 timed
    assert doc["warmup_rounds"] == 1 and all(len(r["tok_s_rounds"]) == 2 for r in doc["records"])
    with pytest.raises(ValueError, match="warmup_rounds"):
        compare.run_compare(config, [1], [4], _warm_up, warmup_rounds=-1)


def test_offline_requests_are_seeded_unless_told_not_to():
    from blockspec.bench.datasets import BenchPrompt
    from blockspec.bench.offline import OfflineBenchConfig, _params
    prompts = [BenchPrompt(text="a", chat=False, output_len=4)] * 2
    seeded = _params(OfflineBenchConfig(model="m", seed=5), prompts, 1.0, 0)
    unseeded = _params(OfflineBenchConfig(model="m", request_seeds=False), prompts, 1.0, 0)
    assert [p.seed for p in seeded] == [5, 6] and [p.seed for p in unseeded] == [None, None]


@pytest.mark.parametrize("argv, field", [(["--concurrency", "0"], "--concurrency"),
                                         (["--static-widths", "1"], "static widths"), (["--waves", "0"], "waves")])
def test_compare_static_bad_lists_are_refused(qwen3_dir, argv, field):
    """ValueError naming the option: the main CLI reports it as a usage error (exit 2)."""
    with pytest.raises(ValueError, match=field):
        run_cli(["bench", "offline", "--model", qwen3_dir, "--compare-static", "--spec", "ngram", *argv, "--no-progress"])


def test_compile_watch_counts_compiles_between_triton_hooks_and_restores_them():
    """What Triton's JIT calls around a compile (the cache-miss hook, then the post-compile hook)
    is counted and timed, hooks found installed still run (and only theirs may skip a compile),
    and leaving restores them."""
    knobs = pytest.importorskip("triton.knobs").runtime
    from blockspec.bench.compile_watch import CompileWatch
    seen = []
    before, after = (lambda **kw: seen.append("before") or None), (lambda **kw: seen.append("after"))
    knobs.jit_cache_hook, knobs.jit_post_compile_hook = before, after
    fn = type("Fn", (), {"name": "rms_norm_kernel"})()
    try:
        with CompileWatch() as watch:
            for _ in range(2):
                assert not knobs.jit_cache_hook(key=1, repr="r", fn=fn, compile={}, is_manual_warmup=False,
                                                already_compiled=False)
                knobs.jit_post_compile_hook(key=1, repr="r", fn=fn, compile={}, is_manual_warmup=False,
                                            already_compiled=False)
        assert watch.summary()["triton_compiles"] == 2 and watch.summary()["compiled"] == {"rms_norm_kernel": 2}
        assert watch.seconds >= 0 and seen == ["before", "after"] * 2
        assert knobs.jit_cache_hook is before and knobs.jit_post_compile_hook is after
    finally:
        knobs.jit_cache_hook = knobs.jit_post_compile_hook = None
