"""Prometheus metrics of one server, fed by the engine thread (an EngineObserver).

Each app gets its own CollectorRegistry so that several servers can live in one process.
Accept length (docs/metrics.md): committed tokens per verify step, bonus included.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST as PROMETHEUS_CONTENT_TYPE  # noqa: F401 (re-export)

from blockspec.engine.outputs import SpecMetrics, StepOutput

PREFIX = "blockspec:"
FINISH_REASONS = ("stop", "length", "abort")

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


# Verify widths of the adaptive policy's configurations (engine/spec_policy.py), as histogram buckets.
_WIDTH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def configuration_width(name: str) -> int:
    """Verify width of a configuration name: plain 1, chainK K, treeB B + 1."""
    if name == "plain":
        return 1
    if name.startswith("chain") and name[5:].isdigit():
        return int(name[5:])
    if name.startswith("tree") and name[4:].isdigit():
        return int(name[4:]) + 1
    raise ValueError(f"configuration must be plain, chainK or treeB, got {name!r}")


@dataclass
class _SpecCounts:
    verify_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    committed_tokens: int = 0
    configurations: dict | None = None     # name → verify steps

    @classmethod
    def of(cls, m: SpecMetrics) -> "_SpecCounts":
        return cls(m.verify_steps, m.drafted_tokens, m.accepted_tokens, m.committed_tokens, dict(m.configurations))

    def minus(self, other: "_SpecCounts") -> "_SpecCounts":
        mine, theirs = self.configurations or {}, other.configurations or {}
        return _SpecCounts(self.verify_steps - other.verify_steps,
                           self.drafted_tokens - other.drafted_tokens,
                           self.accepted_tokens - other.accepted_tokens,
                           self.committed_tokens - other.committed_tokens,
                           {k: n - theirs.get(k, 0) for k, n in mine.items() if n != theirs.get(k, 0)})


class SpecDeltas:
    """Turns the per-request cumulative SpecMetrics of StepOutputs into per-step increments."""

    def __init__(self) -> None:
        self._seen: dict[str, _SpecCounts] = {}

    def delta(self, output: StepOutput) -> _SpecCounts:
        now = _SpecCounts.of(output.metrics)
        before = self._seen.pop(output.request_id, _SpecCounts())
        if not output.finished:
            self._seen[output.request_id] = now
        return now.minus(before)


@dataclass
class _Timing:
    arrival: float
    first_token: float | None = None


class ServerMetrics:
    """All blockspec:* metrics; implements the EngineObserver hooks."""

    def __init__(self, registry: CollectorRegistry | None = None, recent_requests: int = 100):
        self.registry = registry if registry is not None else CollectorRegistry()
        self._spec = SpecDeltas()
        self._timings: dict[str, _Timing] = {}
        self._recent = collections.deque(maxlen=recent_requests)  # (committed, verify_steps)
        self._build(self.registry)

    def _build(self, r: CollectorRegistry) -> None:
        self.requests = Counter(PREFIX + "requests", "Finished requests", ["finish_reason"], registry=r)
        for reason in FINISH_REASONS:
            self.requests.labels(finish_reason=reason)  # export zeros before the first request
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens admitted", registry=r)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "Tokens generated", registry=r)
        self.drafted_tokens = Counter(PREFIX + "spec_draft_tokens", "Draft tokens proposed", registry=r)
        self.accepted_tokens = Counter(PREFIX + "spec_accepted_tokens", "Draft tokens accepted", registry=r)
        self.verify_steps = Counter(PREFIX + "spec_verify_steps", "Verify steps", registry=r)
        self.committed_tokens = Counter(PREFIX + "spec_committed_tokens",
                                        "Tokens committed by verify steps (accepted + bonus, after stops)",
                                        registry=r)
        self.configuration_steps = Counter(PREFIX + "spec_configuration_steps",
                                           "Request verify steps per configuration the speculation policy ran "
                                           "(plain, chainK, treeB)", ["configuration"], registry=r)
        self.verify_width = Histogram(PREFIX + "spec_verify_width", "Verify width of each request verify step "
                                      "(plain 1, chain length, tree budget + 1)", buckets=_WIDTH_BUCKETS, registry=r)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Time to first token",
                              buckets=_TTFT_BUCKETS, registry=r)
        self.tpot = Histogram(PREFIX + "time_per_output_token_seconds",
                              "Time per output token after the first", buckets=_TPOT_BUCKETS, registry=r)
        self.running = Gauge(PREFIX + "num_requests_running", "Requests running", registry=r)
        self.waiting = Gauge(PREFIX + "num_requests_waiting", "Requests waiting", registry=r)
        self.kv_usage = Gauge(PREFIX + "kv_cache_usage_ratio", "K/V cache tokens used / total", registry=r)
        self.accept_length = Gauge(PREFIX + "spec_accept_length",
                                   "Committed tokens per verify step over recent requests", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ---- EngineObserver ---------------------------------------------------------------------
    def on_request_added(self, request_id: str, num_prompt_tokens: int, now: float) -> None:
        self.prompt_tokens.inc(num_prompt_tokens)
        self._timings[request_id] = _Timing(now)

    def on_outputs(self, outputs: Sequence[StepOutput], now: float) -> None:
        for output in outputs:
            self._record_output(output, now)

    def on_step_done(self, stats, step_seconds: float, now: float) -> None:
        self.update_stats(stats)

    def on_idle(self, stats, now: float) -> None:
        self.update_stats(stats)

    # ---- helpers ------------------------------------------------------------------------------
    def update_stats(self, stats) -> None:
        if stats is None:
            return
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        total = stats.kv_tokens_total
        self.kv_usage.set(stats.kv_tokens_used / total if total else 0.0)

    def _record_output(self, output: StepOutput, now: float) -> None:
        if output.new_token_ids:
            self.generation_tokens.inc(len(output.new_token_ids))
        spec = self._spec.delta(output)
        self.verify_steps.inc(max(spec.verify_steps, 0))
        self.drafted_tokens.inc(max(spec.drafted_tokens, 0))
        self.accepted_tokens.inc(max(spec.accepted_tokens, 0))
        self.committed_tokens.inc(max(spec.committed_tokens, 0))
        for name, n in (spec.configurations or {}).items():
            self.configuration_steps.labels(configuration=name).inc(max(n, 0))
            for _ in range(max(n, 0)):
                self.verify_width.observe(configuration_width(name))
        timing = self._timings.get(output.request_id)
        if timing is not None and timing.first_token is None and output.new_token_ids:
            timing.first_token = now
            self.ttft.observe(now - timing.arrival)
        if output.finished:
            self._record_finish(output, timing, now)

    def _record_finish(self, output: StepOutput, timing: _Timing | None, now: float) -> None:
        self._timings.pop(output.request_id, None)
        self.requests.labels(finish_reason=output.finish_reason or "unknown").inc()
        if output.finish_reason != "abort" and timing and timing.first_token is not None \
                and output.num_output_tokens > 1:
            self.tpot.observe((now - timing.first_token) / (output.num_output_tokens - 1))
        m = output.metrics
        if m.verify_steps:
            self._recent.append((m.committed_tokens, m.verify_steps))
            steps = sum(v for _, v in self._recent)
            self.accept_length.set(sum(c for c, _ in self._recent) / steps)
