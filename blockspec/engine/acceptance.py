"""The acceptance model of the adaptive policy: expected accepted drafts per request and width.
(Trees'. Chains have per-position rates, which every step teaches: `engine/chain_acceptance.py`.)

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

Plain stretches: a plain step (width 1) observes only width 1, which accepts nothing (its figure
is 0 once observed), and relaxes every wider figure towards its class's, which no plain step
moves. So k plain steps of one batch in a row take each figure o to b + (1 − relax)^k (o − b):
the model keeps the stretch (`_Stretch`) and writes that once, when the batch changes or anything
else reads or writes the figures, and the batch's totals meanwhile come from two sums (a few
float operations a step instead of array passes over [B, W]: issue 15's plain-step host time).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass
from itertools import chain

import numpy as np


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


@dataclass
class _Stretch:
    """Plain steps of one batch in a row, after the first: `steps` of them since `old` was written."""

    ids: list[str]
    idx: np.ndarray          # [B] the rows' table rows
    old: np.ndarray          # [B, W] their figures when the stretch began
    base: np.ndarray         # [B, W] what each figure relaxes towards (its class's; itself if either is missing)
    # A read after `steps` is `read + f · decay`, f = (1 − relax)^steps, missing figures read as
    # their class's or the prior; per-width figures keep the batch's sums ([W]: B + Σ over rows,
    # Σ over rows of old − base where both are known), per-position rates each row's ([B][P]).
    read: list
    decay: list
    steps: int = 0

    def relaxed(self, relax: float) -> np.ndarray:
        """`[B, W]` the figures now (a missing figure stays missing)."""
        new = self.base + (1.0 - relax) ** self.steps * (self.old - self.base)
        np.copyto(new, self.old, where=np.isnan(new))
        return new


class AcceptanceModel:
    """Per request and per temperature class: width → EMA of accepted drafts.

    The figures live in one table `[rows, W]` (W candidate widths, NaN: not observed yet), a row
    per request and per class (its batch-wide figures), so that a step's rows update in a few
    array operations: the policy runs this every step, where a Python loop over rows and widths
    cost ≈ 2 µs a row (0.15 ms at 64 rows on a 2-core CPU, against a 2–3 ms GPU step). Batches
    of at most `scalar_rows` rows take a per-row path instead; both compute the same
    floating-point operations in the same order as that loop did, so the figures are equal bit
    for bit (tests/engine/test_spec_policy_equivalence.py). The threshold, 6 rows, is where a
    loop of the policy's calls alone puts numpy ahead (`bench/policy_host_time.py`). Inside a
    real run on the 2-core CPU, between the engine's tensor ops, the per-row path was the faster
    up to 64 rows: a speculative step's `observe_step` 80 against 160 µs at 16 rows, 115 against
    183 µs at 64 (`bench/policy_live_time.py --temperature 0 --pin-width 16 --scalar-rows 6|64
    --split`); where a GPU's host stands between the two is to be measured there."""

    def __init__(self, widths: list[int], alpha: float = 0.3, batch_alpha: float = 0.05, relax: float = 0.1,
                 scalar_rows: int = 6):
        ema(None, 0.0, alpha)
        ema(None, 0.0, batch_alpha)   # validates both
        ema(None, 0.0, relax)
        if any(w < 1 for w in widths):
            raise ValueError(f"widths must be positive, got {widths}")
        self.widths = sorted(set(widths))
        self.alpha, self.batch_alpha, self.relax = alpha, batch_alpha, relax
        self.scalar_rows = scalar_rows
        self._index = {w: i for i, w in enumerate(self.widths)}
        self._w = np.array(self.widths, dtype=np.float64)        # [W]
        self._prior = self._w - 1.0                               # [W] optimistic: every draft accepted
        self._prior_list = self._prior.tolist()
        self._table = np.full((16, len(self.widths)), np.nan)     # [rows, W]
        self._fallback = list(range(16))      # per table row: the class row its missing figures come from
        self._free = list(range(15, -1, -1))
        self._rows: dict[str, int] = {}       # request → its table row
        self._classes: dict[str, int] = {}    # class → its table row (a class falls back to itself)
        self._seen_at: dict[int, tuple] = {}  # ran width → `_seen`
        self._live: Counter = Counter()       # class row → requests with a row
        # The last batch's (request ids, rows, `[B]` rows as an index): consecutive steps mostly
        # run the same requests, and resolving 64 ids costs ≈ 2.5 µs; cleared when rows change.
        self._last_batch: tuple[list[str], list[int], np.ndarray] | None = None
        self._stretch: _Stretch | None = None

    # ---- table rows ---------------------------------------------------------------------------
    def _new_row(self) -> int:
        if not self._free:
            n = len(self._table)
            self._table = np.concatenate([self._table, np.full_like(self._table, np.nan)])
            self._fallback += range(n, 2 * n)
            self._free = list(range(2 * n - 1, n - 1, -1))
        return self._free.pop()

    def _class_row(self, klass: str) -> int:
        row = self._classes.get(klass)
        if row is None:
            row = self._classes[klass] = self._new_row()
            self._table[row] = np.nan
            self._fallback[row] = row
        return row

    def _request_row(self, request_id: str, klass: str) -> int:
        """The request's row, made on its first observation from its class's figures then."""
        row = self._rows.get(request_id)
        if row is None:
            batch = self._class_row(klass)
            row = self._rows[request_id] = self._new_row()
            self._table[row] = self._table[batch]
            self._fallback[row] = batch
            self._live[batch] += 1
            self._last_batch = None
        return row

    # ---- reading --------------------------------------------------------------------------------
    def expected(self, request_id: str, klass: str, width: int) -> float:
        """Expected accepted drafts of this request at `width` (not counting the bonus)."""
        self._settle()
        i = self._index.get(width)
        if i is not None:
            for row in (self._rows.get(request_id), self._classes.get(klass)):
                if row is not None and not math.isnan(value := self._table[row, i]):
                    return float(value)
        return float(width - 1)           # optimistic prior: measure before giving up

    def expected_totals(self, request_ids: list[str], klass_of) -> dict[int, float]:
        """width → Σ over the rows of 1 + expected accepted drafts (`expected` summed, rows in
        order); `klass_of(i)`: row i's class, asked only for requests not observed yet."""
        stretch = self._stretch
        if stretch is not None:
            if stretch.ids == request_ids:       # o → b + f (o − b) summed over the rows
                f = (1.0 - self.relax) ** stretch.steps
                return dict(zip(self.widths, [b + f * d for b, d in zip(stretch.read, stretch.decay)]))
            self._settle()
        B = len(request_ids)
        rows, idx = self._read_rows(request_ids, klass_of)
        if B <= self.scalar_rows:
            totals = [float(B)] * len(self.widths)
            for row in rows:
                totals = [t + v for t, v in zip(totals, self._figures(row))]
            return dict(zip(self.widths, totals))
        if idx is None:
            idx = np.fromiter(rows, np.intp, B)
        values = self._table.take(idx, 0)                          # [B, W]
        values[0] += B
        # A running sum, row after row: the same additions in the same order as the scalar path.
        totals = np.add.accumulate(values, 0)[-1].tolist()
        if math.isnan(sum(totals)):          # some figure not observed (rare): its class's, or the prior
            values = self._filled(self._table.take(idx, 0), rows)
            values[0] += B
            totals = np.add.accumulate(values, 0)[-1].tolist()
        return dict(zip(self.widths, totals))

    def _read_rows(self, request_ids: list[str], klass_of) -> tuple[list[int], np.ndarray | None]:
        """The table rows a read of these requests takes (a request not observed yet: its class's)
        and, when every request has its own, their index."""
        last = self._last_batch
        if last is not None and last[0] == request_ids:
            return last[1], last[2]
        rows = list(map(self._rows.get, request_ids))     # C-level: a Python loop costs ≈ 0.1 µs a row
        if None in rows:                                  # not observed yet: their class's figures
            return [self._class_row(klass_of(i)) if row is None else row for i, row in enumerate(rows)], None
        return rows, self._remember(request_ids, rows)

    def _filled(self, values: np.ndarray, rows: list[int]) -> np.ndarray:
        """`values` `[B, W]` (these rows' figures) with the missing ones taken from each row's
        class, then the prior (`_figures` in array form), in place."""
        batch = self._table.take(self._classes_of(rows), 0)
        np.copyto(values, np.where(np.isnan(batch), self._prior, batch), where=np.isnan(values))
        return values

    def _figures(self, row: int) -> list[float]:
        """A table row's figures with the missing ones taken from its class, then the prior."""
        values = self._table[row].tolist()
        if math.isnan(sum(values)):                               # some figure is NaN (not observed)
            batch = self._table[self._fallback[row]].tolist()
            values = [v if v == v else b if b == b else p for v, b, p in zip(values, batch, self._prior_list)]
        return values

    # ---- learning -------------------------------------------------------------------------------
    def observe(self, request_id: str, klass: str, path_nodes: list[int], ran_width: int) -> None:
        self.observe_step([request_id], lambda i: klass, [path_nodes], ran_width)

    def observe_step(self, request_ids: list[str], klass_of, path_nodes: list[list[int]], ran_width) -> None:
        """One step's rows (distinct requests; `klass_of(i)`: row i's class, asked for requests
        seen for the first time; `ran_width`: the step's width, or one per row): every row's EMA
        moves by α at the widths the step observed (`counterfactual_accepts`) and relaxes towards
        its class's batch-wide figure at the others; a class's batch-wide EMA moves once per
        step, by 1 − (1 − β)^k towards the mean of its k rows (what k updates of β would do, but
        for their order)."""
        B = len(request_ids)
        if B == 0:
            return
        plain = ran_width == 1 and isinstance(ran_width, int)
        if plain and self._stretch is not None and self._stretch.ids == request_ids:
            self._stretch.steps += 1
            return
        self._settle()
        last = self._last_batch
        if last is not None and last[0] == request_ids:
            rows, idx = last[1], last[2]
        else:
            rows = list(map(self._rows.get, request_ids))
            if None in rows:
                rows = [self._request_row(r, klass_of(i)) if row is None else row
                        for i, (r, row) in enumerate(zip(request_ids, rows))]
            idx = self._remember(request_ids, rows)
        self._observe(rows, idx, path_nodes, ran_width)
        if plain:
            self._begin_stretch(request_ids, rows, idx)

    def _observe(self, rows: list[int], idx: np.ndarray, path_nodes: list[list[int]], ran_width) -> None:
        """Move the step's rows' figures (and their classes') by what it observed."""
        if len(rows) <= self.scalar_rows:
            self._observe_rows(rows, path_nodes, [ran_width] * len(rows) if isinstance(ran_width, int) else ran_width)
        else:
            self._observe_table(rows, idx, path_nodes, ran_width)

    def in_stretch(self, request_ids: list[str]) -> bool:
        """Whether a plain stretch of exactly these requests is running."""
        stretch = self._stretch
        return stretch is not None and stretch.ids == request_ids

    def extend_stretch(self, request_ids: list[str]) -> bool:
        """`observe_step` of a plain step of the current stretch's batch (what it would do there,
        without its checks); False when there is no stretch of exactly these requests."""
        if not self.in_stretch(request_ids):
            return False
        self._stretch.steps += 1
        return True

    def _begin_stretch(self, request_ids: list[str], rows: list[int], idx: np.ndarray) -> None:
        """After a plain step: the next plain steps of this batch only count (module docstring).
        A figure relaxes only where it and its class's are both known; a total reads a missing
        figure as its class's, or the prior (as `expected_totals`), constant while it lasts."""
        old, klass = self._table.take(idx, 0), self._table.take(self._classes_of(rows), 0)
        both = ~(np.isnan(old) | np.isnan(klass))
        base = np.where(both, klass, old)
        read = np.where(np.isnan(old), np.where(np.isnan(klass), self._prior, klass), base)
        self._stretch = _Stretch(list(request_ids), idx, old, base,
                                 *self._stretch_terms(read, np.where(both, old - klass, 0.0)))

    def _stretch_terms(self, read: np.ndarray, decay: np.ndarray) -> tuple[list, list]:
        """What a stretch keeps of its rows' `[B, W]` reads at f = 0 and decaying parts: their
        sums over the rows, the batch's totals being sums of the figures."""
        return (read.sum(0) + len(read)).tolist(), decay.sum(0).tolist()

    def _settle(self) -> None:
        """Write a plain stretch's relaxed figures into the table and end it."""
        stretch, self._stretch = self._stretch, None
        if stretch is not None and stretch.steps:
            self._table[stretch.idx] = stretch.relaxed(self.relax)

    def _remember(self, request_ids: list[str], rows: list[int]) -> np.ndarray:
        """Keep a batch of observed requests' rows (`_last_batch`); returns their index."""
        idx = np.fromiter(rows, np.intp, len(rows))
        self._last_batch = (list(request_ids), rows, idx)
        return idx

    def _observe_rows(self, rows: list[int], path_nodes: list[list[int]], ran_widths: list[int]) -> None:
        """`observe_step` a row at a time (few rows)."""
        widths, alpha, relax, table = self.widths, self.alpha, self.relax, self._table
        sums: dict[int, tuple[list, list]] = {}        # class row → (Σ accepted, rows) per width
        for row, path, ran in zip(rows, path_nodes, ran_widths):
            klass = self._fallback[row]
            old, batch = table[row].tolist(), table[klass].tolist()
            total, count = sums.setdefault(klass, ([0.0] * len(widths), [0] * len(widths)))
            new = []
            for i, (w, o, b) in enumerate(zip(widths, old, batch)):
                if w > ran:                                  # not observed: towards the batch's figure
                    new.append(o + relax * (b - o) if o == o and b == b else o)
                    continue
                n = bisect_left(path, w)
                new.append(float(n) if o != o else o + alpha * (n - o))
                total[i] += n
                count[i] += 1
            table[row] = new
        for klass, (total, count) in sums.items():
            self._observe_class(klass, total, count)

    def _observe_table(self, rows: list[int], idx: np.ndarray, path_nodes: list[list[int]], ran_width) -> None:
        """`observe_step` in array operations over the step's rows (`idx`: `[B]` their rows as an
        index; same arithmetic as `_observe_rows`, elementwise)."""
        B, table = len(rows), self._table
        per_row = not isinstance(ran_width, int)
        if per_row:
            seen = self._w <= np.array(ran_width)[:, None]          # [B, W] widths observed
            every, rate = seen.all(), np.where(seen, self.alpha, self.relax)
        else:
            seen, every, rate, _ = self._seen(ran_width)             # [W]
        # A plain step (width 1) accepts nothing: its [B, W] zeros without a pass over the paths.
        accepted = self._accepted(path_nodes) if per_row or ran_width > 1 else np.zeros((B, len(self.widths)))
        old = table.take(idx, 0)                                    # [B, W]
        target = accepted if every else np.where(seen, accepted, table.take(self._classes_of(rows), 0))
        new = old + rate * (target - old)
        if math.isnan(new.sum()):      # never observed (takes the count), or nothing to relax towards
            np.copyto(new, np.where(seen, target, old), where=np.isnan(new))
        table[idx] = new
        if per_row:
            accepted = np.where(seen, accepted, 0.0)
        # Usually one class: every live request's (no pass over the rows to know it).
        classes = set(self._live) if len(self._live) == 1 else set(map(self._fallback.__getitem__, rows))
        of = None if len(classes) == 1 else self._classes_of(rows)
        for klass in classes:
            mine = slice(None) if of is None else of == klass
            total = accepted[mine].sum(0).tolist()          # counts: exact in any order
            n = B if of is None else int(mine.sum())
            count = seen[mine].sum(0).tolist() if per_row else [n if s else 0 for s in self._seen(ran_width)[3]]
            self._observe_class(klass, total, count)

    def _seen(self, ran_width: int) -> tuple[np.ndarray, bool, np.ndarray, list[bool]]:
        """(`[W]` widths a step at `ran_width` observes, whether that is all, `[W]` their EMA
        rates: α observed, `relax` not, the first as a list), kept per width (a handful)."""
        seen = self._seen_at.get(ran_width)
        if seen is None:
            mask = self._w <= ran_width
            seen = self._seen_at[ran_width] = (mask, bool(mask.all()), np.where(mask, self.alpha, self.relax),
                                               mask.tolist())
        return seen

    def _classes_of(self, rows: list[int]) -> np.ndarray:
        """`[len(rows)]` the class row of each table row."""
        return np.fromiter(map(self._fallback.__getitem__, rows), np.intp, len(rows))

    def _accepted(self, path_nodes: list[list[int]]) -> np.ndarray:
        """`[B, W]` accepted drafts each width would have had (`counterfactual_accepts` at every
        width). Node indices grow along a path, so a path of L nodes sums to at least
        L (L + 1) / 2, with equality for 1 … L only: if the batch's sums meet that bound, every
        path is a chain's, where width w accepts min(L, w − 1) (C-level sums, no Python loop)."""
        B = len(path_nodes)
        lens = np.fromiter(map(len, path_nodes), np.int64, B)
        if sum(chain.from_iterable(path_nodes)) * 2 == int(lens @ (lens + 1)):
            return np.minimum(lens[:, None], self._prior)
        nodes = np.fromiter(chain.from_iterable(path_nodes), np.int64, int(lens.sum()))
        below = np.zeros((len(nodes) + 1, len(self.widths)))      # running count of nodes < w
        np.cumsum(nodes[:, None] < self._w, 0, out=below[1:])
        ends = np.cumsum(lens)
        return below[ends] - below[ends - lens]

    def _observe_class(self, row: int, total: list[float], count: list[int]) -> None:
        """Move a class's batch-wide figures towards the mean of its k rows observed this step:
        `ema` by 1 − (1 − β)^k, inlined (host time)."""
        figures, keep = self._table[row].tolist(), 1.0 - self.batch_alpha
        for i, (t, k) in enumerate(zip(total, count)):
            if k:
                old, new = figures[i], t / k
                figures[i] = new if old != old else old + (1.0 - keep ** k) * (new - old)
        self._table[row] = figures

    def forget(self, request_id: str) -> None:
        self._settle()
        row = self._rows.pop(request_id, None)
        if row is not None:
            self._free.append(row)
            self._last_batch = None
            self._live[self._fallback[row]] -= 1
            if not self._live[self._fallback[row]]:
                del self._live[self._fallback[row]]
