"""Join acceptance JSONs (python -m blockspec.bench.acceptance) of one drafter's training phases
into one accept-length-against-steps curve, steps counted from the start of training.

python bench/acceptance_curve.py --output OUT.json --plot OUT.png PART [PART ...]
PART = FILE:OFFSET[:KEEP=STEP] — add OFFSET to each record's step; with KEEP=STEP, take only the
records whose step field is KEEP and call them STEP (for files keyed by something else).
"""

import argparse
import json
import sys

from blockspec.bench.acceptance import plot_accept_vs_steps


def read_part(spec: str) -> list[dict]:
    path, offset, *keep = spec.split(":")
    records = json.load(open(path))["records"]
    if keep:
        old, new = (int(v) for v in keep[0].split("="))
        records = [{**r, "step": new} for r in records if r["step"] == old]
    return [{**r, "step": r["step"] + int(offset), "source": path} for r in records]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", required=True)
    ap.add_argument("--plot", required=True)
    ap.add_argument("parts", nargs="+")
    args = ap.parse_args()
    records = sorted((r for part in args.parts for r in read_part(part)),
                     key=lambda r: (r["step"], r["dataset"], r["temperature"]))
    doc = {"command": "python bench/acceptance_curve.py " + " ".join(sys.argv[1:]), "records": records}
    open(args.output, "w").write(json.dumps(doc, indent=2))
    plot_accept_vs_steps(records, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
