"""Sampled trees against chains from `bench offline` JSONs (bench/gpu_session_u.sh PART=2): per
temperature and batch size, each method's tok/s, its ratio to plain and to DFlash's chain, and its
accept length; then whether `--sampled-trees` pays — tok/s at least the chain's in every T > 0
cell on average and none below noise, T = 0 within noise (its greedy rows run the chain's own step).

    python bench/tree_vs_chain.py RESULTS_DIR [--tolerance 0.05]

A method is named from its JSON: "dflash", "dflash --sampled-trees" or "ddtree".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def method_of(doc: dict) -> str:
    if doc.get("spec") == "ddtree":
        return "ddtree"
    return "dflash --sampled-trees" if doc.get("engine_options", {}).get("sampled_trees") else "dflash"


def cells(directory: Path) -> dict[tuple[float, int], dict[str, dict]]:
    """(temperature, batch) → method → {tok_s, vs_plain, accept}."""
    out: dict = {}
    for path in sorted(directory.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (json.JSONDecodeError, OSError):
            continue
        if "records" not in doc or "engine_options" not in doc:
            continue
        for rec in doc["records"]:
            out.setdefault((rec["temperature"], rec["batch_size"]), {})[method_of(doc)] = {
                "tok_s": rec["spec"]["tok_s"], "vs_plain": rec["speedup"], "accept": rec["accept_length"]}
    return out


def verdict(table: dict, tolerance: float) -> tuple[bool, list[str]]:
    """Whether sampled trees pay: over the T > 0 cells the geometric mean of their tok/s ÷ the
    chain's at least 1, and no cell (T = 0 included, where both run the chain's step) below
    1 − tolerance (one run a cell: rounds of one cell have differed by 5–25 %)."""
    notes, ok, sampled = [], True, []
    for (t, b), row in sorted(table.items()):
        chain, trees = row.get("dflash"), row.get("dflash --sampled-trees")
        if not chain or not trees:
            notes.append(f"T={t} batch {b}: a method is missing")
            ok = False
            continue
        ratio = trees["tok_s"] / chain["tok_s"]
        ok &= ratio >= 1.0 - tolerance
        if t > 0:
            sampled.append(ratio)
        notes.append(f"T={t} batch {b}: sampled trees ÷ chain {ratio:.3f}")
    if sampled:
        mean = 1.0
        for r in sampled:
            mean *= r
        mean **= 1.0 / len(sampled)
        ok &= mean >= 1.0
        notes.append(f"geometric mean over T > 0: {mean:.3f} (needs ≥ 1; every cell ≥ {1 - tolerance:.2f})")
    return ok, notes


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("directory")
    ap.add_argument("--tolerance", type=float, default=0.05, help="how far below the chain one cell may fall")
    args = ap.parse_args()
    table = cells(Path(args.directory))
    if not table:
        print(f"no bench offline JSON in {args.directory}", file=sys.stderr)
        return 2
    methods = sorted({m for row in table.values() for m in row})
    print("T     batch  " + "  ".join(f"{m:>32}" for m in methods))
    for (t, b), row in sorted(table.items()):
        cols = [f"{row[m]['tok_s']:8.1f} tok/s {row[m]['vs_plain']:.2f}x acc {row[m]['accept']:.2f}" if m in row
                else f"{'-':>32}" for m in methods]
        print(f"{t:<5} {b:<6} " + "  ".join(f"{c:>32}" for c in cols))
    ok, notes = verdict(table, args.tolerance)
    print("\n".join(notes))
    print("sampled trees pay: " + ("yes" if ok else "no"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
