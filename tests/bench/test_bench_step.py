"""`blockspec bench step` on the tiny shape (CPU): every figure measured, floors from the same
run, JSON written; bad arguments exit 2."""

from __future__ import annotations

import json

import pytest

from blockspec.bench.step import copy_bandwidth, weight_bytes, random_target, shape_config
from blockspec.cli import main


def test_bench_step_tiny_cpu(tmp_path, capsys):
    out = tmp_path / "step.json"
    code = main(["bench", "step", "--shape", "tiny", "--device", "cpu", "--dtype", "float32", "--context", "40",
                 "--batches", "1,2", "--chain", "4", "--trees", "6", "--drafter-layers", "1", "--block-size", "4",
                 "--iters", "1", "--output", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    names = {(f["name"], f["batch"]) for f in result["figures"]}
    assert {("decode T=0", 1), ("decode T=0.6", 1), ("decode T=0", 2), ("verify chain 4", 1),
            ("verify tree 6", 1), ("dflash step (block 4)", 1), ("ddtree step (budget 6)", 1)} <= names
    widths = {f["name"]: f["width"] for f in result["figures"]}
    assert widths["verify chain 4"] == 4 and widths["verify tree 6"] == 7 and widths["decode T=0"] == 1
    assert all(f["ms"] > 0 and f["floor_ms"] > 0 for f in result["figures"])
    assert "drafter_ms" in result["derived"] and "verify_chain_over_decode" in result["derived"]
    assert "decode T=0" in capsys.readouterr().out


def test_weight_bytes_counts_tied_head_once():
    import torch
    model = random_target(shape_config("tiny"), torch.float32, torch.device("cpu"), None)
    params = {id(p): p for p in model.parameters()}
    assert weight_bytes(model) == sum(p.numel() * 4 for p in params.values())   # tied: the table is the head
    assert copy_bandwidth(torch.device("cpu"), nbytes=1 << 20, iters=1) > 0


@pytest.mark.parametrize("argv", [["--shape", "nope"], ["--batches", "0"], ["--context", "0"]])
def test_bench_step_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        code = main(["bench", "step", "--device", "cpu", *argv])
        raise SystemExit(code)
    assert e.value.code == 2


def test_bench_step_kimi_slice_tiny_cpu(tmp_path, capsys):
    """The Kimi-slice benchmark's code at test scale: decode at each batch beside the bytes it
    touched (experts hit counted from the router), MLA attention beside the latent rows read."""
    out = tmp_path / "kimi.json"
    code = main(["bench", "step", "--shape", "kimi-k2-slice-tiny", "--device", "cpu", "--dtype", "float32",
                 "--context", "20", "--batches", "1,3", "--attention-contexts", "40,70", "--iters", "1",
                 "--output", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    names = {(f["name"], f["batch"]) for f in result["figures"]}
    assert names == {(n, b) for b in (1, 3) for n in ("decode T=0", "mla attention ctx 40", "mla attention ctx 70")}
    assert all(f["ms"] > 0 and f["floor_ms"] > 0 for f in result["figures"])
    assert result["kv_bytes_per_token"] == 2 * (32 + 8) * 4
    one, three = result["step_bytes"]["decode batch 1"], result["step_bytes"]["decode batch 3"]
    assert one["experts_hit"] == 4 < three["experts_hit"] <= 12                 # top-4 of 16, rows apart
    assert three["routed_experts_hit"] == three["experts_hit"] * one["per_expert"]
    assert "mla attention ctx" in capsys.readouterr().out


def test_bench_step_batch_invariant_flag_reaches_the_config(monkeypatch):
    """`--batch-invariant` is passed to the bench (whose model build then switches the target;
    the GPU run is bench/batch_invariant_gpu.sh)."""
    import blockspec.bench.step as step
    seen = []
    monkeypatch.setattr(step, "run_step_bench", lambda cfg: seen.append(cfg))
    assert main(["bench", "step", "--shape", "tiny", "--device", "cpu", "--batch-invariant"]) == 0
    assert main(["bench", "step", "--shape", "tiny", "--device", "cpu"]) == 0
    assert [c.batch_invariant for c in seen] == [True, False]
