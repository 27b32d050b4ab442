"""The engine flags every command shares, and the one builder of an `EngineConfig` from them.

`generate`, `serve`, `bench offline` and `check lossless` all call `add_engine_arguments`, so a
flag, its type, choices and default are written once; what legitimately differs between commands
(is --model required, the default --spec, check lossless' request cap) is a parameter.

Flag -> `EngineConfig` field (the rest map by name, dashes to underscores):
  --budget -> tree_budget, --topk -> tree_topk, --engine-seed -> seed (`--seed` stays the sampling /
  benchmark seed of the commands that have one), --disable-cuda-graph -> cuda_graph=False,
  --disable-fused-ops -> fused_ops=False, --disable-overlap-schedule -> overlap_schedule=False.
Not a flag: `detokenize` (every command that decodes text needs it; token-id-only tools set it in code).
Size flags default to None, meaning "the engine's default" (shown in --help): the engine config
stays the single place those defaults live, and a tool can tell a flag the user gave from one it did not.
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from blockspec.engine.config import (ATTENTION_BACKENDS, DRAFT_BLOCKS, SPEC_ALGORITHMS, SPEC_POLICIES, SPEC_VERIFY_RULES,
                                     EngineConfig)
from blockspec.models.loader import DTYPES

ENGINE_GROUP_TITLE = "engine"

# argparse dest -> EngineConfig field, where the two names differ
RENAMED = {"budget": "tree_budget", "topk": "tree_topk", "engine_seed": "seed"}
# EngineConfig fields no flag sets, and why
NOT_FLAGS = {"detokenize": "always on for the commands; token-id-only tools pass detokenize=False in code"}


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _engine_default(name: str):
    return next(f.default for f in fields(EngineConfig) if f.name == name)


def add_engine_arguments(parser: argparse.ArgumentParser, *, model_required: bool = False,
                         spec_default: str | None = None,
                         max_running_requests_default: int | None = None) -> argparse._ArgumentGroup:
    """Add the engine flags, as the argument group titled "engine", and return the group.

    model_required: bench/check tools measure a given model; generate and serve fall back to the
    bundled pair. spec_default None: dflash when the bundled pair (with its drafter) is used, else
    none. max_running_requests_default None: the engine's default.
    """
    g = parser.add_argument_group(ENGINE_GROUP_TITLE, "the model and how the engine runs it")
    g.add_argument("--model", required=model_required, default=None,
                   help="target model directory (Hugging Face format)"
                        + ("" if model_required else "; default: the bundled model"))
    g.add_argument("--dtype", default=_engine_default("dtype"), choices=tuple(DTYPES))
    g.add_argument("--device", default=_engine_default("device"), help="auto, cpu, cuda or cuda:N")
    g.add_argument("--draft-model", default=None, help="drafter directory (DFlash, z-lab format)")
    g.add_argument("--spec", default=spec_default, choices=SPEC_ALGORITHMS,
                   help="speculative decoding algorithm (default: "
                        + (spec_default or "dflash with the bundled model, else none") + ")")
    g.add_argument("--block-size", type=positive_int, default=None,
                   help="draft block size (default: the drafter's own; ngram 8)")
    g.add_argument("--budget", type=positive_int, default=None, help="DDTree node budget")
    g.add_argument("--topk", type=positive_int, default=None, help="DDTree top-k per depth")
    g.add_argument("--spec-verify", default=_engine_default("spec_verify"), choices=SPEC_VERIFY_RULES,
                   help="rejection: drafts sampled from the drafter's q, rejection-sampled (dflash chains; "
                        "ddtree: sampled children, recursive rejection sampling; greedy rows keep the walk)")
    g.add_argument("--sampled-trees", action="store_true", default=None,
                   help="dflash: sampled requests draft a tree of the block's node count whose children are draws "
                        "from the drafter's q (recursive rejection sampling; seeded ones ranked by their race); "
                        "greedy requests keep the argmax chain")
    g.add_argument("--draft-block", default=_engine_default("draft_block"), choices=DRAFT_BLOCKS,
                   help="what a narrower verify width drafts: full (the whole block's drafts, cut: the GPU, where "
                        "the drafter's cost hardly depends on the block), width (a block of that width: the CPU, "
                        "where it grows with the block), auto (full on CUDA, width elsewhere)")
    g.add_argument("--spec-policy", default=_engine_default("spec_policy"), choices=SPEC_POLICIES,
                   help="adaptive: each step picks plain, a shorter chain or a smaller tree from measured step "
                        "cost and acceptance; static: always the full block / budget (docs/adaptive.md)")
    mrr = max_running_requests_default
    g.add_argument("--max-running-requests", type=positive_int, default=mrr,
                   help=f"most requests decoded at once (default: {mrr or _engine_default('max_running_requests')})")
    g.add_argument("--kv-cache-tokens", type=positive_int, default=None,
                   help="K/V cache size in tokens (default: enough for the running requests, at most 32768)")
    g.add_argument("--page-size", type=positive_int, default=None,
                   help=f"tokens per K/V page (default: {_engine_default('page_size')})")
    g.add_argument("--max-model-len", type=positive_int, default=None,
                   help="longest prompt + output (default: the model's context length)")
    g.add_argument("--max-prefill-tokens", type=positive_int, default=None,
                   help=f"prompt tokens per prefill step (default: {_engine_default('max_prefill_tokens')})")
    g.add_argument("--engine-seed", type=int, default=None,
                   help=f"seed of the random draws of requests without a seed (default: {_engine_default('seed')})")
    g.add_argument("--attention-backend", default=_engine_default("attention_backend"), choices=ATTENTION_BACKENDS,
                   help="auto: triton on CUDA, reference on CPU")
    g.add_argument("--disable-cuda-graph", action="store_true", help="run decode/verify steps eagerly on CUDA")
    g.add_argument("--disable-fused-ops", action="store_true",
                   help="keep RMSNorm, RoPE and SwiGLU as eager PyTorch on CUDA")
    g.add_argument("--disable-overlap-schedule", action="store_true",
                   help="read each decode step's result before launching the next (no CPU/GPU overlap)")
    g.add_argument("--batch-invariant", action="store_true",
                   help="fixed-order GEMM, attention and RMSNorm kernels: a position's logits do not depend on "
                        "the verify width or the batch (greedy speculative = plain; costs speed; CUDA, dense GQA "
                        "models only; docs/batch_invariance.md)")
    g.add_argument("--cuda-graph-max-bs", type=positive_int, default=None,
                   help=f"largest batch captured in a CUDA graph (default: {_engine_default('cuda_graph_max_bs')})")
    g.add_argument("--tensor-parallel-size", "--tp", dest="tensor_parallel_size", type=positive_int, default=None,
                   help="shard the target over N ranks: GPUs (NCCL) or CPU processes (gloo) "
                        f"(default: {_engine_default('tensor_parallel_size')})")
    g.add_argument("--expert-parallel", action="store_true", default=None,
                   help="with --tensor-parallel-size: each rank holds whole experts instead of a slice of every expert")
    return g


def engine_settings_from_args(args: argparse.Namespace) -> dict:
    """The engine flags as `EngineConfig` field -> value, leaving out those left at None (the
    engine's default applies; `model`/`spec` None are resolved by `engine_config`)."""
    settings = {}
    for f in fields(EngineConfig):
        if f.name in NOT_FLAGS:
            continue
        if f.name in ("cuda_graph", "fused_ops", "overlap_schedule"):
            settings[f.name] = not getattr(args, f"disable_{f.name}")
            continue
        if f.name == "batch_invariant":
            settings[f.name] = bool(getattr(args, "batch_invariant", False))
            continue
        dest = next((d for d, field in RENAMED.items() if field == f.name), f.name)
        value = getattr(args, dest)
        if value is not None:
            settings[f.name] = value
    return settings


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig of the engine flags, through the same builder as `LLM(...)` (bundled
    model when --model is omitted)."""
    from blockspec.llm import engine_config
    return engine_config(**engine_settings_from_args(args))
