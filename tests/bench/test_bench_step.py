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
