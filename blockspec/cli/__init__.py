"""`blockspec` command line: generate, serve, train-*, bench, check.

Every command that builds an engine takes the same engine flags (`blockspec.engine_args`).
Bad arguments print a message and exit with code 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from blockspec.engine_args import add_engine_arguments, engine_config_from_args


class UsageError(Exception):
    """A problem with what the user asked for: reported as a message, exit code 2."""


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None, help="sampling seed (the engine's: --engine-seed)")
    p.add_argument("--ignore-eos", action="store_true")


def sampling_params_from_args(args):
    from blockspec.sampling import SamplingParams
    try:
        return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              min_p=args.min_p, max_tokens=args.max_tokens, seed=args.seed,
                              ignore_eos=args.ignore_eos)
    except ValueError as e:
        raise UsageError(str(e)) from e


def build_llm(args):
    from blockspec.llm import LLM
    try:
        return LLM.from_config(engine_config_from_args(args))
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(str(e)) from e


def cmd_generate(args) -> int:
    params = sampling_params_from_args(args)
    llm = build_llm(args)
    try:
        out = llm.generate(args.prompt, params)[0]
    except ValueError as e:
        raise UsageError(str(e)) from e
    metrics = out.metrics.to_dict()
    if args.json:
        print(json.dumps({"text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
                          "spec_decoding": metrics}))
    else:
        print(out.text)
        if out.metrics.algorithm != "none":
            print(f"[spec {metrics['algorithm']}] accept_length={metrics['accept_length']:.3f} "
                  f"verify_steps={metrics['verify_steps']} drafted_tokens={metrics['drafted_tokens']} "
                  f"accepted_tokens={metrics['accepted_tokens']}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blockspec", description="Speculative-decoding LLM engine")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate a completion for one prompt")
    add_engine_arguments(gen)
    gen.add_argument("--prompt", required=True)
    add_sampling_arguments(gen)
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    gen.set_defaults(func=cmd_generate)

    from blockspec.server.cli import add_serve_arguments
    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    add_serve_arguments(serve)
    serve.set_defaults(func=cmd_serve)

    from blockspec.train.cli import (add_train_drafter_arguments, add_train_target_arguments,
                                     run_train_drafter, run_train_target)
    tt = sub.add_parser("train-target", help="train a small Qwen3-architecture chat model from scratch")
    add_train_target_arguments(tt)
    tt.set_defaults(func=run_train_target)
    td = sub.add_parser("train-drafter", help="train a DFlash drafter for a target")
    add_train_drafter_arguments(td)
    td.set_defaults(func=run_train_drafter)

    from blockspec.cli.bench import register
    register(sub)
    return parser


def cmd_serve(args) -> int:
    from blockspec.server.cli import build_engine, run_serve
    try:
        return run_serve(args, build_engine) or 0
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(str(e)) from e


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (UsageError, ValueError, FileNotFoundError) as e:
        print(f"blockspec {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
