"""The step-cost model of the adaptive policy: seconds per decode step, measured, not assumed.

A key is (batch bucket, verify width): the bucket is the CUDA-graph bucket a batch pads to
(`cuda_graphs.batch_buckets`; on the CPU the same buckets group the batch sizes), the width is
1 for plain decoding, k for a chain of length k, b + 1 for a tree of budget b. Every timed step
(the policy times steady-state steps only: `spec_policy.SpecPolicy.observe`) is one observation
of its key. The first `discard` observations of a key may be dropped (the policy drops none: a
width's first step after a switch, where compiles and first-use allocations land, is never
timed), and the estimate is the lower quartile of the last `window` — robust to the stalls (a
GC pause, another process on a shared CPU) that would drag a mean: such noise only ever adds
time. A key is measured once it holds `min_samples`; the policy times a bucket's widths on first
use (lazily) so that every number it compares was timed on this machine and this model, at this
batch bucket, and every steady step it then runs refines its figure.

The drafter's cost is inside every width ≥ 2 (DFlash drafts its whole block in one pass, whatever
length the policy keeps); `drafter_seconds` reports it as cost(2) − cost(1).
"""

from __future__ import annotations

from collections import deque

STALL_FACTOR = 50.0    # a timed step over this × its GPU prior is a stall, not a cost (`_stalled`)


def robust_seconds(samples) -> float:
    """The lower quartile of `samples` (seconds, non-empty), the sample at rank ⌊(n − 1) / 4⌋:
    never pulled towards a larger sample, so of two samples it is the smaller (interpolating,
    one 4.7 s stall beside a 0.6 ms step made a 1.2 s estimate on the H100, and a width that
    dear is re-timed only after thousands of steps)."""
    if not samples:
        raise ValueError("samples must be non-empty")
    return float(sorted(samples)[(len(samples) - 1) // 4])


class StepCostModel:
    """Per (bucket, width): the kept step times and their robust estimate."""

    def __init__(self, buckets: list[int], widths: list[int], discard: int = 1, min_samples: int = 3,
                 window: int = 15):
        if not buckets or sorted(buckets) != list(buckets) or buckets[0] < 1:
            raise ValueError(f"buckets must be increasing positive batch sizes, got {buckets}")
        if not widths or 1 not in widths:
            raise ValueError(f"widths must include 1 (plain decoding), got {widths}")
        for name, value, low in (("discard", discard, 0), ("min_samples", min_samples, 1), ("window", window, 1)):
            if value < low:
                raise ValueError(f"{name} must be at least {low}, got {value}")
        if window < min_samples:
            raise ValueError(f"window ({window}) must hold min_samples ({min_samples})")
        self.buckets, self.widths = list(buckets), sorted(set(widths))
        self.discard, self.min_samples, self.window = discard, min_samples, window
        self._seen: dict[tuple[int, int], int] = {}
        self._samples: dict[tuple[int, int], deque] = {}
        # Read every step for every width, changed by one key a step: kept, not recomputed.
        self._tables: dict[int, dict[int, float | None]] = {}    # bucket → width → `measured`
        self._stale: set[tuple[int, int]] = set()                 # kept entries with newer samples
        self._pending: dict[tuple[int, int], list[float]] = {}   # (bucket, width) → `observe_later`'s timings
        self._buckets: dict[int, int] = {}                        # batch size → `bucket_for`
        self.logged: set[int] = set()        # buckets whose table was logged
        # (bucket, width, sampling variant) → seconds of the step's GPU work alone, timed at
        # startup (`set_priors`): what a width not yet timed on this bucket is estimated from.
        self.priors: dict[tuple[int, int, str], float] = {}
        self._stall_limits: dict[tuple[int, int], float] = {}

    def bucket_for(self, batch_size: int) -> int:
        """The bucket a batch pads to; past the largest, the batch size itself."""
        bucket = self._buckets.get(batch_size)
        if bucket is None:
            if batch_size < 1:
                raise ValueError(f"batch_size must be positive, got {batch_size}")
            bucket = self._buckets[batch_size] = next((b for b in self.buckets if b >= batch_size), batch_size)
        return bucket

    def observe(self, batch_size: int, width: int, seconds: float) -> bool:
        """One timed step; True when it is the sample that makes its key measured (what a
        caller that logs full tables waits for, instead of scanning them every step)."""
        self._check(width, [seconds])
        key = (self.bucket_for(batch_size), width)
        self._seen[key] = self._seen.get(key, 0) + 1
        if self._seen[key] <= self.discard or self._stalled(key, seconds):
            return False
        return len(self._keep(key, [seconds])) == self.min_samples

    def _check(self, width: int, timings: list[float]) -> None:
        if width not in self.widths:
            raise ValueError(f"width {width} is not a candidate ({self.widths})")
        if not all(t >= 0 for t in timings):
            raise ValueError(f"seconds must be non-negative, got {timings}")

    def _keep(self, key: tuple[int, int], timings: list[float]) -> deque:
        """Add timings to a key's samples (its window); returns them."""
        samples = self._samples.get(key)
        if samples is None:
            samples = self._samples[key] = deque(maxlen=self.window)
        samples.extend(timings)
        if key[0] in self._tables:
            # Re-estimated when next read (`_refresh`): a plain stretch times every step and reads
            # the table every few, and the policy's host time is the issue-15 figure it runs in.
            self._stale.add(key)
        return samples

    def _refresh(self) -> None:
        """Re-estimate the kept tables' entries that have new samples."""
        for bucket, width in self._stale:
            self._tables[bucket][width] = self.measured(bucket, width)
        self._stale.clear()

    def observe_later(self, batch_size: int, width: int, seconds: float) -> None:
        """`observe`, filed when the model is next read (a plain stretch times every step and reads
        the table every few: issue 15's policy host time)."""
        key = (self.bucket_for(batch_size), width)
        timings = self._pending.get(key)
        if timings is None:
            self._pending[key] = [seconds]
        else:
            timings.append(seconds)

    def _file(self) -> None:
        """`observe` the pending timings, a key's in one pass (a quiet plain stretch leaves up to
        16 of one key: filing them one call each was most of a full choice's cost read). Keys
        are independent: only each one's order matters."""
        pending, self._pending = self._pending, {}
        for key, timings in pending.items():
            self._check(key[1], timings)
            seen = self._seen.get(key, 0)
            self._seen[key] = seen + len(timings)
            kept = [t for t in timings[max(self.discard - seen, 0):] if not self._stalled(key, t)]
            if kept:
                self._keep(key, kept)

    def _catch_up(self) -> None:
        """File the timings observed for later and re-estimate the kept entries they changed."""
        if self._pending:
            self._file()
        if self._stale:
            self._refresh()

    def _stalled(self, key: tuple[int, int], seconds: float) -> bool:
        """A timing over STALL_FACTOR × the step's GPU prior (its dearest variant) is not the
        step's cost but a stall inside its interval (a compile, a collection, the process
        descheduled): dropped. Without priors (CPU) every timing is kept."""
        limit = self._stall_limits.get(key)
        return limit is not None and seconds > limit

    def samples(self) -> dict[tuple[int, int], list[float]]:
        """(bucket, width) → the timings kept for its estimate (seconds, oldest first)."""
        self._catch_up()
        return {key: list(samples) for key, samples in self._samples.items()}

    def measured(self, batch_size: int, width: int) -> float | None:
        """Seconds per step timed at this key, or None until it holds `min_samples`."""
        if self._pending:
            self._file()
        samples = self._samples.get((self.bucket_for(batch_size), width))
        if samples is None or len(samples) < self.min_samples:
            return None
        return robust_seconds(samples)

    def estimate(self, batch_size: int, width: int) -> float | None:
        """Seconds per step at this batch's bucket, or None until it is timed. Never borrowed
        from another bucket: the widths' relative costs change with the batch (that change is
        what the policy exists for), so a scaled neighbour's table would keep the wrong width."""
        return self.measured(batch_size, width)

    def floor_from_smaller(self, batch_size: int, width: int) -> float | None:
        """A lower bound on an untimed width's cost at this batch's bucket: the most it costs at a
        smaller bucket (a larger batch's step does more work, never less). Not an estimate: it
        only lets a cold bucket skip a width that could not win even at that cost (on a CPU a
        16-wide step costs 13 plain ones at 16 rows, and timing it there took a short run's
        tenth)."""
        bucket, floor = self.bucket_for(batch_size), None
        for b in self.buckets:               # (a cold bucket asks every step: kept tables, no sorting)
            if b >= bucket:
                break
            t = self.timed_at(b, width)
            if t is not None and (floor is None or t > floor):
                floor = t
        return floor

    def set_priors(self, priors: dict[tuple[int, int, str], float]) -> None:
        """GPU seconds per (bucket, width, sampling variant) step, e.g. CUDA-graph replays timed at
        startup (`cuda_graphs.WidthGraphs.replay_seconds`). They never enter the table: a
        step's cost is its wall interval, host work included. They only estimate an untimed
        width from a timed one (`estimate_from_prior`)."""
        for (bucket, width, _), seconds in priors.items():
            if bucket not in self.buckets or width not in self.widths or not seconds > 0:
                raise ValueError(f"prior for bucket {bucket}, width {width}: {seconds} s is not a positive "
                                 f"time of a known bucket ({self.buckets}) and width ({self.widths})")
        self.priors = dict(priors)
        # (bucket, width) → the timing past which a step is a stall: STALL_FACTOR × its dearest
        # variant's prior (kept: asked every timed step).
        self._stall_limits = {}
        for (bucket, width, _), seconds in self.priors.items():
            key = (bucket, width)
            self._stall_limits[key] = max(self._stall_limits.get(key, 0.0), STALL_FACTOR * seconds)

    def estimate_from_prior(self, batch_size: int, width: int, variant: str,
                            timed: dict[int, float]) -> float | None:
        """An untimed width's cost: a timed width's wall time plus the GPU time the priors say
        the step adds (or saves) going from that width to this one, from the timed width
        nearest below (else above). None without priors for both. Additive, so the host's share
        (launch, commit) carries over unchanged: where overlapped host work hides part of the
        GPU's, this overstates a wider width's cost, and a re-timing corrects it."""
        bucket = self.bucket_for(batch_size)
        prior = self.priors.get((bucket, width, variant))
        if prior is None or not timed:
            return None
        base = _base_width(width, timed)
        base_prior = self.priors.get((bucket, base, variant))
        if base_prior is None:
            return None
        return max(timed[base] + prior - base_prior, 1e-9)

    def nearest_with(self, batch_size: int, widths: tuple[int, ...]) -> int | None:
        """The bucket nearest this batch's (by ratio, the larger on a tie), other than its own,
        that has timed every one of `widths`; None if none has."""
        bucket = self.bucket_for(batch_size)
        others = sorted((b for b in self.buckets if b != bucket), key=lambda b: (max(b, bucket) / min(b, bucket), -b))
        return next((b for b in others if all(self.timed_at(b, w) is not None for w in widths)), None)

    def estimate_from_neighbour(self, batch_size: int, width: int, timed: dict[int, float]) -> float | None:
        """An untimed width's cost at a cold bucket: a timed width's cost here (the nearest
        below, else above) times the two widths' cost ratio at the nearest bucket that timed
        both. Only to decide whether the width is worth timing, never as a measurement (the
        ratio moves with the batch; the policy takes it with `cold_bucket.PRIOR_MARGIN`, and a re-timing
        replaces it)."""
        if not timed:
            return None
        base = _base_width(width, timed)
        b = self.nearest_with(batch_size, (width, base))
        return None if b is None else timed[base] * self.timed_at(b, width) / self.timed_at(b, base)

    def timed_at(self, bucket: int, width: int) -> float | None:
        """Seconds per step at `bucket` (a bucket size) and `width`, or None until timed."""
        self._catch_up()
        table = self._tables.get(bucket)
        return table.get(width) if table is not None else self.measured(bucket, width)

    def format_priors(self) -> str:
        """The priors as one line per bucket (ms), for the startup log."""
        rows = {}
        for (bucket, width, variant), seconds in sorted(self.priors.items()):
            rows.setdefault((bucket, variant), []).append(f"w{width} {seconds * 1e3:.3f}")
        return "; ".join(f"bucket {b} {v}: {', '.join(cells)}" for (b, v), cells in rows.items())

    def drafter_seconds(self, batch_size: int) -> float | None:
        """The drafter's share of a step: cost(width 2) − cost(width 1), when both are measured."""
        one, two = self.estimate(batch_size, 1), self.estimate(batch_size, 2)
        return None if one is None or two is None else two - one

    def table(self, batch_size: int) -> dict[int, float | None]:
        """width → seconds per step timed at this batch's bucket."""
        bucket = self.bucket_for(batch_size)
        self._catch_up()
        table = self._tables.get(bucket)
        if table is None:
            table = self._tables[bucket] = {w: self.measured(batch_size, w) for w in self.widths}
        return dict(table)

    def format_table(self, batch_size: int) -> str:
        cells = ", ".join(f"w{w} {t * 1e3:.2f} ms" if t is not None else f"w{w} -"
                          for w, t in self.table(batch_size).items())
        drafter = self.drafter_seconds(batch_size)
        extra = f"; drafter ≈ {drafter * 1e3:.2f} ms" if drafter is not None else ""
        return f"step cost at batch bucket {self.bucket_for(batch_size)}: {cells}{extra}"


def _base_width(width: int, timed: dict[int, float]) -> int:
    """The timed width an untimed `width`'s estimate starts from: the nearest below, else the
    narrowest above."""
    below = [w for w in timed if w < width]
    return max(below) if below else min(timed)


def monotone_costs(costs: dict[int, float]) -> dict[int, float]:
    """Each width's cost raised to the most any narrower width costs: a wider verify does all of
    a narrower one's work and more (more tokens through the target, a longer draft, more to
    commit), so a table saying otherwise holds noise (on the H100 at 64 rows, T = 1, a churning
    run timed chain 8 at 1.28 ms and plain at 1.47, and the policy ran chain 8 where it lost)."""
    out, floor = {}, 0.0
    for w in sorted(costs):
        floor = out[w] = max(costs[w], floor)
    return out


def best_width(committed: dict[int, float], costs: dict[int, float]) -> int:
    """The width maximising committed[w] / costs[w] (expected tokens per second of the batch);
    ties go to the narrower. Width 1 must be a candidate."""
    if 1 not in costs:
        raise ValueError("costs must include width 1 (plain decoding)")
    if any(t <= 0 for t in costs.values()):
        raise ValueError(f"costs must be positive, got {costs}")
    best, best_rate = 1, None
    for w in sorted(costs):
        rate = committed[w] / costs[w]
        if best_rate is None or rate > best_rate * (1 + 1e-9):
            best, best_rate = w, rate
    return best
