"""Benchmarks: `blockspec bench serve` (any OpenAI-compatible server) and `blockspec bench offline`
(speculative vs plain decoding in one process). Helpers shared by their reports live here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from blockspec.engine.config import EngineConfig

PERCENTILES = (50, 90, 99)


# EngineConfig fields that describe the speculative method: the plain twin leaves them out
SPEC_ONLY_FIELDS = ("spec", "draft_model", "block_size", "tree_budget", "tree_topk", "spec_verify", "spec_policy",
                    "sampled_trees", "draft_block")


@dataclass
class SpecEngineArgs:
    """The speculative engine a tool measures (bench offline, check lossless) and its plain twin
    on the same target, built from one set of arguments.

    engine_options: the other EngineConfig fields of the shared engine flags (e.g. spec_verify,
    attention_backend, and page_size when given); they apply to both engines (spec-only ones to
    the speculative one only) and win over the sizes a tool picks itself.
    """

    model: str
    draft_model: str | None = None
    spec: str = "dflash"
    block_size: int | None = None
    budget: int | None = None
    topk: int | None = None
    dtype: str = "float32"
    device: str = "cpu"
    engine_options: dict = field(default_factory=dict)

    @staticmethod
    def engine_kwargs(settings: dict) -> dict:
        """This class's keyword arguments for engine settings given as EngineConfig fields
        (`blockspec.engine_args.engine_settings_from_args`)."""
        settings = dict(settings)
        named = {"model": "model", "draft_model": "draft_model", "spec": "spec", "block_size": "block_size",
                 "budget": "tree_budget", "topk": "tree_topk", "dtype": "dtype", "device": "device"}
        kwargs = {arg: settings.pop(name) for arg, name in named.items() if name in settings}
        return {**kwargs, "engine_options": settings}

    def spec_config(self, **engine_kwargs) -> EngineConfig:
        """The speculative engine's config; engine_kwargs are a tool's own choices (sizes)."""
        from blockspec.llm import engine_config
        return engine_config(self.model, spec=self.spec, draft_model=self.draft_model, budget=self.budget,
                             topk=self.topk, **{"block_size": self.block_size, "dtype": self.dtype,
                                                "device": self.device, **engine_kwargs, **self.engine_options})

    def plain_config(self, **engine_kwargs) -> EngineConfig:
        """The plain twin's config: the same target and engine settings, no speculation."""
        from blockspec.llm import engine_config
        options = {k: v for k, v in self.engine_options.items() if k not in SPEC_ONLY_FIELDS}
        return engine_config(self.model, spec="none", **{"dtype": self.dtype, "device": self.device,
                                                         **engine_kwargs, **options})

    def spec_llm(self, **engine_kwargs):
        from blockspec.llm import LLM
        return LLM.from_config(self.spec_config(**engine_kwargs))

    def plain_llm(self, **engine_kwargs):
        from blockspec.llm import LLM
        return LLM.from_config(self.plain_config(**engine_kwargs))

    def spec_fields(self) -> dict:
        """What a report records of the speculative method (and any other engine setting given)."""
        return {"model": self.model, "draft_model": self.draft_model, "spec": self.spec,
                "block_size": self.block_size, "budget": self.budget, "topk": self.topk,
                "engine_options": dict(self.engine_options)}


def summarize(values: list[float], scale: float = 1.0) -> dict[str, float | None]:
    """mean, p50, p90, p99 of `values` times `scale` (None for an empty list)."""
    if not values:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}}
    ordered = sorted(v * scale for v in values)
    return {"mean": sum(ordered) / len(ordered), **{f"p{q}": percentile(ordered, q) for q in PERCENTILES}}


def percentile(ordered: list[float], q: float) -> float:
    """Linear-interpolation percentile of an ascending list (numpy's default rule)."""
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def format_table(headers: list[str], rows: list[list]) -> str:
    """A plain fixed-width text table: numbers right-aligned (floats with 2 decimals, 3 below
    10), text left-aligned, None as '-'."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [all(_is_number(row[i]) for row in rows) and bool(rows) for i in range(len(headers))]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells])


def _is_number(value) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.2f}"
    return str(value)
