"""The periodic "Decode batch" log line (SGLang's format, docs/metrics.md), an EngineObserver.

A line is written every `interval` seconds while the engine is busy; a window starts with the
first step after an idle period, so idle time never dilutes the throughput.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from blockspec.engine.outputs import StepOutput
from blockspec.server.metrics import SpecDeltas

DEFAULT_LOG_INTERVAL = 10.0


def format_stats_line(stats, accept_length: float, throughput: float, configurations: dict | None = None) -> str:
    """SGLang's line; `configurations` (name → request verify steps in the window, the
    speculation policy's choices) appends their shares, most used first."""
    total = stats.kv_tokens_total
    usage = stats.kv_tokens_used / total if total else 0.0
    line = (f"Decode batch, #running-req: {stats.num_running}, #token: {stats.kv_tokens_used}, "
            f"token usage: {usage:.2f}, accept len: {accept_length:.2f}, "
            f"gen throughput (token/s): {throughput:.2f}, #queue-req: {stats.num_waiting}")
    steps = sum((configurations or {}).values())
    if steps:
        shares = sorted(configurations.items(), key=lambda kv: (-kv[1], kv[0]))
        line += ", spec config: " + " ".join(f"{name} {100 * n / steps:.0f}%" for name, n in shares)
    return line


class StatsLogger:
    """Aggregates steps over a window and logs one line per `interval` seconds of work."""

    def __init__(self, interval: float = DEFAULT_LOG_INTERVAL, logger: logging.Logger | None = None):
        if interval <= 0:
            raise ValueError(f"log interval must be positive, got {interval}")
        self.interval = interval
        self.logger = logger or logging.getLogger("blockspec")
        self._spec = SpecDeltas()
        self._reset(window_start=None)

    def _reset(self, window_start: float | None) -> None:
        self._window_start = window_start
        self._tokens = 0
        self._verify_steps = 0
        self._committed = 0
        self._configurations: dict[str, int] = {}

    # ---- EngineObserver -----------------------------------------------------------------------
    def on_request_added(self, request_id: str, num_prompt_tokens: int, now: float) -> None:
        pass

    def on_outputs(self, outputs: Sequence[StepOutput], now: float) -> None:
        for output in outputs:
            self._tokens += len(output.new_token_ids)
            spec = self._spec.delta(output)
            self._verify_steps += spec.verify_steps
            self._committed += spec.committed_tokens
            for name, n in (spec.configurations or {}).items():
                self._configurations[name] = self._configurations.get(name, 0) + n

    def on_step_done(self, stats, step_seconds: float, now: float) -> None:
        if self._window_start is None:
            self._window_start = now - step_seconds
        elapsed = now - self._window_start
        if elapsed >= self.interval and stats is not None:
            accept = self._committed / self._verify_steps if self._verify_steps else 0.0
            self.logger.info(format_stats_line(stats, accept, self._tokens / elapsed, self._configurations))
            self._reset(window_start=now)

    def on_idle(self, stats, now: float) -> None:
        self._reset(window_start=None)
