"""Verify widths for seeded sampled requests: adaptive, yet a function of the request alone.

A seeded sampled request promises its stream back (alone or batched, as OpenAI's `seed` does).
Its uniforms per step are fixed, but which tokens they produce depends on the verify width, so
its width may depend only on what is the same every time the request runs: its own accept
history and its own step count — never on other rows, the batch, or measured timings.

So each seeded request keeps its own EMA of accepted drafts per width (`AcceptanceModel`'s
counterfactual observations, not seeded from batch-wide figures), folded in with a lag of one
step: the width of its step k reads the observations of steps ≤ k − 2, which an overlapped
engine (step k launched before step k − 1 is read) and a synchronous one have alike. It picks

    argmax_w (1 + E[w]) / PROXY_COST(w)

over the policy's candidate widths, with a fixed relative cost instead of the measured one:
a drafter pass plus a verify whose cost grows slowly with its width, as on the GPU fast path
(bench/results: the 8B shape's verify-16 ≈ 1.1 decode steps, its drafter ≈ 0.24). Every
`PROBE_EVERY`-th own step runs the full width, which observes every draft position, so a request
that went plain (which observes nothing) notices when its drafts turn good again. Before any
observation the prior is optimistic (every draft accepted): a request starts at the full width.

The row's width is a cap inside the batch's verify (`StepInputs.width_caps`): its tree is the
first nodes of the full tree, drawn with the same uniforms at any batch width, so the stream
repeats (tests/test_spec_adaptive.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blockspec.engine.acceptance import counterfactual_accepts, ema
from blockspec.engine.step_cost import best_width

DRAFT_COST = 0.25      # a drafter pass, in decode steps
NODE_COST = 0.01       # each verified node past the root, in decode steps
PROBE_EVERY = 16


def proxy_cost(width: int) -> float:
    """Relative cost of a step at `width` (plain = 1)."""
    return 1.0 if width == 1 else 1.0 + DRAFT_COST + NODE_COST * (width - 1)


@dataclass
class _Row:
    launched: int = 0                                    # own steps chosen so far
    pending: list = field(default_factory=list)          # (own step, path_nodes, ran_width), in order
    observed: int = 0                                    # own steps whose result arrived
    table: dict = field(default_factory=dict)            # width → EMA of accepted drafts


class SeededWidths:
    """Per seeded request: its next verify width, and what its steps accepted."""

    def __init__(self, widths: list[int], alpha: float = 0.3):
        ema(None, 0.0, alpha)    # validates alpha
        self.widths = sorted(set(widths))
        self.alpha = alpha
        self._rows: dict[str, _Row] = {}

    def next_width(self, request_id: str) -> int:
        """The width of this request's next step (counts it as launched)."""
        row = self._rows.setdefault(request_id, _Row())
        k = row.launched
        row.launched += 1
        while row.pending and row.pending[0][0] <= k - 2:
            _, nodes, ran = row.pending.pop(0)
            for w, n in counterfactual_accepts(nodes, self.widths, ran).items():
                row.table[w] = ema(row.table.get(w), float(n), self.alpha)
        if k % PROBE_EVERY == PROBE_EVERY - 1:
            return self.widths[-1]
        return best_width({w: 1.0 + row.table.get(w, float(w - 1)) for w in self.widths},
                          {w: proxy_cost(w) for w in self.widths})

    def observe(self, request_id: str, path_nodes: list[int], ran_width: int) -> None:
        """The result of this request's oldest unobserved step, run at `ran_width`."""
        row = self._rows.setdefault(request_id, _Row())
        if ran_width > 1:
            row.pending.append((row.observed, list(path_nodes), ran_width))
        row.observed += 1

    def forget(self, request_id: str) -> None:
        self._rows.pop(request_id, None)
