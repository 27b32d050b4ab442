"""The training loop `train-target` and `train-drafter` share.

AdamW, warmup + cosine schedule, gradient clipping, bf16 autocast on CUDA, a progress bar,
`train_log.jsonl` and a loss-curve PNG, evaluation, snapshots and exact resumption.

Resumption is exact because nothing random is carried from step to step: the batch of step s
and any randomness inside it (the drafter's anchors) are functions of (seed, s) alone. A
checkpoint therefore needs only the model, optimizer, scheduler and step (the global RNG
states are saved as well, for anything else that draws from them).
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

LOG_FILE = "train_log.jsonl"
CURVE_FILE = "loss_curve.png"
CHECKPOINT_DIR = "checkpoint"
CHECKPOINT_FILE = "state.pt"
SNAPSHOT_DIR = "snapshots"
SNAPSHOT_INDEX = "snapshots.json"


# ---- settings ------------------------------------------------------------------------------------

def resolve_autocast_dtype(name: str, device: torch.device) -> torch.dtype | None:
    """Compute dtype under autocast: 'auto' = bfloat16 on CUDA, float32 (no autocast) on CPU.

    Weights and optimizer state stay float32 either way.
    """
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    if name == "float32":
        return None
    if name == "bfloat16":
        return torch.bfloat16
    raise ValueError(f"--dtype must be auto, float32 or bfloat16, got {name!r}")


def autocast(device: torch.device, dtype: torch.dtype | None):
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def parse_int_list(text: str | None, what: str) -> tuple[int, ...]:
    """'100,500,1000' → (100, 500, 1000); empty/None → ()."""
    if not text:
        return ()
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{what} must be comma-separated integers, got {text!r}") from None
    return values


def resolve_total_steps(steps: int | None, epochs: float | None, num_examples: int, batch_size: int,
                        time_budget_s: float | None = None) -> int | None:
    """Optimizer steps from --steps, or from --epochs over `num_examples` sequences; None when
    --time-budget decides them (the loop calibrates, see `calibrate_total_steps`)."""
    if sum(v is not None for v in (steps, epochs, time_budget_s)) > 1:
        raise ValueError("give one of --steps, --epochs and --time-budget")
    if batch_size < 1:
        raise ValueError(f"--batch-size must be positive, got {batch_size}")
    if time_budget_s is not None:
        if time_budget_s <= 0:
            raise ValueError(f"--time-budget must be positive, got {time_budget_s}")
        return None
    if steps is not None:
        if steps < 1:
            raise ValueError(f"--steps must be positive, got {steps}")
        return steps
    if epochs is None or epochs <= 0:
        raise ValueError(f"--epochs must be positive, got {epochs}")
    return max(1, math.ceil(epochs * num_examples / batch_size))


@dataclass
class TrainSettings:
    out_dir: Path
    total_steps: int | None           # None: chosen from time_budget_s by calibration
    lr: float
    warmup_fraction: float
    weight_decay: float
    device: torch.device
    autocast_dtype: torch.dtype | None
    grad_clip: float = 1.0
    betas: tuple[float, float] = (0.9, 0.95)
    save_every: int | None = None
    eval_every: int | None = None
    snapshot_steps: tuple[int, ...] = ()
    snapshot_every: int | None = None
    resume: bool = False
    progress: bool = True
    description: str = "training"
    extra: dict = field(default_factory=dict)  # recorded in the checkpoint, for the record
    time_budget_s: float | None = None


# ---- data order ----------------------------------------------------------------------------------

def step_seed(seed: int, step: int, stream: int = 0) -> int:
    """A seed for the randomness of one step (stream separates independent uses)."""
    return (seed * 1_000_003 + step * 7919 + stream * 104_729) % (2 ** 63)


def batch_indices(step: int, batch_size: int, num_examples: int, seed: int) -> list[int]:
    """Examples of batch `step`: consecutive slices of one random permutation per epoch."""
    if num_examples < 1:
        raise ValueError("no training sequences")
    out = []
    for flat in range(step * batch_size, (step + 1) * batch_size):
        epoch, offset = divmod(flat, num_examples)
        out.append(int(_epoch_permutation(epoch, num_examples, seed)[offset]))
    return out


_PERMUTATIONS: dict[tuple[int, int, int], torch.Tensor] = {}


def _epoch_permutation(epoch: int, num_examples: int, seed: int) -> torch.Tensor:
    key = (epoch, num_examples, seed)
    if key not in _PERMUTATIONS:
        if len(_PERMUTATIONS) > 4:
            _PERMUTATIONS.clear()
        gen = torch.Generator().manual_seed(step_seed(seed, epoch, stream=1))
        _PERMUTATIONS[key] = torch.randperm(num_examples, generator=gen)
    return _PERMUTATIONS[key]


# ---- optimisation --------------------------------------------------------------------------------

def warmup_cosine(total_steps: int, warmup_fraction: float) -> Callable[[int], float]:
    """LR multiplier: linear warmup over `warmup_fraction` of the steps, then cosine to 0."""
    warmup = max(1, round(total_steps * warmup_fraction)) if warmup_fraction > 0 else 0

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def make_optimizer(model: nn.Module, lr: float, weight_decay: float, betas) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (not on norms or biases)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


# ---- logging -------------------------------------------------------------------------------------

def read_log(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def truncate_log(path: Path, last_step: int) -> None:
    """Drop records after `last_step` (written after the checkpoint a run resumes from)."""
    kept = [r for r in read_log(path) if r["step"] <= last_step]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))


def append_log(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def plot_loss_curve(log_path: Path, png_path: Path, title: str) -> None:
    """Training loss (and held-out metrics ending in 'loss') against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_log(log_path)
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), label="train loss", linewidth=0.8)
    for key in sorted({k for r in records for k in r if k.startswith("eval_") and k.endswith("loss")}):
        points = [(r["step"], r[key]) for r in records if key in r]
        ax.plot(*zip(*points), "o-", label=key.replace("_", " "))
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)


# ---- checkpoints ---------------------------------------------------------------------------------

def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_path(out_dir: Path) -> Path:
    return Path(out_dir) / CHECKPOINT_DIR / CHECKPOINT_FILE


def save_checkpoint(out_dir: Path, model: nn.Module, optimizer, scheduler, step: int, total_steps: int,
                    extra: dict) -> Path:
    """Everything needed to continue exactly from `step` (written atomically)."""
    path = checkpoint_path(out_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"step": step, "total_steps": total_steps, "model": model.state_dict(),
             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state(),
             "extra": extra}
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def read_checkpoint(out_dir: Path, device) -> dict:
    return torch.load(checkpoint_path(out_dir), map_location=device, weights_only=False)


def restore_checkpoint(state: dict, model: nn.Module, optimizer, scheduler) -> int:
    """Restore a checkpoint read by `read_checkpoint` into the given objects; returns its step."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    restore_rng_state(state["rng"])
    return int(state["step"])


def check_out_dir(out_dir: Path, resume: bool) -> None:
    """Refuse to overwrite a run by accident, and to resume one that does not exist."""
    has_checkpoint = checkpoint_path(out_dir).is_file()
    if resume and not has_checkpoint:
        raise ValueError(f"--resume: no checkpoint in {out_dir}")
    if not resume and has_checkpoint:
        raise ValueError(f"{out_dir} already holds a training run; pass --resume to continue it "
                         "or choose another --out")


def record_snapshot(out_dir: Path, step: int, path: Path) -> None:
    index = Path(out_dir) / SNAPSHOT_INDEX
    entries = json.loads(index.read_text()) if index.is_file() else []
    entries = [e for e in entries if e["step"] != step] + [{"step": step, "path": str(path)}]
    index.write_text(json.dumps(sorted(entries, key=lambda e: e["step"]), indent=2))


# ---- the loop ------------------------------------------------------------------------------------

@dataclass
class TrainResult:
    steps: int
    final_loss: float | None
    out_dir: Path


def calibrate_total_steps(settings: TrainSettings, model: nn.Module, batch_loss: Callable[[int], torch.Tensor],
                          passes: int = 6) -> int:
    """Steps that fit `settings.time_budget_s`, from the time of a few forward + backward passes
    over the first batches. Nothing is applied: gradients are dropped, and batches are pure
    functions of their step, so the run is the one --steps N would give (N is logged)."""
    cuda = settings.device.type == "cuda"
    times = []
    model.train()
    for step in range(passes):
        if cuda:
            torch.cuda.synchronize(settings.device)
        start = time.perf_counter()
        with autocast(settings.device, settings.autocast_dtype):
            loss = batch_loss(step)
        loss.backward()
        if cuda:
            torch.cuda.synchronize(settings.device)
        times.append(time.perf_counter() - start)
    model.zero_grad(set_to_none=True)
    per_step = sorted(times[1:])[len(times[1:]) // 2] * 1.1   # median past the first; +10% for the update
    return max(1, int(settings.time_budget_s / per_step))


def train(settings: TrainSettings, model: nn.Module, batch_loss: Callable[[int], torch.Tensor],
          export: Callable[[Path], None], evaluate: Callable[[], dict] | None = None) -> TrainResult:
    """Run steps until `settings.total_steps`, resuming from the checkpoint if asked.

    batch_loss(step) returns the loss of batch `step` (a pure function of the step, so that
    resumption is exact); export(dir) writes the loadable model; evaluate() returns held-out
    metrics {name: float}. With no total_steps, the step count is calibrated from
    time_budget_s (a resumed run keeps its checkpoint's count).
    """
    from tqdm.auto import tqdm

    out = Path(settings.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / LOG_FILE
    checkpoint = read_checkpoint(out, settings.device) if settings.resume else None
    total_steps = settings.total_steps
    if total_steps is None:
        if settings.time_budget_s is None:
            raise ValueError("training needs a step count or a time budget")
        if checkpoint is not None:
            total_steps = int(checkpoint["total_steps"])
        else:
            total_steps = calibrate_total_steps(settings, model, batch_loss)
            print(f"{settings.description}: --time-budget {settings.time_budget_s:g} s → {total_steps} steps",
                  flush=True)
    optimizer = make_optimizer(model, settings.lr, settings.weight_decay, settings.betas)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(total_steps, settings.warmup_fraction))
    start = 0
    if checkpoint is not None:
        start = restore_checkpoint(checkpoint, model, optimizer, scheduler)
        del checkpoint
        truncate_log(log_path, start)
    elif log_path.exists():
        log_path.unlink()
    params = [p for p in model.parameters() if p.requires_grad]
    loss_value = None

    def run_eval(step: int) -> None:
        if evaluate is None:
            return
        model.eval()
        with torch.no_grad(), autocast(settings.device, settings.autocast_dtype):
            metrics = evaluate()
        model.train()
        append_log(log_path, {"step": step, **{f"eval_{k}": float(v) for k, v in metrics.items()}})
        bar.write(f"step {step}: " + ", ".join(f"eval {k} {v:.4f}" for k, v in metrics.items()))

    model.train()
    started = time.perf_counter()
    bar = tqdm(total=total_steps, initial=start, desc=settings.description,
               disable=not settings.progress, dynamic_ncols=True)
    for step in range(start, total_steps):
        lr = scheduler.get_last_lr()[0]
        with autocast(settings.device, settings.autocast_dtype):
            loss = batch_loss(step)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        done = step + 1
        loss_value = float(loss.detach())
        # elapsed_s: wall time since this process started training (for throughput)
        append_log(log_path, {"step": done, "loss": loss_value, "lr": lr,
                              "elapsed_s": round(time.perf_counter() - started, 3)})
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.4f}", lr=f"{lr:.2e}")
        if settings.eval_every and done % settings.eval_every == 0:
            run_eval(done)
        if done in settings.snapshot_steps or (settings.snapshot_every and done % settings.snapshot_every == 0
                                               and done < total_steps):
            snap = out / SNAPSHOT_DIR / f"step_{done}"
            export(snap)
            record_snapshot(out, done, snap)
        if settings.save_every and done % settings.save_every == 0 and done < total_steps:
            save_checkpoint(out, model, optimizer, scheduler, done, total_steps, settings.extra)
            plot_loss_curve(log_path, out / CURVE_FILE, settings.description)
    bar.close()
    if settings.eval_every and total_steps % settings.eval_every and start < total_steps:
        run_eval(total_steps)
    save_checkpoint(out, model, optimizer, scheduler, total_steps, total_steps, settings.extra)
    export(out)
    plot_loss_curve(log_path, out / CURVE_FILE, settings.description)
    return TrainResult(total_steps, loss_value, out)
