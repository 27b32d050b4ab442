"""The adaptive policy's timed samples in a churning overlapped run (issue 15): the bundled pair at
8 requests in flight, T = 1, 32 held-out ShareGPT prompts × 24 tokens, on the CPU through the
graphs' static buffers with the overlapped schedule (as on CUDA); every sample the cost model
takes is recorded per (bucket, width), then the plain step's steady cost at 8 rows beside them.
A drained step (read before anything was launched after it) timed would show as a sample far
under the steady step (0.3–0.6 ms against 11–12 ms before the engine stopped timing them).

    python bench/drain_timing.py
"""
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from blockspec.bench.compare import run_concurrency  # noqa: E402
from blockspec.bench.datasets import load_dataset  # noqa: E402
from blockspec.bench.offline import prompt_token_ids  # noqa: E402
from blockspec.llm import LLM  # noqa: E402
from blockspec.sampling import SamplingParams  # noqa: E402
from steady_steps import BUNDLED, fill, time_steps  # noqa: E402


def main() -> int:
    llm = LLM(str(BUNDLED / "target"), spec="dflash", draft_model=str(BUNDLED / "drafter"), device="cpu",
              dtype="float32", max_running_requests=8)
    engine = llm.engine
    engine.graphed = engine.capture_graphs()
    engine.overlap, engine.scheduler.steps_ahead, engine.policy.overlapped = True, 1, True
    samples = collections.defaultdict(list)
    observe = engine.policy.cost.observe

    def recorded(batch, width, seconds):
        samples[f"bucket {engine.policy.cost.bucket_for(batch)} w{width}"].append(round(seconds * 1e3, 1))
        return observe(batch, width, seconds)
    engine.policy.cost.observe = recorded
    ids = [prompt_token_ids(p, llm.tokenizer, 300) for p in load_dataset("sharegpt", 32, 0)]
    run_concurrency(llm, ids, [SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True)] * len(ids), 8)
    engine.policy._choose = lambda seqs, ids: 1
    engine.policy._quiet = None
    fill(engine, 8, 1.0, 200)
    for _ in range(3):
        engine.step()
    print(json.dumps({"samples_ms": samples, "steady_plain_ms_8_rows": round(time_steps(engine, 15) * 1e3, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
