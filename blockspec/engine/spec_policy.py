"""The adaptive speculation policy: each decode step's verify width, from measured cost and acceptance.

Candidates are widths w: 1 is plain decoding (no drafter run), a chain's w is its length (root
+ w − 1 drafts), a tree's w is its budget + 1 (`truncate_tree` cuts the proposer's tree to its
first w nodes, which is the tree of that budget). The step picks

    argmax_w  Σ_rows (1 + E_row[w]) / cost(bucket, w)

— expected committed tokens per second of the whole batch (`best_width`), with plain always
a candidate, so on the measured figures a step never chooses to be slower than plain decoding.
E comes from `engine/chain_acceptance.py` for chains and `engine/acceptance.py` for trees, cost
from `engine/step_cost.py`.

Per batch, not per row: the verify is a padded `[B, W]` forward, so its cost depends on the
batch's width only and a row cut to width 1 inside a wider batch saves nothing; every row gets
w. (`SpeculativeStep.run(row_widths=…)` does run mixed batches — rows that speculate and rows
that decode plainly in one verify — for an engine whose verify cost follows the rows' widths.)

Lossless: the width is chosen before the step from past steps only (timings and accept counts
of steps already committed); this step's target output is never read to pick it, and every
verifier is exact for any tree it is given (`SpeculativeStep.draft`). Seeds: a seeded sampled
row's tokens do not depend on the width at all (it samples by the exponential race,
`blockspec/seeded_sampling.py`), so its stream repeats whatever this policy chooses.

Exploration: a bucket's first steps time the candidate widths (lazily, the full width first,
then narrowest first, each until it holds `min_samples` timings; one that could not win even at
its narrower neighbour's cost is skipped: engine/cold_bucket.py). Then three kinds of
exploration, paid from one credit that accrues PROBE_BUDGET of each step's cost, so that together
they add at most that share of the time:
- acceptance probes: while the choice is narrower than the full width, at least `probe_interval`
  steps apart (doubling, up to `max_probe_interval`, while probes change nothing) and when the
  credit covers it, one step runs the full width, which observes every draft position (a plain
  step observes none), so a request whose drafts turn good again is noticed; at the full width
  every step observes everything;
- cost re-timings: at least `retime_interval` steps apart and when the credit covers it, two
  steps run another candidate in turn (the second is timed, below), three when the engine
  overlaps steps (the middle one is timed: the last one's interval holds the next width's
  launch), so one unlucky timing cannot lock a width out;
- first looks: a batch holding a request never run at the full width runs it once, so a new
  request's own acceptance decides, not only its class's figure: in batches of at most
  `LOOK_FREE_ROWS` always (not from the credit) while looks change the choice often enough to
  pay (`LOOK_WORTH`), else when the credit covers it.
Probes and re-timings come at most MAX_PROBE_SPACING steps apart whatever the credit (a figure
holding a stall is re-measured). The credit's rate is scaled by `explore_scale`, halved (to
MIN_EXPLORE_SCALE) whenever a probe or look leaves the next choice unchanged and whole again
when one changes it: exploration costs little where it keeps confirming plain (T = 1 on a CPU)
and stays quick where requests differ.

Switching into speculation: after plain steps, a drafting step first writes the deferred drafter
context (`proposers.DeferredContext`), work no steady step holds and so no step timing sees (the
step after a switch is not timed). While a write is pending, the choice charges it to every
speculative width (`context_pending`, `observe_flush`: the lower quartile of the last writes'
host times); once speculating there is none. So a width must beat plain by the write's cost to
leave plain, and a batch whose figures hover near break-even (T = 1 at one row on the H100: a
row's acceptance estimate is a few steps' noise) does not flip to a chain and back, paying the
write each time, where a steady chain would barely pay.

Quiet stretches: after a plain choice that explored nothing, the same batch's next steps (at
most QUIET_STEPS) repeat plain without recomputing the choice, until the soonest step a probe, a
re-timing or a first look still waiting for the credit could be due (its step count and its
credit: `_steps_until`), the counters and the credit advancing as the full choice would advance
them; such a step's `observe` only files its timing and counts the acceptance model's stretch. At T = 1, where nearly every step is plain, this cuts the policy's host
time; on an adversary's run, requests joining or not, the widths are the same step for step.
After a speculative choice the next SPEC_QUIET_STEPS steps of the batch repeat it the same way
(each still observed in full: the acceptance model learns from every step), so a change of
acceptance moves the choice at most that many steps late. On the H100 the policy's host time
was exposed at c = 16, T = 0 (338 µs a step, the adaptive step 0.21 ms longer than the static
chain 16's at nearly the same widths: gpu_session_s); replayed, 4 steps gave 0.98–0.99× the
best static width at c = 1 (0.99–1.0 without) and 0.99 at c = 16 (0.95–0.99 without).

Timing: a step costs the time from the end of the previous step's commit to the end of its own
— counted only when the previous step ran at the same width and batch bucket with nothing in
between (a prefill calls `interrupt`, and so does a drain: a step read before anything was
launched after it holds only the rest of its wait), and, overlapped, when the step launched
during its interval runs at that width too (a probe's launch, and the drafter-context flush before it, would
otherwise be charged to the plain step before it). In that steady state the interval is the step's whole
cost whatever the engine overlaps: the host's launch and commit, and the wait for the GPU. A
step after a switch is not timed: its interval holds its neighbour's work (an overlapped
interval holds the previous step's commit and the next one's launch). This replaced a model of
the pieces (host time less the neighbours' commits, against CUDA-event GPU times): it needs no
events and no assumption about which work belongs to which step, at the price of a second step
per re-timing.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, deque
from operator import attrgetter

from blockspec.engine.acceptance import AcceptanceModel, ema, temperature_class
from blockspec.engine.chain_acceptance import ChainAcceptance
from blockspec.engine.cold_bucket import ColdBuckets
from blockspec.engine.config import SPEC_POLICIES
from blockspec.engine.sequence import Status
from blockspec.engine.split_acceptance import SplitAcceptance
from blockspec.engine.step_cost import StepCostModel, best_width, monotone_costs, robust_seconds
from blockspec.sampling import sampling_variant

log = logging.getLogger("blockspec.spec_policy")
_request_id, _status = attrgetter("request_id"), attrgetter("status")

LADDER = (2, 4, 8, 16, 32, 64, 128)   # few widths: each is timed per bucket, and captured on CUDA
PROBE_BUDGET = 0.03    # the most of the step time exploration (probes, re-timings, looks) may add
MIN_EXPLORE_SCALE = 1 / 8   # the budget's floor while probes and looks keep changing nothing
LOOK_WORTH = 0.1       # first looks that changed the choice this often are run without the budget …
LOOK_FREE_ROWS = 2     # … in batches this small (a look runs the whole batch wide, for one request)
MAX_PROBE_SPACING = 512   # steps: probes and re-timings come at least this often
QUIET_STEPS = 16       # plain steps of an unchanged batch that repeat the last choice unrecomputed
SPEC_QUIET_STEPS = 4    # the same after a speculative choice (which every step still teaches)


def candidate_widths(full_width: int) -> list[int]:
    """Plain, a ladder of widths below the method's, and the method's own."""
    if full_width < 1:
        raise ValueError(f"full_width must be positive, got {full_width}")
    return sorted({1, full_width} | {w for w in LADDER if w < full_width})


def config_name(width: int, builds_trees: bool) -> str:
    """How a width is reported (metrics, logs, `spec_decoding`)."""
    if width == 1:
        return "plain"
    return f"tree{width - 1}" if builds_trees else f"chain{width}"


def out_of_order(costs: dict[int, float]) -> set[int]:
    """The widths timed dearer than some wider width, and those timed cheaper than some narrower
    one (one pass each way: the policy asks at every full plain choice)."""
    ordered = sorted(costs)
    suspects, dearest = set(), float("-inf")
    for w in ordered:                      # cheaper than a narrower one
        if costs[w] < dearest:
            suspects.add(w)
        dearest = max(dearest, costs[w])
    cheapest = float("inf")
    for w in reversed(ordered):            # dearer than a wider one
        if costs[w] > cheapest:
            suspects.add(w)
        cheapest = min(cheapest, costs[w])
    return suspects


class SpecPolicy:
    """Chooses each decode step's width and learns from the steps run (one per engine)."""

    def __init__(self, mode: str, full_width: int, builds_trees: bool, buckets: list[int],
                 probe_interval: int = 8, max_probe_interval: int = 16, retime_interval: int = 64,
                 greedy_chains: bool = False):
        """`greedy_chains`: greedy rows draft chains and sampled rows trees (DFlash with
        `sampled_trees`): each row's acceptance from its shape's model (`SplitAcceptance`)."""
        if mode not in SPEC_POLICIES:
            raise ValueError(f"spec_policy must be one of {', '.join(SPEC_POLICIES)}, got {mode!r}")
        self.mode, self.full_width, self.builds_trees = mode, full_width, builds_trees
        self.widths = candidate_widths(full_width) if mode == "adaptive" else [full_width]
        self._widest_first = sorted(self.widths, reverse=True)
        # No sample discarded: a width's first step after a switch is never timed (`observe`),
        # which is where compiles and first-use allocations land.
        self.cost = StepCostModel(buckets, sorted(set(self.widths) | {1}), discard=0, min_samples=2)
        # Chains: per-position rates, which every step teaches (engine/chain_acceptance.py); trees:
        # per-width figures, observed up to the width run.
        self.greedy_chains = greedy_chains
        self.acceptance = (SplitAcceptance(self.widths) if greedy_chains
                           else AcceptanceModel(self.widths) if builds_trees else ChainAcceptance(self.widths))
        self.cold = ColdBuckets(self.cost, self.widths, full_width)
        self.min_probe, self.max_probe = probe_interval, max_probe_interval
        self.probe_interval, self._since_probe, self._before_probe = probe_interval, 0, None
        self._probes = 0                           # cost probes run: which candidate the next one times
        self.retime_interval, self._steps = retime_interval, 0
        self._retime_next: tuple[int, int] | None = None   # a cost re-timing's width, steps left
        # Overlapped (set by the engine), a step is timed only when the next one launched at its
        # width: a re-timing of two steps was never timed (on the H100 plain's figure went stale
        # at a cold bucket's value, 1.5× its steady cost, and chain 4 won at T = 1 where it loses).
        self.overlapped = False
        self.choices: Counter = Counter()         # config name → steps (logged with the cost table)
        self._names: dict[int, str] = {}          # width → `name(width)`, kept (asked every step)
        self.host_seconds = 0.0                   # the policy's own time (choose + observe)
        self._last: tuple[float, tuple[int, int]] | None = None   # (time, (bucket, width)) of the last step
        # First looks: requests not yet observed at the full width.
        self._looked: set[str] = set()
        self._batch_ids: list[str] | None = None
        self._look_wanted = False
        self._credit = 0.0           # seconds of exploration the budget has accrued (`_choose`)
        self.look_worth = 1.0        # EMA (0.2) of whether a first look changed the next choice
        self._looking = False        # the step in `_before_probe` was a first look
        # Exploration's share of PROBE_BUDGET: halved each time a probe or look changes nothing,
        # whole again when one does (at T = 1 on a CPU, where speculation never pays).
        self.explore_scale = 1.0
        # Whether a drafting step would first write the deferred drafter context (set by the engine:
        # the proposer's `context_pending`), and the last such writes' host times (`observe_flush`).
        self.context_pending = lambda: False
        self._flush_seconds: deque = deque(maxlen=15)
        # A quiet stretch (`_choose_quietly`): (its batch's ids, steps left, credit a step, the
        # credit's cap, its width), or None.
        self._quiet: tuple[list[str], int, float, float, int] | None = None
        self.spec_quiet_steps = SPEC_QUIET_STEPS

    def name(self, width: int, greedy: bool = False) -> str:
        """`width`'s configuration name for a row (or, `greedy`, a batch of greedy rows only)."""
        return config_name(width, self.builds_trees and not (greedy and self.greedy_chains))

    def choose(self, seqs) -> int:
        """This step's width, from the past only."""
        if self.mode == "static":
            return self.full_width
        start = time.perf_counter()
        ids = list(map(_request_id, seqs))
        width = self._choose_quietly(ids)
        if width is None:
            width = self._choose(seqs, ids)
        self.host_seconds += time.perf_counter() - start
        return width

    def _choose_quietly(self, ids: list[str]) -> int | None:
        """Plain again, without recomputing the choice, for at most QUIET_STEPS steps after a
        plain choice of the same batch that explored nothing, and never past the step where a
        probe or a re-timing could next be due; None: choose in full. The counters and the
        credit advance as the full choice would advance them. What this can miss is slow: the
        relaxation of parked rows towards their class's figures, and new timings, move the
        choice over tens of steps (issue 15: the policy's host time, 25 µs of a 0.5 ms plain
        step at one row on the H100, where at T = 1 nearly every step is plain)."""
        quiet = self._quiet
        if quiet is None or quiet[1] <= 0 or ids != quiet[0]:
            self._quiet = None
            return None
        ids, left, inc, cap, width = quiet
        self._quiet = (ids, left - 1, inc, cap, width)
        self._credit = min(self._credit + inc, cap)
        self._steps += 1
        if width < self.full_width:
            self._since_probe += 1
        return width

    def _choose(self, seqs, ids: list[str]) -> int:
        B = len(seqs)
        if ids != self._batch_ids:                # (a C-level comparison; the batch rarely changes)
            self._batch_ids = ids
            self._look_wanted = not self._looked.issuperset(ids)
        # Rows' classes only for requests the model has not seen (a per-row call costs ≈ 0.4 µs).
        totals = self.acceptance.expected_totals(ids, lambda i: temperature_class(seqs[i].params))
        costs, to_time = self._costs_or_width_to_time(B, totals, lambda: sampling_variant([s.params for s in seqs]))
        if to_time is not None:
            return to_time
        if self._retime_next is not None:         # a re-timing's further steps (one of them timed)
            width, left = self._retime_next
            self._retime_next = (width, left - 1) if left > 1 else None
            return width
        costs = monotone_costs(costs)
        width = best_width(totals, self._charged(costs))
        if self._before_probe is not None:        # the step after a probe or look: did it change anything?
            changed, self._before_probe = width != self._before_probe, None
            if self._looking:
                self._looking, self.look_worth = False, ema(self.look_worth, float(changed), 0.2)
            self.probe_interval = self.min_probe if changed else min(2 * self.probe_interval, self.max_probe)
            self.explore_scale = 1.0 if changed else max(self.explore_scale / 2, MIN_EXPLORE_SCALE)
        # One credit pays for all exploration — re-timings, looks, probes: PROBE_BUDGET of each
        # step's cost (scaled), so together they add at most that (a budget of 3 % each cost
        # ≈ 7 % against plain at c = 4, T = 1 on a CPU, where a wide step costs 6–7 plain ones).
        self._credit = min(self._credit + PROBE_BUDGET * self.explore_scale * costs[width], 2 * max(costs.values()))
        self._steps += 1
        others = [w for w in self._widest_first if w != width]
        retime_due = bool(others) and self._steps >= self.retime_interval
        if retime_due:
            # The next width to re-time, in turn (two steps at it instead of two at `width`); at
            # most MAX_PROBE_SPACING steps apart whatever the credit, so that a figure holding a
            # stall is re-timed within minutes.
            # A width skipped while the bucket was cold (its cost only a bound) goes first,
            # narrowest first: at T = 0, c = 4 on a CPU chain4, the best static width there, was
            # skipped cold and not reached by the turn in a whole run.
            other, spend = self._next_retiming(B, others, costs, width)
            if self._credit >= spend or self._steps >= MAX_PROBE_SPACING:
                self._credit = max(self._credit - spend, 0.0)
                self._steps, self._probes = 0, self._probes + 1
                self._retime_next = (other, self._retime_steps - 1)
                return other
        if width < self.full_width:       # (a due re-timing saves the credit up: only free looks go first)
            spend = costs[self.full_width] - costs[width]
            # A first look: a joining request is run once at the full width, so that its own
            # acceptance decides, not only its class's figure (at c = 1 on a CPU a figure set low
            # by the first prompt kept later requests plain: probes came after they had ended).
            # In a small batch a look pays for itself while looks often change the choice (a
            # request found good saves many steps): free. Otherwise — a look runs every row wide
            # for one request that rarely sways the batch (a 16-wide step costs 8 plain ones at
            # 16 rows on a CPU), or looks keep confirming plain (T = 1 on a CPU) — on credit.
            free = B <= LOOK_FREE_ROWS and self.look_worth >= LOOK_WORTH
            if self._look_wanted and (free or (not retime_due and self._credit >= spend)):
                self._credit -= 0.0 if free else spend
                self._look_wanted, self._before_probe, self._looking = False, width, True
                return self.full_width
            self._since_probe += 1
            # A probe costs cost(full) − cost(width) more than the step it replaces (a 16-wide
            # chain can cost 5 plain steps on a CPU, where probing every 16 steps cost a quarter
            # of the time).
            if self._since_probe >= self.probe_interval and ((not retime_due and self._credit >= spend)
                                                             or self._since_probe >= MAX_PROBE_SPACING):
                self._credit = max(self._credit - spend, 0.0)
                self._since_probe, self._before_probe = 0, width
                return self.full_width
        if self._before_probe is None and (width == 1 or self.spec_quiet_steps):
            # Plain, nothing explored: the next steps of this batch may repeat it unrecomputed
            # until a probe, a re-timing or a first look could be due (`_choose_quietly`). A look
            # still wanted here is not free (it would have run), so it waits for the credit;
            # while one was wanted no stretch began, and at T = 1 on the CPU, once looks ran on
            # credit, that was 291 of 369 full choices at c = 1.
            inc, cap = PROBE_BUDGET * self.explore_scale * costs[width], 2 * max(costs.values())
            spend = costs[self.full_width] - costs[width]
            probe = math.inf
            if width < self.full_width:       # (at the full width nothing probes and looks are done)
                probe = self._steps_until(self.probe_interval - self._since_probe, spend,
                                          MAX_PROBE_SPACING - self._since_probe, inc, cap)
                if self._look_wanted:
                    probe = min(probe, self._steps_until(0, spend, MAX_PROBE_SPACING, inc, cap))
            retime = probe
            if others:
                _, retime_spend = self._next_retiming(B, others, costs, width)
                retime = self._steps_until(self.retime_interval - self._steps, retime_spend,
                                           MAX_PROBE_SPACING - self._steps, inc, cap)
                # From the step a re-timing is due, it holds back probes and looks on credit until it
                # has run (it saves the credit up: `retime_due` above); only the hard spacing forces a
                # probe. Without this, a due re-timing waiting for its credit (three wide steps) ended
                # every stretch at once: a full choice on 60 % of the steps of a T = 1 replay at the
                # H100's c = 1 costs, where the policy's host time was 10 % of the step.
                if probe != math.inf and probe >= self.retime_interval - self._steps:
                    probe = max(min(retime, MAX_PROBE_SPACING - self._since_probe), 1)
            due = min(probe, retime) - 1
            if due > 0:
                self._quiet = (ids, min(QUIET_STEPS if width == 1 else self.spec_quiet_steps, due), inc, cap, width)
        return width

    def _charged(self, costs: dict[int, float]) -> dict[int, float]:
        """The costs the choice compares: a pending context write added to every speculative width
        (module docstring, "Switching into speculation")."""
        if not self._flush_seconds or not self.context_pending():
            return costs
        flush = robust_seconds(self._flush_seconds)
        return {w: c + flush if w > 1 else c for w, c in costs.items()}

    def observe_flush(self, seconds: float) -> None:
        """The host time of one write of the deferred drafter context before a drafting step."""
        self._flush_seconds.append(seconds)

    @property
    def _retime_steps(self) -> int:
        """Steps a cost re-timing runs at its width: overlapped, the middle of three is timed (the
        last one's interval holds the next width's launch); else the second of two."""
        return 3 if self.overlapped else 2

    def _next_retiming(self, B: int, others: list[int], costs: dict[int, float], width: int) -> tuple[int, float]:
        """The width the next cost re-timing runs, and the credit it spends: its steps' cost
        over as many at `width`."""
        table = self.cost.table(B)
        untimed = [w for w in others if table[w] is None]
        if untimed:
            other = untimed[-1]
        else:
            # A width timed dearer than a wider one holds noise (a wider verify does all of its
            # work and more), or the wider one does: either side goes before the turn, narrowest
            # first. `monotone_costs` raises the wider to the narrower meanwhile, so one noisy
            # pair of samples priced chain 16 out at bucket 16 (chain 8 timed at 1.51 ms against
            # chain 16's 0.97 on the H100, gpu_session_r) for the rest of a run, where the turn
            # reaches a width every fourth re-timing. Every other re-timing only: an inversion
            # that persists (chain 8 timed over chain 16 throughout, at buckets 8–24 on another
            # H100, gpu_session_s) must not starve the turn.
            suspects = None
            if self._probes % 2 == 0:
                suspects = out_of_order({w: c for w, c in table.items() if c is not None})   # (this width may be untimed)
                suspects = [w for w in others if w in suspects] if suspects else None
            other = suspects[-1] if suspects else others[self._probes % len(others)]
        return other, self._retime_steps * max(costs[other] - costs[width], 0.0)

    def _steps_until(self, wait: int, spend: float, hard: int, inc: float, cap: float) -> float:
        """The soonest next step (1 = the next) at which an exploration gated by `wait` more
        steps and `spend` of credit (accruing `inc` a step up to `cap`), or forced after `hard`
        steps, could run: a lower bound, so a quiet stretch ends before it."""
        if spend <= self._credit:
            funded = 0
        elif inc <= 0 or spend > cap:
            funded = float("inf")
        else:
            funded = math.ceil((spend - self._credit) / inc)
        return max(min(max(wait, funded), hard), 1)

    def _costs_or_width_to_time(self, B: int, totals: dict[int, float],
                                variant=lambda: "sampled") -> tuple[dict, int | None]:
        """`ColdBuckets.costs_or_width_to_time`; a bucket's table is logged once, at the first
        choice that finds it complete."""
        costs, to_time = self.cold.costs_or_width_to_time(B, totals, variant)
        if to_time is None and len(self.cost.logged) < len(self.cost.buckets):
            bucket = self.cost.bucket_for(B)
            if bucket not in self.cost.logged and None not in self.cost.table(B).values():
                self.cost.logged.add(bucket)
                log.info("%s (policy host time so far %.2f ms)", self.cost.format_table(B), self.host_seconds * 1e3)
        return costs, to_time

    def observe(self, seqs, width: int, step, now: float | None = None, next_width: int | None = None) -> None:
        """Learn from a step run at `width` whose commit ended at `now` (default: now); `step` is
        its `StepResult` (rows in `seqs` order; rows already finished teach nothing: their
        request is forgotten). `next_width`: the step launched while this one was in flight, if
        any. Its cost is timed only in a steady state (module docstring)."""
        entered = time.perf_counter()
        now = entered if now is None else now
        # A plain step of the acceptance model's plain stretch's batch, no row finished: counted in
        # the stretch (what `observe_step` would do) and its timing filed when the cost model is
        # next read. The state the full path leaves, in a few operations: inside a real run that
        # path took ≈ 30 µs a step on the 2-core CPU, where the loop of `bench/policy_host_time.py`
        # takes 4 (between the engine's tensor ops little of the policy stays in the CPU's caches).
        short = (width == 1 and self.mode != "static" and step.path_nodes is not None
                 and Status.FINISHED not in map(_status, seqs)
                 and self.acceptance.extend_stretch(list(map(_request_id, seqs))))
        key = (self.cost.bucket_for(len(seqs)), width)
        previous, self._last = self._last, (now, key)
        if self.greedy_chains:       # (the batch's shape: chains only when every row is greedy)
            name = self.name(width, all(s.params.greedy for s in seqs))
        else:
            name = self._names.get(width) or self._names.setdefault(width, self.name(width))
        self.choices[name] += 1
        if self.mode == "static":
            return
        if previous is not None and previous[1] == key and next_width in (None, width):
            (self.cost.observe_later if short else self.cost.observe)(len(seqs), width, now - previous[0])
        if not short:
            self._learn(seqs, width, step.path_nodes)
        self.host_seconds += time.perf_counter() - entered

    def _learn(self, seqs, width: int, paths) -> None:
        """The acceptance model and first looks learn from a step's live rows."""
        live = seqs
        # C-level passes over the rows: a Python loop (getattr, the class) cost ≈ 1 µs a row.
        if Status.FINISHED in map(_status, seqs):     # (finished: already forgotten)
            keep = [i for i, s in enumerate(seqs) if s.status is not Status.FINISHED]
            live, paths = [seqs[i] for i in keep], None if paths is None else [paths[i] for i in keep]
        live_ids = list(map(_request_id, live))
        if width == self.full_width:
            self._looked.update(live_ids)
            self._look_wanted = False
        if paths is not None:                   # plain rows too: their wider widths relax
            self.acceptance.observe_step(live_ids, lambda i: temperature_class(live[i].params), paths, width)

    def interrupt(self) -> None:
        """Something other than a decode step ran (a prefill): the next step is not timed."""
        self._last = None

    def forget(self, request_id: str) -> None:
        self.acceptance.forget(request_id)
        self._looked.discard(request_id)
