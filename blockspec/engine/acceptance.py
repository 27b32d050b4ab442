"""The acceptance model of the adaptive policy: expected accepted drafts per request and width.

For each request and candidate verify width w the model keeps an exponential moving average of
the drafts that a step at width w accepts. One step run at width W observes every w ≤ W
exactly (`counterfactual_accepts`): the target's walk samples the same tokens with the same
uniforms whatever the tree, and a prefix of the nodes keeps every ancestor, so the accepted path
at width w is the run's path up to its first node of index ≥ w. For a chain this is
min(accepted, w − 1): E[w] − E[w − 1] is the running accept rate of draft position w − 1, the
per-position accept/reject EMA. Widths above W are not observed by that step.

A new request starts from the batch-wide figures of its temperature class (greedy, T ≤ 0.5,
T ≤ 1, T > 1), themselves EMAs over every row's observations; before any observation the prior
is optimistic (every draft accepted), so the first steps speculate and measure.

A width a row's step did not reach is not observed, so a row parked at plain after a bad
stretch would keep its low figure until a probe: instead each unobserved width relaxes by
`relax` a step towards its class's batch-wide figure (which the other rows, and the row's own
long past, keep up to date), and the row returns to speculating on its own when that is better.
"""

from __future__ import annotations

from bisect import bisect_left


def ema(old: float | None, new: float, alpha: float) -> float:
    """One exponential-moving-average update; `old` None starts at `new`."""
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    return new if old is None else old + alpha * (new - old)


def counterfactual_accepts(path_nodes: list[int], widths: list[int], ran_width: int) -> dict[int, int]:
    """Accepted drafts each width w ≤ `ran_width` would have had, from the accepted path's node
    indices of a step run at `ran_width` (root excluded, in depth order). Node indices grow
    along a path (a child is numbered after its parent), so that is how many are below w."""
    if any(w < 1 for w in widths):
        raise ValueError(f"widths must be positive, got {widths}")
    return {w: bisect_left(path_nodes, w) for w in widths if w <= ran_width}


def temperature_class(params) -> str:
    """The batch-wide figure a request is seeded from."""
    if params.greedy:
        return "greedy"
    t = params.temperature
    return "t<=0.5" if t <= 0.5 else "t<=1" if t <= 1.0 else "t>1"


class AcceptanceModel:
    """Per request and per temperature class: width → EMA of accepted drafts."""

    def __init__(self, widths: list[int], alpha: float = 0.3, batch_alpha: float = 0.05, relax: float = 0.1):
        ema(None, 0.0, alpha)
        ema(None, 0.0, batch_alpha)   # validates both
        ema(None, 0.0, relax)
        if any(w < 1 for w in widths):
            raise ValueError(f"widths must be positive, got {widths}")
        self.widths = sorted(set(widths))
        self.alpha, self.batch_alpha, self.relax = alpha, batch_alpha, relax
        self._rows: dict[str, dict[int, float]] = {}
        self._batch: dict[str, dict[int, float]] = {}

    def expected(self, request_id: str, klass: str, width: int) -> float:
        """Expected accepted drafts of this request at `width` (not counting the bonus)."""
        for table in (self._rows.get(request_id), self._batch.get(klass)):
            if table is not None and width in table:
                return table[width]
        return float(width - 1)           # optimistic prior: measure before giving up

    def expected_totals(self, rows) -> dict[int, float]:
        """width → Σ over `rows` ((request_id, class) pairs) of 1 + expected accepted drafts:
        `expected` summed, in one pass (the policy's per-step host time)."""
        totals = dict.fromkeys(self.widths, float(len(rows)))
        for request_id, klass in rows:
            row, batch = self._rows.get(request_id) or {}, self._batch.get(klass) or {}
            for w in self.widths:
                totals[w] += row[w] if w in row else batch[w] if w in batch else float(w - 1)
        return totals

    def observe(self, request_id: str, klass: str, path_nodes: list[int], ran_width: int) -> None:
        self.observe_step([(request_id, klass, path_nodes, ran_width)])

    def observe_step(self, rows) -> None:
        """One step's rows, (request_id, class, path_nodes, ran_width) each: every row's EMA
        moves by α; a class's batch-wide EMA once per step, by 1 − (1 − β)^k towards the mean
        of its k rows (what k updates of β would do, but for their order)."""
        widths, alpha = self.widths, self.alpha
        sums: dict[str, tuple[list, list]] = {}         # class → (Σ accepted, rows) per width
        for request_id, klass, path_nodes, ran_width in rows:
            row = self._rows.get(request_id)
            if row is None:
                row = self._rows[request_id] = dict(self._batch.get(klass, {}))
            total, count = sums.get(klass) or sums.setdefault(klass, ([0.0] * len(widths), [0] * len(widths)))
            batch = self._batch.get(klass)
            for i, w in enumerate(widths):               # counterfactual_accepts, inlined (host time)
                if w > ran_width:                        # not observed: towards the batch's figure
                    old, target = row.get(w), batch.get(w) if batch else None
                    if old is not None and target is not None:
                        row[w] = old + self.relax * (target - old)
                    continue
                n = bisect_left(path_nodes, w)
                old = row.get(w)
                row[w] = float(n) if old is None else old + alpha * (n - old)
                total[i] += n
                count[i] += 1
        for klass, (total, count) in sums.items():
            batch = self._batch.setdefault(klass, {})
            for w, t, k in zip(widths, total, count):
                if k:
                    batch[w] = ema(batch.get(w), t / k, 1.0 - (1.0 - self.batch_alpha) ** k)

    def forget(self, request_id: str) -> None:
        self._rows.pop(request_id, None)
