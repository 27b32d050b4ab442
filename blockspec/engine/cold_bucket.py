"""A cold batch bucket's first steps (the adaptive policy's, engine/spec_policy.py): which width it
must time next, and what stands in for the widths it skips.

Each bucket times its candidate widths on first use, the full width first (its steps observe
every draft position), then narrowest first, each only if it could win. Costs grow with the width
and with the batch, so an untimed width costs at least its widest timed narrower one and its
cost at a smaller bucket, and, with startup priors (CUDA graphs), what a timed width plus the
priors' difference says. A width whose expected tokens lose to the best timed rate even at that
bound (by over PRIOR_MARGIN for an estimate) is skipped, the bound standing in for its cost,
until a cost re-timing reaches it.
"""

from __future__ import annotations

from blockspec.engine.step_cost import StepCostModel

PRIOR_MARGIN = 0.1     # an untimed width estimated from priors is timed unless it loses by more
COLD_RECHECK = 8       # choices a bucket's bounds on its untimed widths are kept for (`bounds`)


class ColdBuckets:
    """The width-timing order of cold buckets, over one policy's cost model and widths."""

    def __init__(self, cost: StepCostModel, widths: list[int], full_width: int):
        self.cost, self.widths, self.full_width = cost, widths, full_width
        self._kept: dict[int, tuple] = {}    # bucket → (key, choices left, `bounds`)

    def costs_or_width_to_time(self, B: int, totals: dict[int, float],
                               variant=lambda: "sampled") -> tuple[dict, int | None]:
        """(the bucket's cost per width, None), or (its partial table, the next width it must
        time first): the full width
        (its steps observe every draft position, so acceptance is known early; unless a smaller
        bucket timed it: acceptance is then known, and it goes in turn), then the others
        narrowest first, each only if it could win: costs grow with the width and the batch, so
        an untimed one costs at least its widest timed narrower one and its cost at a smaller
        bucket (`floor_from_smaller`), and with startup priors (CUDA graphs) at
        least what a timed width plus the priors' difference says (`estimate_from_prior`); if
        at that cost its expected tokens lose to the best timed rate (by over PRIOR_MARGIN, for
        an estimate) it is skipped, the estimate standing in for its cost (a cost re-timing
        reaches it later). On a CPU at T = 1 a 16-wide step costs 8 plain ones at batch 16, and
        timing every width of a cold bucket took 8 s of a 20 s run; on the H100 a cold bucket
        of 64 rows spent 15 of a 50-step run timing widths. `variant()`: the batch's sampling
        variant (which priors apply), asked only here, on a cold bucket."""
        table = self.cost.table(B)
        costs = {w: table[w] for w in self.widths}
        if None not in costs.values():            # a warm bucket: every step but the first few
            return costs, None
        timed = {w: c for w, c in costs.items() if c is not None}
        kind = variant() if self.cost.priors else "sampled"
        floors, nearest, from_priors, from_neighbour = self.bounds(B, timed, kind)
        # Where the nearest timed bucket says the full width loses to plain by over the margin (a
        # CPU at T = 1: a batch shrinking through cold buckets as requests finish ran one
        # untimed 16-wide step at each, 5–9 plain steps apiece), plain is timed first and the
        # other widths estimated from it as they cost there; elsewhere the full width goes first:
        # its steps are also a look at every row's acceptance (without it, scripted runs where
        # speculation pays committed 3–8 % fewer tokens per second).
        loses_there = nearest is not None and (
            totals[self.full_width] / nearest[1] < (1.0 - PRIOR_MARGIN) * totals[1] / nearest[0])
        if costs[self.full_width] is None and floors[self.full_width] is None and not loses_there:
            return costs, self.full_width
        best_rate = max((totals[w] / c for w, c in timed.items()), default=None)
        for w in self.widths:
            if costs[w] is not None:
                continue
            bound = max((c for v, c in timed.items() if v < w), default=None)
            if floors[w] is not None:
                bound = max(bound or 0.0, floors[w])
            estimate = from_priors[w]
            if estimate is None and loses_there:
                estimate = from_neighbour[w]
            if estimate is not None:
                bound = max(bound or 0.0, estimate)
            margin = 1.0 - PRIOR_MARGIN if estimate is not None else 1.0
            if bound is None or best_rate is None or totals[w] / bound > best_rate * margin:
                return costs, w
            costs[w] = bound
        return costs, None

    def bounds(self, B: int, timed: dict[int, float], kind: str) -> tuple[dict, tuple | None, dict, dict]:
        """What bounds the untimed widths of a bucket, from the cost tables alone: per untimed
        width its floor at smaller buckets (`floor_from_smaller`) and its estimates from the
        priors and from the nearest bucket that timed plain and the full width, and that
        bucket's (plain, full width) costs (None: no bucket has). Kept for COLD_RECHECK
        choices while the bucket's timed widths and the sampling variant stay the same: a width
        skipped on these bounds can stay untimed for hundreds of steps, and recomputing them at
        each choice was half of a full choice's host time at 16 rows (62 of 132 µs inside a run
        on the 2-core CPU)."""
        bucket = self.cost.bucket_for(B)
        key = (kind, tuple(timed))
        cached = self._kept.get(bucket)
        if cached is not None and cached[0] == key and cached[1] > 0:
            self._kept[bucket] = (key, cached[1] - 1, cached[2])
            return cached[2]
        untimed = [w for w in self.widths if w not in timed]
        b = self.cost.nearest_with(B, (1, self.full_width))
        nearest = None if b is None else (self.cost.timed_at(b, 1), self.cost.timed_at(b, self.full_width))
        bounds = ({w: self.cost.floor_from_smaller(B, w) for w in untimed}, nearest,
                  {w: self.cost.estimate_from_prior(B, w, kind, timed) for w in untimed},
                  {w: self.cost.estimate_from_neighbour(B, w, timed) for w in untimed})
        self._kept[bucket] = (key, COLD_RECHECK - 1, bounds)
        return bounds
