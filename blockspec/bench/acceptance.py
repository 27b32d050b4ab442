"""Accept length of a drafter on held-out prompts, measured with the engine.

`python -m blockspec.bench.acceptance --target DIR --drafter STEP=DIR ... --output results.json`
runs greedy and sampled decoding over held-out ShareGPT and HumanEval prompts, for each
drafter snapshot, and records accept length (committed tokens per verify step, bonus
included) and per-position acceptance rates; `--plot` draws accept length against steps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from blockspec.engine.config import SPEC_VERIFY_RULES
from blockspec.engine.outputs import SpecMetrics
from blockspec.llm import LLM
from blockspec.sampling import SamplingParams
from blockspec.train.regenerate import parse_temperatures


DATASETS = ("sharegpt", "humaneval")


def load_prompt_sets(tokenizer, num_prompts: int, datasets=DATASETS) -> dict[str, list[list[int]]]:
    from blockspec.train.data import humaneval_prompts, render_prompt, sharegpt_held_out_prompts
    hf = tokenizer.hf_tokenizer
    loaders = {"sharegpt": sharegpt_held_out_prompts, "humaneval": humaneval_prompts}
    return {name: [render_prompt(hf, p.messages)[-320:] for p in loaders[name](num_prompts)] for name in datasets}


def measure(llm: LLM, prompts: list[list[int]], temperature: float, max_tokens: int, batch: int,
            top_p: float = 1.0, seeded: bool = False) -> dict:
    """Unseeded requests measure the verification rule (`--spec-verify`); seeded ones (seed i)
    sample by the exponential race whatever the rule (blockspec/seeded_sampling.py)."""
    total = SpecMetrics(algorithm=llm.engine.spec_algorithm)
    tokens, start = 0, time.perf_counter()
    for i in range(0, len(prompts), batch):
        params = [SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                                 seed=i + j if seeded else None)
                  for j in range(len(prompts[i:i + batch]))]
        for out in llm.generate(prompts[i:i + batch], params):
            total.merge(out.metrics)
            tokens += len(out.token_ids)
    elapsed = time.perf_counter() - start
    steps = max(total.verify_steps, 1)
    return {"accept_length": total.accept_length, "verify_steps": total.verify_steps,
            "drafted_tokens": total.drafted_tokens, "accepted_tokens": total.accepted_tokens,
            "acceptance_per_position": [c / steps for c in total.accepted_per_position],
            "output_tokens": tokens, "tokens_per_s": tokens / elapsed, "num_prompts": len(prompts)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", action="append", required=True, help="STEP=DIR (repeatable)")
    ap.add_argument("--spec", default="dflash")
    ap.add_argument("--spec-verify", default="target-only", choices=SPEC_VERIFY_RULES,
                    help="rejection: drafts sampled from the drafter's q, rejection sampling (dflash chains, "
                         "ddtree trees)")
    ap.add_argument("--budget", type=int, default=None, help="DDTree node budget (default 16)")
    ap.add_argument("--sampled-trees", action="store_true",
                    help="dflash: sampled rows draft trees of the block's node count, children drawn from q")
    ap.add_argument("--top-p", type=float, default=1.0, help="top_p of the sampled requests")
    ap.add_argument("--seeded", action="store_true",
                    help="seed every request: sampled rows then take the exponential race, not --spec-verify")
    ap.add_argument("--block-size", type=int, default=None)
    ap.add_argument("--temperatures", default="0,1",
                    help="items T or T:TOP_P, e.g. 0,0.6:0.95,1 (T alone takes --top-p)")
    ap.add_argument("--datasets", default=",".join(DATASETS), help="held-out prompt sets: sharegpt,humaneval")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs (no capture at startup)")
    ap.add_argument("--output", required=True)
    ap.add_argument("--plot", default=None, help="PNG: accept length against training steps")
    args = ap.parse_args(argv)
    try:
        temps = parse_temperatures(args.temperatures, default_top_p=args.top_p)
    except ValueError as e:
        ap.error(str(e))
    datasets = [d for d in args.datasets.split(",") if d]
    unknown = sorted(set(datasets) - set(DATASETS))
    if unknown or not datasets:
        ap.error(f"--datasets must name some of {', '.join(DATASETS)}, got {args.datasets!r}")
    drafters = [item.partition("=")[::2] for item in args.drafter]
    for item, (step, path) in zip(args.drafter, drafters):
        if not step.isdigit() or not path:
            ap.error(f"--drafter must be STEP=DIR with an integer STEP, got {item!r}")
    records = []
    prompt_sets = None
    for step, path in drafters:
        try:
            # Static widths: this measures the drafter at its configured block or budget.
            llm = LLM(model=args.target, draft_model=path, spec=args.spec, block_size=args.block_size, spec_policy="static",
                      device=args.device, dtype=args.dtype, max_running_requests=args.batch,
                      spec_verify=args.spec_verify, budget=args.budget, cuda_graph=not args.eager,
                      sampled_trees=args.sampled_trees)
        except (ValueError, FileNotFoundError) as e:
            ap.exit(2, f"acceptance: error: {e}\n")
        prompt_sets = prompt_sets or load_prompt_sets(llm.tokenizer, args.num_prompts, datasets)
        for name, prompts in prompt_sets.items():
            for t, top_p in temps:
                rec = {"step": int(step), "dataset": name, "temperature": t, "top_p": top_p,
                       **measure(llm, prompts, t, args.max_tokens, args.batch, top_p, args.seeded)}
                print(json.dumps({k: v for k, v in rec.items() if k != "acceptance_per_position"}), flush=True)
                records.append(rec)
                # Written after every record: a run stopped early keeps what it measured.
                write_results(args, argv, records)
    if args.plot:
        plot_accept_vs_steps(records, args.plot)
    return 0


def write_results(args, argv, records: list[dict]) -> None:
    out = {"command": "python -m blockspec.bench.acceptance " + " ".join(argv or sys.argv[1:]),
           "target": args.target, "spec": args.spec, "spec_verify": args.spec_verify, "sampled_trees": args.sampled_trees,
           "block_size": args.block_size, "budget": args.budget, "top_p": args.top_p, "seeded": args.seeded,
           "max_tokens": args.max_tokens,
           "device": args.device, "dtype": args.dtype, "records": records}
    Path(args.output).write_text(json.dumps(out, indent=2))


def plot_accept_vs_steps(records: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    keys = sorted({(r["dataset"], r["temperature"]) for r in records})
    for ds, t in keys:
        pts = sorted((r["step"], r["accept_length"]) for r in records if (r["dataset"], r["temperature"]) == (ds, t))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{ds} T={t:g}")
    ax.set_xlabel("drafter training steps")
    ax.set_ylabel("accept length (tokens / verify step)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
