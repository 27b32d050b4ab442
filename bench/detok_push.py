"""µs per incremental-detokenizer push (blockspec/tokenizer.py): 64 detokenizers of the bundled
target's tokenizer, one token pushed to each per step, 400 steps, best of 5 — the per-row work of
every decode step's commit.

    python bench/detok_push.py
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blockspec.llm import LLM  # noqa: E402

BUNDLED = Path(__file__).resolve().parents[1] / "blockspec" / "bundled"


def main() -> int:
    tok = LLM(str(BUNDLED / "target")).tokenizer
    ids = tok.encode("The quick brown fox jumps over the lazy dog. " * 60)
    best = float("inf")
    for _ in range(5):
        detoks = [tok.detokenizer(ids[:20]) for _ in range(64)]
        start = time.perf_counter()
        for i in ids[20:420]:
            for d in detoks:
                d.push([i])
        best = min(best, (time.perf_counter() - start) / 400 / 64 * 1e6)
    print(f"µs per push: {best:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
