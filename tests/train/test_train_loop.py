"""The shared training loop: a time budget becomes a step count by calibration, without
touching the model, and a resumed run keeps that count; periodic snapshots."""

import json
import time

import pytest
import torch

from blockspec.train.loop import (TrainSettings, calibrate_total_steps, read_log, resolve_total_steps, train)

SLEEP_S = 0.04


def toy_problem(sleep_s: float = SLEEP_S):
    model = torch.nn.Linear(4, 1)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    y = x.sum(-1, keepdim=True)

    def batch_loss(step: int) -> torch.Tensor:
        time.sleep(sleep_s)                       # a known cost per forward + backward
        return torch.nn.functional.mse_loss(model(x), y)

    return model, batch_loss


def settings(tmp_path, **kwargs) -> TrainSettings:
    base = dict(out_dir=tmp_path / "run", total_steps=None, lr=1e-2, warmup_fraction=0.0, weight_decay=0.0,
                device=torch.device("cpu"), autocast_dtype=None, progress=False)
    return TrainSettings(**{**base, **kwargs})


def test_calibration_counts_steps_and_changes_nothing(tmp_path):
    model, batch_loss = toy_problem()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    total = calibrate_total_steps(settings(tmp_path, time_budget_s=1.0), model, batch_loss)
    # 1 s at ≥ 0.04 s (+10%) a step: at most 22 steps; a loaded machine only lowers it.
    assert 5 <= total <= 1.0 / (SLEEP_S * 1.1) + 1
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_time_budget_run_and_resume_keep_the_count(tmp_path):
    model, batch_loss = toy_problem()
    result = train(settings(tmp_path, time_budget_s=0.6, snapshot_every=4), model, batch_loss, lambda d: d.mkdir(
        parents=True, exist_ok=True))
    steps = [r["step"] for r in read_log(tmp_path / "run" / "train_log.jsonl") if "loss" in r]
    assert steps == list(range(1, result.steps + 1)) and result.steps >= 3
    snaps = json.loads((tmp_path / "run" / "snapshots.json").read_text())
    assert [s["step"] for s in snaps] == [s for s in range(4, result.steps, 4)]
    # A resumed run takes its count from the checkpoint, whatever the budget now says.
    model2, batch_loss2 = toy_problem(sleep_s=0.0)
    again = train(settings(tmp_path, time_budget_s=100.0, resume=True), model2, batch_loss2, lambda d: None)
    assert again.steps == result.steps


def test_length_arguments_are_exclusive():
    assert resolve_total_steps(None, None, 10, 2, time_budget_s=5.0) is None
    assert resolve_total_steps(None, 2.0, 10, 2) == 10
    with pytest.raises(ValueError, match="one of --steps, --epochs and --time-budget"):
        resolve_total_steps(3, None, 10, 2, time_budget_s=5.0)
    with pytest.raises(ValueError, match="--time-budget must be positive"):
        resolve_total_steps(None, None, 10, 2, time_budget_s=0.0)
