"""Command line of `blockspec bench {serve,offline}` and `blockspec check {temperature,lossless}`.

`register(subparsers)` adds both commands to the main parser. Each `func(args)` returns an exit
code; arguments that argparse cannot judge (lists, combinations) raise ValueError, which the
main CLI reports as a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

from blockspec.bench.datasets import DATASETS
from blockspec.engine_args import add_engine_arguments, engine_settings_from_args


# ---- list arguments --------------------------------------------------------------------------

def parse_list(text: str | None, convert, name: str) -> list | None:
    """'1,2,4' -> [1, 2, 4]; None stays None; a bad item raises ValueError naming the option."""
    if text is None:
        return None
    try:
        values = [convert(item.strip()) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ValueError(f"{name} must be a comma-separated list of {convert.__name__} values, got {text!r}") from None
    if not values:
        raise ValueError(f"{name} is empty")
    return values


def _positive_ints(text: str, name: str) -> list[int]:
    values = parse_list(text, int, name)
    if any(v < 1 for v in values):
        raise ValueError(f"{name} values must be positive, got {text!r}")
    return values


def _temperatures(text: str, name: str) -> list[float]:
    values = parse_list(text, float, name)
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise ValueError(f"{name} values must be finite and >= 0, got {text!r}")
    return values


def _datasets(text: str) -> list[str]:
    names = parse_list(text, str, "--dataset")
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        raise ValueError(f"unknown dataset {unknown[0]!r}; choose from {', '.join(DATASETS)}")
    return names


# ---- parsers ---------------------------------------------------------------------------------

def register(subparsers) -> None:
    """Add `bench` and `check` to the main CLI's subparsers."""
    bench = subparsers.add_parser("bench", help="benchmarks (serving load test, offline speedup)")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    _add_serve(bench_sub.add_parser("serve", help="load-test an OpenAI-compatible server"))
    _add_offline(bench_sub.add_parser("offline", help="speculative vs plain decoding in one process"))
    _add_step(bench_sub.add_parser("step", help="one engine step of a named model shape vs its bandwidth floor"))
    check = subparsers.add_parser("check", help="correctness checks of speculative sampling")
    check_sub = check.add_subparsers(dest="check_command", required=True)
    _add_temperature(check_sub.add_parser("temperature", help="does a server really sample at T > 0?"))
    _add_lossless(check_sub.add_parser("lossless", help="chi-square test: speculative = target's law"))


def _add_tool_engine_arguments(p: argparse.ArgumentParser, **defaults) -> None:
    """The shared engine flags, for a tool that measures a given speculative method (dflash unless told)."""
    add_engine_arguments(p, model_required=True, spec_default="dflash", **defaults)


def _add_serve(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--compare-static", default=None, metavar="NAME=URL,...",
                   help="instead of --url: servers to compare side by side, named adaptive, plain and any static "
                        "configurations (e.g. adaptive=URL,plain=URL,chain16=URL)")
    p.add_argument("--output-dir", default=None, help="where results.json and the plots go")
    p.add_argument("--dataset", default="sharegpt", choices=DATASETS)
    p.add_argument("--dataset-path", default=None, help="data file instead of the installed package's")
    p.add_argument("--num-prompts", type=int, default=100, help="requests per (concurrency, temperature) cell")
    p.add_argument("--random-input-len", type=int, default=128)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--concurrency", default="1,2,4,8,16,32,64", help="sweep of max requests in flight")
    p.add_argument("--temperature", default="0,0.6,1.0", help="sweep of temperatures")
    p.add_argument("--request-rate", type=float, default=math.inf, help="Poisson arrivals per second (inf: all at once)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=None, help="default: the dataset's length, else 128")
    p.add_argument("--model", default=None, help="default: the first model of /v1/models")
    p.add_argument("--api-key", default=None)
    p.add_argument("--ignore-eos", action="store_true", help="send ignore_eos (not an OpenAI parameter)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_bench_serve)


def _add_offline(p: argparse.ArgumentParser) -> None:
    _add_tool_engine_arguments(p)
    p.add_argument("--dataset", default="sharegpt,humaneval,random", help="comma-separated datasets")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--random-input-len", type=int, default=128)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--temperature", default="0", help="comma-separated temperatures")
    p.add_argument("--batch-size", type=int, default=1, help="prompts per generate call (1 = latency)")
    p.add_argument("--max-tokens", type=int, default=None, help="default: the dataset's length, else 128")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--unseeded", action="store_true",
                   help="send requests without a per-request seed (default: request i gets --seed + i)")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--output", default=None, help="JSON results file")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--compare-static", action="store_true",
                   help="plain, each static width and the adaptive policy side by side over --concurrency "
                        "(first dataset and temperature); --output's JSON gets a .png plot beside it")
    p.add_argument("--concurrency", default="1,4,16", help="with --compare-static: requests in flight")
    p.add_argument("--repeats", type=int, default=1,
                   help="with --compare-static: rounds per cell, rotated; a cell's tok/s is their median")
    p.add_argument("--warmup-rounds", type=int, default=0,
                   help="with --compare-static: untimed rounds of every configuration before each concurrency's "
                        "timed ones (compiles of new shapes land there)")
    p.add_argument("--waves", type=int, default=2,
                   help="with --compare-static: each cell runs at least this many prompts per request in flight "
                        "(max(num-prompts, waves × concurrency)), so a high concurrency is not all ramp and tail")
    p.add_argument("--static-widths", default=None,
                   help="with --compare-static: verify widths of the static configurations (chain length, tree "
                        "budget + 1; default: the adaptive policy's candidates)")
    p.set_defaults(func=cmd_bench_offline)


def _add_step(p: argparse.ArgumentParser) -> None:
    from blockspec.bench.moe_step import MOE_SHAPES
    from blockspec.bench.step import SHAPES
    from blockspec.engine.config import ATTENTION_BACKENDS
    p.add_argument("--shape", default="qwen3-8b", choices=[*SHAPES, *MOE_SHAPES, "bundled"],
                   help="random-weight model shape (kimi-k2-slice: decode and MLA attention figures)")
    p.add_argument("--device", default="cuda", help="cuda (or cpu, for a smoke run)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--context", type=int, default=1024, help="cached tokens per request")
    p.add_argument("--batches", default="1,16,64", help="decode batch sizes")
    p.add_argument("--chain", type=int, default=16, help="verify width of the chain (root included)")
    p.add_argument("--trees", default="32,64", help="tree budgets to verify")
    p.add_argument("--drafter-layers", type=int, default=5)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--temperatures", default="0,0.6", help="decode step at each (T > 0 with top_p 0.95)")
    p.add_argument("--iters", type=int, default=20, help="timed steps per figure")
    p.add_argument("--attention-backend", default="auto", choices=ATTENTION_BACKENDS)
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--batch-invariant", action="store_true",
                   help="the target on the batch-invariant kernels (fixed-tile GEMM, attention, RMSNorm): their cost")
    p.add_argument("--profile", action="store_true", help="kernel table of the batch-1 steps (CUDA)")
    p.add_argument("--capture-all", action="store_true",
                   help="also time capturing every CUDA-graph bucket up to the largest batch (plain decode)")
    p.add_argument("--attention-contexts", default="4096,32768",
                   help="MoE slice shapes: contexts of the MLA attention figures")
    p.add_argument("--int4-experts", action="store_true",
                   help="MoE slice shapes: routed experts packed INT4 (group 32) on the W4A16 kernel, as Kimi ships them")
    p.add_argument("--output", default=None, help="JSON results file")
    p.set_defaults(func=cmd_bench_step)


def cmd_bench_step(args) -> int:
    from blockspec.bench.step import StepBenchConfig, run_step_bench
    for name in ("context", "chain", "drafter_layers", "block_size", "iters"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive")
    cfg = StepBenchConfig(shape=args.shape, device=args.device, dtype=args.dtype, context=args.context,
                          batches=_positive_ints(args.batches, "--batches"), chain=args.chain,
                          trees=_positive_ints(args.trees, "--trees"), drafter_layers=args.drafter_layers,
                          block_size=args.block_size, temperatures=_temperatures(args.temperatures, "--temperatures"),
                          iters=args.iters, graphs=not args.disable_cuda_graph,
                          attention_backend=args.attention_backend, batch_invariant=args.batch_invariant,
                          profile=args.profile, capture_all=args.capture_all,
                          attention_contexts=_positive_ints(args.attention_contexts, "--attention-contexts"),
                          int4_experts=args.int4_experts, output=args.output)
    run_step_bench(cfg)
    return 0


def _add_temperature(p: argparse.ArgumentParser) -> None:
    from blockspec.validation.temperature import DEFAULT_PROMPT
    p.add_argument("--url", required=True)
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--temperatures", default="0,0.6,1.0")
    p.add_argument("--num-seeds", type=int, default=16, help="seeded samples per temperature > 0")
    p.add_argument("--repeats", type=int, default=3, help="temperature-0 repeats")
    p.add_argument("--seed", type=int, default=1234, help="first seed")
    p.add_argument("--model", default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument("--endpoint", default="chat", choices=("chat", "completions"))
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--timeout", type=float, default=300.0)
    p.set_defaults(func=cmd_check_temperature)


def _add_lossless(p: argparse.ArgumentParser) -> None:
    from blockspec.engine.config import SPEC_VERIFY_RULES
    from blockspec.validation.check_lossless import DEFAULT_PROMPT, LosslessCheckConfig
    # the cap of requests in flight: the check runs thousands of short ones
    _add_tool_engine_arguments(p, max_running_requests_default=LosslessCheckConfig.max_running_requests)
    p.add_argument("--verify", dest="spec_verify", choices=SPEC_VERIFY_RULES, default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)  # the old name of --spec-verify
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--prompt-ids", default=None, help="comma-separated token ids (instead of --prompt)")
    p.add_argument("--num-tokens", type=int, default=3)
    p.add_argument("--num-samples", type=int, default=20_000)
    p.add_argument("--temperature", default=None, help="comma-separated; with the lists below, zipped into settings")
    p.add_argument("--top-p", default=None)
    p.add_argument("--top-k", default=None)
    p.add_argument("--min-p", default=None)
    p.add_argument("--alpha", type=float, default=1e-3)
    p.add_argument("--control-factor", type=float, default=1.1,
                   help="negative control: the reference at this multiple of the temperature")
    p.add_argument("--mode", default="auto", choices=("auto", "exact", "two-sample"))
    p.add_argument("--output", default=None, help="JSON results file")
    p.set_defaults(func=cmd_check_lossless)


# ---- commands --------------------------------------------------------------------------------

def _settings(args: argparse.Namespace) -> dict:
    """The parsed arguments as JSON values (an infinite rate is written as "inf")."""
    def plain(v):
        return str(v) if isinstance(v, float) and not math.isfinite(v) else v
    return {k: plain(v) for k, v in vars(args).items() if not callable(v)}


def cmd_bench_serve(args: argparse.Namespace) -> int:
    from blockspec.bench.datasets import load_dataset
    from blockspec.bench.serve import ServeBenchConfig, ServerUnreachable, format_records, run_serve_bench
    if args.request_rate <= 0:
        raise ValueError(f"--request-rate must be positive, got {args.request_rate}")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise ValueError("--max-tokens must be positive")
    if (args.url is None) == (args.compare_static is None):
        raise ValueError("bench serve needs --url or --compare-static (one of them)")
    servers = None
    if args.compare_static is not None:
        from blockspec.bench.serve_compare import parse_servers
        servers = parse_servers(args.compare_static)
    prompts = load_dataset(args.dataset, args.num_prompts, args.seed, random_input_len=args.random_input_len,
                           random_output_len=args.random_output_len, path=args.dataset_path)
    config = ServeBenchConfig(url=args.url or "", prompts=prompts, concurrencies=_positive_ints(args.concurrency, "--concurrency"),
                              temperatures=_temperatures(args.temperature, "--temperature"), max_tokens=args.max_tokens,
                              model=args.model, api_key=args.api_key, request_rate=args.request_rate, seed=args.seed,
                              ignore_eos=args.ignore_eos, timeout_s=args.timeout, progress=not args.no_progress)
    output_dir = args.output_dir or f"bench-serve-{time.strftime('%Y%m%d-%H%M%S')}"
    if servers is not None:
        from blockspec.bench.serve_compare import format_serve_compare, run_serve_compare
        try:
            document = run_serve_compare(config, servers, output_dir, shlex.join(sys.argv))
        except ServerUnreachable as e:
            print(f"blockspec bench serve: {e}", file=sys.stderr)
            return 2
        print(format_serve_compare(document))
        print(f"results: {Path(output_dir) / 'compare.json'}")
        return 0
    try:
        document = run_serve_bench(config, output_dir, shlex.join(sys.argv), _settings(args))
    except ServerUnreachable as e:
        print(f"blockspec bench serve: {e}", file=sys.stderr)
        return 2
    print(f"server {document['server_url']}  model {document['model']}  dataset {args.dataset}")
    print(format_records(document["records"]))
    for r in document["records"]:
        if r["failed"]:
            print(f"concurrency {r['concurrency']} T={r['temperature']:g}: {r['failed']} failed, e.g. {r['errors'][0]}")
    print(f"results: {Path(output_dir) / 'results.json'}")
    return 0


def cmd_bench_offline(args: argparse.Namespace) -> int:
    from blockspec.bench.offline import OfflineBenchConfig, format_records, run_offline_bench
    config = OfflineBenchConfig(
        **OfflineBenchConfig.engine_kwargs(engine_settings_from_args(args)), datasets=_datasets(args.dataset),
        num_prompts=args.num_prompts, temperatures=_temperatures(args.temperature, "--temperature"),
        batch_size=args.batch_size, max_tokens=args.max_tokens, seed=args.seed, ignore_eos=args.ignore_eos,
        request_seeds=not args.unseeded, random_input_len=args.random_input_len, random_output_len=args.random_output_len,
        progress=not args.no_progress)
    stamp = {"command": shlex.join(sys.argv), "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if args.compare_static:
        return _compare_static(args, config, stamp)
    document = {**stamp, **run_offline_bench(config)}
    print(format_records(document["records"]))
    if args.output:
        Path(args.output).write_text(json.dumps(document, indent=2))
        print(f"results: {args.output}")
    return 0


def _compare_static(args: argparse.Namespace, config, stamp: dict) -> int:
    from blockspec.bench.compare import compiled_cells, format_compare, plot_compare, run_compare
    from blockspec.bench.offline import _warm_up
    config.validate()
    widths = _positive_ints(args.static_widths, "--static-widths") if args.static_widths else None
    def save(partial: dict) -> None:       # after each concurrency: a run cut short keeps what it measured
        if args.output:
            Path(args.output).write_text(json.dumps({**stamp, **partial}, indent=2))
    document = {**stamp, **run_compare(config, _positive_ints(args.concurrency, "--concurrency"), widths, _warm_up,
                                       args.repeats, args.waves, save, args.warmup_rounds)}
    print(format_compare(document))
    for cell in compiled_cells(document):
        print(f"note: Triton compiled inside a timed round, {cell}")
    if args.output:
        out = Path(args.output)
        out.write_text(json.dumps(document, indent=2))
        plot_compare(document, out.with_suffix(".png"))
        print(f"results: {out} and {out.with_suffix('.png')}")
    return 0


def cmd_check_temperature(args: argparse.Namespace) -> int:
    from blockspec.validation.temperature import TemperatureCheckConfig, run_temperature_check
    config = TemperatureCheckConfig(
        url=args.url, prompt=args.prompt, temperatures=_temperatures(args.temperatures, "--temperatures"),
        top_p=args.top_p, max_tokens=args.max_tokens, num_seeds=args.num_seeds, repeats=args.repeats,
        seed=args.seed, model=args.model, api_key=args.api_key, endpoint=args.endpoint,
        concurrency=args.concurrency, timeout_s=args.timeout)
    return run_temperature_check(config)


def cmd_check_lossless(args: argparse.Namespace) -> int:
    from blockspec.validation.check_lossless import LosslessCheckConfig, run_lossless_check, settings_from_lists
    settings = settings_from_lists(parse_list(args.temperature, float, "--temperature"),
                                   parse_list(args.top_p, float, "--top-p"), parse_list(args.top_k, int, "--top-k"),
                                   parse_list(args.min_p, float, "--min-p"))
    engine = engine_settings_from_args(args)
    # the check sizes its engines from these two itself: the verify rule and the cap of requests in flight
    verify, max_running_requests = engine.pop("spec_verify"), engine.pop("max_running_requests")
    config = LosslessCheckConfig(
        **LosslessCheckConfig.engine_kwargs(engine), verify=verify, max_running_requests=max_running_requests,
        prompt=args.prompt, prompt_ids=parse_list(args.prompt_ids, int, "--prompt-ids"), num_tokens=args.num_tokens,
        num_samples=args.num_samples, settings=settings, alpha=args.alpha, control_factor=args.control_factor,
        mode=args.mode)
    return run_lossless_check(config, args.output)
