"""Structured output on the bundled pair: every reply must parse and validate, and what the
grammar costs the drafter (accept length constrained against unconstrained).

python bench/structured_output.py --output bench/results/structured_output_cpu/results.json
Held-out ShareGPT first turns through the chat template; each prompt is answered under each of
three JSON schemas (`response_format` json_schema's engine path) at T = 0 and T = 1, and
unconstrained with the same max_tokens for the accept-length baseline. Strict `json.loads`
(control characters refused) and `jsonschema.validate` on every reply.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections import Counter

import jsonschema
import torch

from blockspec.bench.acceptance import load_prompt_sets
from blockspec.bundled import DRAFTER_DIR, TARGET_DIR
from blockspec.engine.outputs import SpecMetrics
from blockspec.grammar.processor import GrammarProcessor
from blockspec.structured_output import StructuredOutput
from blockspec.llm import LLM
from blockspec.sampling import SamplingParams

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "member": {"type": "boolean"}}, "required": ["name", "age", "city", "member"]},
    "order": {"type": "object", "properties": {
        "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object", "properties": {
            "title": {"type": "string", "maxLength": 20},
            "quantity": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["title", "quantity"]}},
        "currency": {"enum": ["EUR", "USD", "GBP"]}}, "required": ["items", "currency"]},
    "answer": {"type": "object", "properties": {
        "answer": {"type": "string", "maxLength": 48},
        "confidence": {"enum": ["low", "medium", "high"]},
        "sources": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 16}},
        "followup": {"anyOf": [{"type": "string", "maxLength": 24}, {"type": "null"}]}},
        "required": ["answer", "confidence", "sources", "followup"]},
}


def run(llm: LLM, prompts, temperature: float, max_tokens: int, schema: dict | None) -> tuple[list, SpecMetrics, float]:
    spec = StructuredOutput("json", schema) if schema is not None else None
    params = [SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=i, structured_output=spec)
              for i in range(len(prompts))]
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    return outs, LLM.aggregate_metrics(outs), time.perf_counter() - start


def check(outs, schema: dict) -> dict:
    """How many replies parse (strict JSON) and validate; the first failures, for the record."""
    parsed = valid = 0
    failures = []
    for o in outs:
        try:
            value = json.loads(o.text)
            parsed += 1
            jsonschema.validate(value, schema)
            valid += 1
        except (ValueError, jsonschema.ValidationError) as e:
            if len(failures) < 5:
                failures.append({"text": o.text, "finish_reason": o.finish_reason, "error": str(e).splitlines()[0]})
    return {"parsed": parsed, "valid": valid, "failures": failures}


def summary(metrics: SpecMetrics, outs, seconds: float) -> dict:
    tokens = sum(len(o.token_ids) for o in outs)
    return {"accept_length": round(metrics.accept_length, 4), "verify_steps": metrics.verify_steps,
            "drafted_tokens": metrics.drafted_tokens, "accepted_tokens": metrics.accepted_tokens,
            "output_tokens": tokens, "mean_output_tokens": round(tokens / len(outs), 2),
            "finish_reasons": dict(Counter(o.finish_reason for o in outs)), "seconds": round(seconds, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--num-prompts", type=int, default=100)
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--spec", default="dflash", choices=["dflash", "ddtree"])
    ap.add_argument("--budget", type=int, default=None, help="DDTree node budget")
    ap.add_argument("--batch", type=int, default=16, help="max running requests")
    ap.add_argument("--schemas", default=",".join(SCHEMAS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--unguided", action="store_true",
                    help="ablation: chain drafts are the drafter's plain argmax (no grammar guidance); "
                         "constrained runs only")
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    if args.unguided:  # the same engine with GrammarProcessor.guide_chain a no-op
        GrammarProcessor.guide_chain = lambda self, seqs, draft_logits, drafts: drafts
    llm = LLM(model=str(TARGET_DIR), spec=args.spec, draft_model=str(DRAFTER_DIR), device=args.device,
              max_running_requests=args.batch, budget=args.budget)
    prompts = load_prompt_sets(llm.tokenizer, args.num_prompts, ["sharegpt"])["sharegpt"]
    records = []
    out = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
           "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
                      f"{args.device}", "spec": args.spec, "budget": args.budget, "block_size": llm.engine.proposer.block_size,
           "max_tokens": args.max_tokens, "guided_chain_drafts": not args.unguided, "num_prompts": len(prompts), "schemas": SCHEMAS, "records": records}
    for t in (float(x) for x in args.temperatures.split(",")):
        if not args.unguided:
            outs, metrics, seconds = run(llm, prompts, t, args.max_tokens, None)
            records.append({"temperature": t, "schema": None, **summary(metrics, outs, seconds)})
            print(json.dumps(records[-1]), flush=True)
        for name in args.schemas.split(","):
            outs, metrics, seconds = run(llm, prompts, t, args.max_tokens, SCHEMAS[name])
            records.append({"temperature": t, "schema": name, **summary(metrics, outs, seconds),
                            **check(outs, SCHEMAS[name]), "example": outs[0].text})
            print(json.dumps({k: v for k, v in records[-1].items() if k != "failures"}), flush=True)
            with open(args.output, "w") as f:  # written after every record: a cut run keeps its figures
                json.dump(out, f, indent=2, ensure_ascii=False)
    assert llm.engine.allocator.num_used_pages == 0
    return 0 if all(r["valid"] == len(prompts) for r in records if r["schema"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
