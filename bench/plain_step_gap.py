"""What a speculative engine's plain step (width 1) costs on the host beyond a plain engine's, on
the CPU's graph path (static buffers, overlapped launches) with a tiny target, so that the host's
share is most of the step. Both engines run B rows at T; the speculative one is held at width 1.
Prints ms per step of each and the functions whose own time differs most (cProfile, 100 steps).

    python bench/plain_step_gap.py --batch 16 --temperature 1
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]   # the tiny-checkpoint writers of the tests

from blockspec.engine.config import EngineConfig  # noqa: E402
from blockspec.engine.engine import Engine  # noqa: E402
from blockspec.sampling import SamplingParams  # noqa: E402
from dflash_fixtures import write_dflash_drafter  # noqa: E402
from fixtures import write_qwen3  # noqa: E402


def engine(spec: str, target: Path, drafter: Path, batch: int, temperature: float) -> Engine:
    cfg = EngineConfig(model=str(target), device="cpu", spec=spec, draft_model=str(drafter) if spec != "none" else None,
                       cuda_graph=True, cuda_graph_max_bs=64, overlap_schedule=True, max_running_requests=batch)
    e = Engine(cfg)
    e.graphed = e.capture_graphs()                 # the CPU's static-buffer graphs, overlapped as on CUDA
    e.overlap, e.scheduler.steps_ahead = True, 1
    if e.policy is not None:
        e.policy.choose = lambda seqs: 1
    for i in range(batch):
        e.add_request(f"r{i}", [5, 6, 7, 8 + i % 50] * 4,
                      SamplingParams(temperature=temperature, max_tokens=480, ignore_eos=True))
    while e.scheduler.waiting or any(s.is_prefilling for s in e.scheduler.running):
        e.step()
    for _ in range(20):
        e.step()
    return e


def own_times(e: Engine, steps: int = 100) -> dict[str, float]:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(steps):
        e.step()
    profile.disable()
    stats = pstats.Stats(profile).stats
    return {f"{Path(f).name}:{line}({name})": tt / steps for (f, line, name), (_, _, tt, _, _) in stats.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        target, drafter = Path(tmp) / "target", Path(tmp) / "drafter"
        write_qwen3(target, num_layers=1)
        write_dflash_drafter(drafter, target, block_size=16)
        engines = {spec: engine(spec, target, drafter, args.batch, args.temperature) for spec in ("none", "dflash")}
        for spec, e in engines.items():
            best = float("inf")
            for _ in range(args.rounds):
                start = time.perf_counter()
                for _ in range(40):
                    e.step()
                best = min(best, (time.perf_counter() - start) / 40)
            print(f"{spec}: {best * 1e3:.3f} ms a step (batch {args.batch}, T {args.temperature:g}, best of {args.rounds})")
        plain, spec = own_times(engines["none"]), own_times(engines["dflash"])
        extra = sorted(((spec.get(k, 0.0) - plain.get(k, 0.0), k) for k in set(plain) | set(spec)), reverse=True)
        print("own time per step, speculative minus plain (profiled):")
        for delta, name in extra[:15]:
            print(f"  {delta * 1e6:+7.1f} µs  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
