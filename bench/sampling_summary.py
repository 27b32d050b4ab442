"""summary.json of bench/train_drafter_sampling.sh: accept length per drafter × method × sampling
setting, the arms' training records, and the rebundle verdict (issue 16 part 3).

python bench/sampling_summary.py WORK_DIR OUT.json
reads WORK_DIR/export/results/acc_<drafter>_<method>.json (blockspec.bench.acceptance outputs),
WORK_DIR/d_<arm>/train_log.jsonl and WORK_DIR/regen_counts.json, whichever exist: a run stopped
by its deadline is summarised with what it finished.

The rule (issue 16): an arm may replace the bundled drafter ('before') if it wins at T > 0 —
at every sampled setting measured, its accept length with the best sampled method beats
before's best — without losing more than 3 % at T = 0 with any method measured there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BEFORE = "before"
T0_TOLERANCE = 0.03
METHODS = ("chain", "chain_rejection", "tree16_sampled")


def setting_key(temperature: float, top_p: float) -> str:
    """'0', '1', '0.6:0.95'."""
    return f"{temperature:g}" + (f":{top_p:g}" if temperature > 0 and top_p < 1 else "")


def accept_table(results_dir: Path) -> dict:
    """{drafter: {method: {setting: accept_length}}} from acc_<drafter>_<method>.json files."""
    table: dict = {}
    for path in sorted(Path(results_dir).glob("acc_*.json")):
        name = path.stem.removeprefix("acc_")
        method = next((m for m in sorted(METHODS, key=len, reverse=True) if name.endswith("_" + m)), None)
        if method is None:
            continue
        drafter = name[:-len(method) - 1]
        try:
            records = json.loads(path.read_text())["records"]
        except (ValueError, KeyError):
            continue   # a file cut off by the deadline
        for r in records:
            table.setdefault(drafter, {}).setdefault(method, {})[setting_key(r["temperature"], r["top_p"])] = \
                round(r["accept_length"], 4)
    return table


def rebundle_verdict(table: dict, before: str = BEFORE, tolerance: float = T0_TOLERANCE) -> dict:
    """Per arm: the best sampled accept length against before's at each T > 0 setting, the
    worst relative change at T = 0, and whether the rule lets it replace `before`; 'winner':
    the arm that may, with the highest mean best-method accept length over T > 0 (None if none).
    Settings or methods missing for either side are not compared; an arm with no T > 0
    comparison, or none at T = 0, cannot win."""
    base = table.get(before, {})
    arms = {}
    for arm, methods in table.items():
        if arm == before:
            continue
        sampled = sorted({s for m in methods.values() for s in m if s != "0"}
                         & {s for m in base.values() for s in m if s != "0"})
        per_setting = {}
        for s in sampled:
            ours = max(v[s] for v in methods.values() if s in v)
            theirs = max(v[s] for v in base.values() if s in v)
            per_setting[s] = {"arm": ours, "before": theirs, "wins": ours > theirs}
        t0 = {m: (methods[m]["0"] - base[m]["0"]) / base[m]["0"] for m in methods
              if "0" in methods[m] and "0" in base.get(m, {})}
        worst_t0 = min(t0.values()) if t0 else None
        ok = bool(per_setting) and all(v["wins"] for v in per_setting.values()) and \
            worst_t0 is not None and worst_t0 >= -tolerance
        arms[arm] = {"sampled": per_setting, "t0_change": {m: round(v, 4) for m, v in t0.items()},
                     "worst_t0_change": None if worst_t0 is None else round(worst_t0, 4), "rebundle": ok}
    winners = [a for a, v in arms.items() if v["rebundle"]]
    score = {a: sum(s["arm"] for s in arms[a]["sampled"].values()) / len(arms[a]["sampled"]) for a in winners}
    return {"rule": f"wins at every T > 0 setting (best sampled method) and loses at most {tolerance:.0%} "
                    "at T = 0 with every method", "arms": arms,
            "winner": max(winners, key=score.get) if winners else None}


def training_record(run_dir: Path) -> dict | None:
    log = Path(run_dir) / "train_log.jsonl"
    if not log.is_file():
        return None
    steps = [json.loads(line) for line in log.read_text().splitlines() if '"loss"' in line]
    if not steps:
        return None
    return {"steps": steps[-1]["step"], "first_loss": steps[0]["loss"], "final_loss": steps[-1]["loss"],
            "elapsed_s": steps[-1].get("elapsed_s"), "finished": (Path(run_dir) / "model.safetensors").is_file()}


def summarise(work: Path) -> dict:
    work = Path(work)
    table = accept_table(work / "export" / "results")
    counts = work / "regen_counts.json"
    arms_file = work / "arms.json"
    arms = json.loads(arms_file.read_text()) if arms_file.is_file() else {}
    return {"accept_length": table, "verdict": rebundle_verdict(table),
            "regenerated": json.loads(counts.read_text()) if counts.is_file() else None,
            "arms": {name: {**spec, "training": training_record(work / f"d_{name}")} for name, spec in arms.items()}}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: python bench/sampling_summary.py WORK_DIR OUT.json", file=sys.stderr)
        sys.exit(2)
    Path(sys.argv[2]).write_text(json.dumps(summarise(Path(sys.argv[1])), indent=2))
