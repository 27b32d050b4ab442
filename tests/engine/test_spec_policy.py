"""The adaptive policy's pure parts: cost model, acceptance EMA, the choice (engine/spec_policy.py)."""

import logging
from types import SimpleNamespace

import pytest
import torch

from blockspec.engine.acceptance import AcceptanceModel, counterfactual_accepts, ema, temperature_class
from blockspec.engine.chain_acceptance import ChainAcceptance
from blockspec.engine.sequence import Status
from blockspec.engine.spec_policy import (MAX_PROBE_SPACING, PROBE_BUDGET, SpecPolicy, best_width, candidate_widths,
                                          config_name)
from blockspec.engine.step_cost import StepCostModel, monotone_costs, robust_seconds
from blockspec.speculative.step import StepResult
from blockspec.speculative.tree import PAD_PARENT, build_tree, chain_tree, truncate_tree


def test_robust_seconds_is_the_lower_quartile_and_ignores_stalls():
    assert robust_seconds([1.0, 1.2, 50.0]) == 1.0 and robust_seconds([4.7, 0.0006]) == 0.0006
    assert robust_seconds([3.0, 1.0, 2.0, 40.0, 50.0]) == 2.0 and robust_seconds([7.0]) == 7.0
    assert robust_seconds([float(x) for x in range(1, 16)]) == 4.0
    with pytest.raises(ValueError, match="samples"):
        robust_seconds([])


def test_cost_model_discards_warmup_and_needs_min_samples():
    m = StepCostModel([1, 2, 4], [1, 4], discard=1, min_samples=2, window=3)
    m.observe(3, 4, 9.0)                       # warm-up (compile): dropped
    m.observe(3, 4, 1.0)
    assert m.estimate(4, 4) is None and [w for w, t in m.table(3).items() if t is None] == [1, 4]
    m.observe(4, 4, 2.0)                       # bucket 4 again
    assert m.estimate(3, 4) == 1.0 and [w for w, t in m.table(3).items() if t is None] == [1]
    for t in (5.0, 5.0, 5.0):                  # the window forgets old samples
        m.observe(3, 4, t)
    assert m.estimate(3, 4) == 5.0
    assert m.measured(1, 4) is None and m.bucket_for(9) == 9
    assert m.estimate(1, 4) is None                      # never borrowed from another bucket


def test_cost_model_files_later_observations_when_read():
    """`observe_later` timings enter the estimates before any read, in order, as `observe`'s
    would (a kept table included)."""
    model = StepCostModel([1, 2], [1, 2], discard=0, min_samples=2, window=3)
    assert model.table(1) == {1: None, 2: None}
    for seconds in (0.9, 0.5, 0.7, 0.6):
        model.observe_later(1, 1, seconds)
    assert model.table(1)[1] == 0.5 and model.measured(1, 1) == 0.5     # the window keeps 0.5, 0.7, 0.6
    model.observe_later(1, 1, 0.8)
    assert model.timed_at(1, 1) == 0.6                                  # 0.5 left the window
    # Filed a key at a time, they leave what `observe` one by one leaves: discarded first samples,
    # stalls dropped, the window's last samples, per key, whatever the keys' interleaving.
    timings = [(1, 1, 0.9), (2, 2, 5.0), (1, 1, 0.4), (2, 1, 0.3), (2, 2, 4.0), (1, 1, 0.7),
               (1, 1, 0.6), (2, 2, 3.0), (1, 2, 0.2), (1, 1, 80.0), (1, 1, 0.5)]
    later, now = (StepCostModel([1, 2], [1, 2], discard=1, min_samples=2, window=3) for _ in range(2))
    for m in (later, now):
        m._stall_limits[(1, 1)] = 10.0                                  # as `set_priors` sets: 80 s is a stall
    for t in timings:
        later.observe_later(*t)
        now.observe(*t)
    later.table(1)
    assert later._samples == now._samples and later._seen == now._seen
    assert later.table(2) == now.table(2) and later.table(1) == now.table(1)


@pytest.mark.parametrize("kwargs, field", [({"widths": [2, 4]}, "widths"), ({"buckets": [4, 2]}, "buckets"),
                                           ({"min_samples": 0}, "min_samples"), ({"window": 1}, "window")])
def test_cost_model_rejects_bad_settings(kwargs, field):
    args = {"buckets": [1, 2], "widths": [1, 4], "min_samples": 2, **kwargs}
    with pytest.raises(ValueError, match=field):
        StepCostModel(**args)


def test_ema_and_counterfactuals():
    assert ema(None, 3.0, 0.5) == 3.0 and ema(2.0, 4.0, 0.25) == 2.5
    with pytest.raises(ValueError, match="alpha"):
        ema(1.0, 1.0, 0.0)
    # A chain accepting 3 drafts (nodes 1, 2, 3) at width 8: width w would have accepted w − 1, at most 3.
    assert counterfactual_accepts([1, 2, 3], [1, 2, 4, 8, 16], 8) == {1: 0, 2: 1, 4: 3, 8: 3}
    # A tree path through node 5: width ≤ 5 stops before it.
    assert counterfactual_accepts([1, 5, 6], [2, 5, 6, 7], 7) == {2: 1, 5: 1, 6: 2, 7: 3}


def test_acceptance_model_seeds_new_requests_from_the_batch():
    m = AcceptanceModel([1, 2, 4], alpha=0.5, batch_alpha=1.0)
    assert m.expected("a", "greedy", 4) == 3.0            # optimistic before anything is seen
    m.observe("a", "greedy", [], 4)                       # all rejected
    assert m.expected("a", "greedy", 4) == 0.0
    assert m.expected("b", "greedy", 4) == 0.0            # seeded from the batch-wide figure
    assert m.expected("c", "t<=1", 4) == 3.0              # another temperature class
    m.forget("a")
    assert m.expected("a", "greedy", 2) == 0.0            # back to the batch's figure


def observe_rows(m, rows):
    """`AcceptanceModel.observe_step` from (request_id, class, path_nodes, ran_width) per row."""
    ids, classes, paths, ran = zip(*rows)
    m.observe_step(list(ids), classes.__getitem__, list(paths), list(ran))


def test_a_row_parked_at_plain_relaxes_towards_the_batch():
    """Widths a step did not reach drift to the class's batch-wide figure, so a row parked at plain
    after a bad stretch returns to speculating without waiting for a probe."""
    m = AcceptanceModel([1, 2, 4], alpha=0.5, batch_alpha=0.5, relax=0.2)
    for _ in range(5):
        observe_rows(m, [("a", "greedy", [1, 2, 3], 4), ("b", "greedy", [1, 2, 3], 4)])
    for _ in range(5):
        observe_rows(m, [("a", "greedy", [], 4), ("b", "greedy", [1, 2, 3], 4)])     # a's bad stretch
    low = m.expected("a", "greedy", 4)
    assert low < 0.2
    for _ in range(20):
        observe_rows(m, [("a", "greedy", [], 1), ("b", "greedy", [1, 2, 3], 4)])     # a at plain
    assert m.expected("a", "greedy", 4) > 0.9 * m.expected("b", "greedy", 4) > 2.0
    with pytest.raises(ValueError, match="alpha"):
        AcceptanceModel([1, 2], relax=1.5)


def test_temperature_classes():
    from blockspec.sampling import SamplingParams
    assert [temperature_class(SamplingParams(temperature=t)) for t in (0.0, 0.3, 1.0, 1.5)] == \
        ["greedy", "t<=0.5", "t<=1", "t>1"]


def choose_width(expected, costs):
    """best_width over per-row expectations: Σ_rows (1 + E_row[w])."""
    return best_width({w: sum(1.0 + row[w] for row in expected) for w in costs}, costs)


def test_expected_totals_sum_the_rows_expectations_and_the_batch_moves_once_a_step():
    m = AcceptanceModel([1, 2, 4], alpha=0.5, batch_alpha=0.5)
    observe_rows(m, [("a", "greedy", [1, 2, 3], 4), ("b", "greedy", [], 4), ("c", "t<=1", [1], 2)])
    rows = [("a", "greedy"), ("b", "greedy"), ("c", "t<=1"), ("new", "greedy"), ("x", "t>1")]
    assert m.expected_totals([r for r, _ in rows], lambda i: rows[i][1]) == \
        {w: sum(1 + m.expected(r, k, w) for r, k in rows) for w in (1, 2, 4)}
    # two greedy rows in one step: the batch EMA moves by 1 − 0.5² towards their mean (3 + 0) / 2
    assert m.expected("new", "greedy", 4) == pytest.approx(1.5)


def test_choose_width_maximises_tokens_per_second_with_plain_a_candidate():
    costs = {1: 1.0, 2: 1.2, 4: 1.5, 8: 2.0}
    adversary = [{w: 0.0 for w in costs}] * 3
    oracle = [{w: float(w - 1) for w in costs}] * 3
    assert choose_width(adversary, costs) == 1
    assert choose_width(oracle, costs) == 8
    # Accept rate 0.5 per position, E[w] = Σ_{i<w} 0.5^i: width 4 commits 1.875 per 1.5 s = 1.25/s,
    # beating plain's 1, width 2's 1.5/1.4 and width 8's 1.99/2.
    half = [{1: 0.0, 2: 0.5, 4: 0.875, 8: 0.9921875}]
    assert choose_width(half, {**costs, 2: 1.4}) == 4
    assert choose_width(half, {1: 1.0, 2: 1.2, 4: 1.5}) == 2    # a tie (1.25/s) goes to the narrower
    with pytest.raises(ValueError, match="width 1"):
        choose_width(oracle, {2: 1.0})


def test_candidate_widths_and_names():
    assert candidate_widths(16) == [1, 2, 4, 8, 16]
    assert candidate_widths(1) == [1] and candidate_widths(6) == [1, 2, 4, 6]
    assert [config_name(w, False) for w in (1, 4)] == ["plain", "chain4"] and config_name(8, True) == "tree7"


def _run_policy(accept_of_width, cost_of_width, steps=120, full=8):
    """Drive a SpecPolicy with fake timings and a fake verifier; returns its choices."""
    policy = SpecPolicy("adaptive", full, False, [1, 2, 4])
    seqs = [SimpleNamespace(request_id=f"r{i}", status=Status.RUNNING, params=SimpleNamespace(greedy=True, temperature=0.0, seed=None))
            for i in range(2)]
    chosen, clock = [], 0.0
    for _ in range(steps):
        w = policy.choose(seqs)
        chosen.append(w)
        acc = accept_of_width(w)
        step = StepResult([[0]] * 2, [acc] * 2, [w - 1] * 2, [list(range(1, acc + 1))] * 2)
        clock += cost_of_width(w)
        policy.observe(seqs, w, step, now=clock)
    return chosen


@pytest.fixture
def whole_budget(monkeypatch):
    """Exploration at its whole budget throughout (`explore_scale` pinned at 1)."""
    import blockspec.engine.spec_policy as spec_policy
    monkeypatch.setattr(spec_policy, "MIN_EXPLORE_SCALE", 1.0)


def test_policy_learns_plain_for_an_adversary_and_the_full_block_for_an_oracle(whole_budget):
    adversary = _run_policy(lambda w: 0, lambda w: 0.01 * (1 + 0.1 * w), steps=400)
    oracle = _run_policy(lambda w: w - 1, lambda w: 0.01 * (1 + 0.1 * w))
    tail = slice(60, None)
    assert adversary[tail].count(1) >= 0.85 * len(adversary[tail])      # probes of the other widths aside
    assert oracle[tail].count(8) >= 0.85 * len(oracle[tail])
    assert set(adversary[tail]) == {1, 2, 4, 8}                       # every width re-timed now and then


def test_probes_are_the_full_width_below_it_and_rare_cost_retimes_at_it(whole_budget):
    """Below the full width, acceptance probes run the full width (it observes every draft
    position); at the full width only the rare cost re-timing runs another width."""
    adversary = _run_policy(lambda w: 0, lambda w: 0.01 * (1 + 0.1 * w), steps=400)
    oracle = _run_policy(lambda w: w - 1, lambda w: 0.01 * (1 + 0.1 * w), steps=400)
    tail = slice(60, None)
    # full-width probes, spaced so they add at most PROBE_BUDGET: (1.8 / 1.1 − 1) / 0.03 → every 22 steps;
    # a cost re-timing runs two steps (the second is timed), at most one every 64 steps
    retimes = 2 * (340 // 64 + 1)
    assert set(adversary[tail]) - {1, 8} and 340 // 23 <= adversary[tail].count(8) <= 340 // 21 + 1 + retimes
    assert len(adversary[tail]) - adversary[tail].count(1) - adversary[tail].count(8) <= retimes
    assert len(oracle[tail]) - oracle[tail].count(8) <= retimes


def kept(policy, bucket: int, width: int) -> list[float]:
    """The timings the cost model keeps for a key, once it has filed the ones observed for later."""
    policy.cost.table(bucket)
    return list(policy.cost._samples[bucket, width])


def test_a_step_is_timed_only_after_a_step_of_the_same_width_and_bucket():
    """The interval between the ends of two steps is the second's cost only in a steady state:
    after a switch it holds the neighbour's work (an overlapped interval: the previous step's
    commit and the next one's launch), and across a prefill the prefill."""
    policy = SpecPolicy("adaptive", 4, False, [1, 2])
    policy.cost.discard = 0
    one = [SimpleNamespace(request_id="r", status=Status.RUNNING, params=SimpleNamespace(greedy=True, temperature=0.0, seed=None))]
    two = one + [SimpleNamespace(request_id="s", status=Status.RUNNING, params=one[0].params)]
    clock = 0.0
    # (rows, width, seconds since the last step ended); None: a prefill ran just before
    for seqs, w, dt in [(one, 1, 9.0), (one, 1, 0.5), (one, 1, 0.5), (one, 4, 7.0), (one, 4, 2.0), (one, 4, 2.0),
                        (one, 1, 6.0), (two, 1, 8.0), (two, 1, 0.75), (None, None, None), (two, 1, 5.0),
                        (two, 1, 0.75)]:
        if seqs is None:
            policy.interrupt()
            continue
        clock += dt
        policy.observe(seqs, w, StepResult([[0]] * len(seqs), [0] * len(seqs), [0] * len(seqs), [[]] * len(seqs)),
                       now=clock)
    assert kept(policy, 1, 1) == [0.5, 0.5] and kept(policy, 1, 4) == [2.0, 2.0]
    assert kept(policy, 2, 1) == [0.75, 0.75]      # not the 8 s switch, nor the 5 s prefill


def test_static_policy_always_runs_the_full_width():
    policy = SpecPolicy("static", 8, True, [1, 2])
    assert policy.widths == [8] and policy.choose([object()]) == 8
    with pytest.raises(ValueError, match="spec_policy"):
        SpecPolicy("fastest", 8, True, [1])


def test_truncate_tree_is_the_smaller_budget_and_pads_narrow_rows():
    logprobs = torch.log_softmax(torch.randn(2, 4, 11, generator=torch.Generator().manual_seed(0)), -1)
    full, small = build_tree(logprobs, 9), build_tree(logprobs, 4)
    cut = truncate_tree(full, 5)
    for name in ("tokens", "parents", "depths", "num_nodes"):
        assert torch.equal(getattr(cut, name), getattr(small, name)), name
    chain = chain_tree(torch.arange(1, 7).repeat(2, 1), torch.tensor([9, 9]))
    mixed = truncate_tree(chain, 5, torch.tensor([1, 3]))
    assert mixed.num_nodes.tolist() == [0, 2] and mixed.width == 5
    assert mixed.parents[0, 1:].eq(PAD_PARENT).all() and mixed.parents[1].tolist() == [-1, 0, 1, PAD_PARENT, PAD_PARENT]
    with pytest.raises(ValueError, match="width"):
        truncate_tree(chain, 9)
    with pytest.raises(ValueError, match="row_widths"):
        truncate_tree(chain, 4, torch.tensor([1]))


def test_engine_config_rejects_an_unknown_policy():
    from blockspec.engine.config import EngineConfig
    assert EngineConfig(model="m").spec_policy == "adaptive"
    with pytest.raises(ValueError, match="spec_policy"):
        EngineConfig(model="m", spec_policy="fastest").validate()


def set_class_figures(acceptance, klass: str, figures: list[float]) -> None:
    """Give a class these expected accepted drafts per width: per-width figures as they are, or
    (`ChainAcceptance`) the per-position rates that yield them, constant between two widths."""
    row = acceptance._class_row(klass)
    if not isinstance(acceptance, ChainAcceptance):
        acceptance._table[row] = figures
        return
    rates, reach, done = [], 1.0, 0.0
    for w_prev, w, target in zip(acceptance.widths, acceptance.widths[1:], figures[1:]):
        n, want = w - w_prev, target - done                  # positions w_prev … w − 1 add `want`
        lo, hi = 0.0, 1.0
        for _ in range(60):                                  # reach · (h + … + h^n) = want
            h = (lo + hi) / 2
            lo, hi = (h, hi) if reach * sum(h ** k for k in range(1, n + 1)) < want else (lo, h)
        rates += [lo] * n
        reach, done = reach * lo ** n, target
    acceptance._table[row] = rates
    assert [round(v, 6) for v in acceptance.expected_totals(["nobody"], lambda i: klass).values()] == \
        [round(1 + f, 6) for f in figures]


def test_a_cold_bucket_skips_widths_that_cannot_win_even_at_a_narrower_cost():
    """The full width first (it observes every draft position), then narrowest first; a width
    whose expected tokens lose to the best timed rate even at its widest timed narrower width's
    cost is not timed, and that cost stands in for it."""
    policy = SpecPolicy("adaptive", 8, False, [1, 2])
    seqs = [SimpleNamespace(request_id="r", status=Status.RUNNING, params=SimpleNamespace(greedy=True, temperature=0.0, seed=None))]
    acceptance = policy.acceptance        # drafts mostly rejected: the class's figures, which "r" reads
    set_class_figures(acceptance, "greedy", [0.0, 0.1, 0.15, 0.2])
    policy._looked.add("r")               # (seen at the full width already: no first look)
    assert policy._costs_or_width_to_time(1, {1: 1.0, 2: 1.1, 4: 1.15, 8: 1.2})[1] == 8
    for w, cost in ((8, 5.0), (1, 1.0), (2, 3.0)):
        policy.cost.observe(1, w, cost)
        policy.cost.observe(1, w, cost)
    # plain 1 token / 1.0 s; width 4 at ≥ 3.0 s could commit 1.15 / 3.0: skipped.
    assert policy._costs_or_width_to_time(1, {1: 1.0, 2: 1.1, 4: 1.15, 8: 1.2}) == ({1: 1.0, 2: 3.0, 4: 3.0, 8: 5.0}, None)
    assert policy.choose(seqs) == 1
    # Drafts that are mostly accepted: width 4 could commit 4 tokens at 3.0 s, beating plain: timed next.
    assert policy._costs_or_width_to_time(1, {1: 1.0, 2: 2.0, 4: 4.0, 8: 4.5})[1] == 4


def test_priors_estimate_an_untimed_width_from_a_timed_one():
    cost = StepCostModel([1, 2], [1, 2, 4, 8])
    cost.set_priors({(2, 1, "sampled"): 1.0, (2, 2, "sampled"): 2.0, (2, 4, "sampled"): 2.1, (2, 8, "sampled"): 2.3,
                     (2, 2, "greedy"): 1.2})
    # from the timed width nearest below (plain: 3.0 s timed), else the nearest above
    assert cost.estimate_from_prior(2, 4, "sampled", {1: 3.0, 8: 4.0}) == pytest.approx(3.0 + 2.1 - 1.0)
    assert cost.estimate_from_prior(2, 2, "sampled", {8: 4.0}) == pytest.approx(4.0 + 2.0 - 2.3)
    assert cost.estimate_from_prior(2, 2, "greedy", {1: 3.0}) is None          # no greedy prior for plain
    assert cost.estimate_from_prior(1, 2, "sampled", {1: 3.0}) is None         # no priors for bucket 1
    assert cost.estimate_from_prior(2, 2, "sampled", {}) is None
    assert "bucket 2 sampled: w1 1000.000" in cost.format_priors()
    with pytest.raises(ValueError, match="prior"):
        cost.set_priors({(3, 1, "sampled"): 1.0})                              # not a bucket
    with pytest.raises(ValueError, match="prior"):
        cost.set_priors({(2, 1, "sampled"): 0.0})


def test_a_cold_bucket_skips_widths_the_priors_say_lose():
    """GPU seconds per step 1 / 2 / 4.5 / 5 at widths 1 / 2 / 4 / 8, and the host adds 1 s to each;
    rows accept up to 2 drafts, so chain2 commits 2 tokens in 3 s, chain4 3 in 5.5 s, chain8 3 in 6 s:
    chain2 is the best. Without priors chain4 is timed (at chain2's cost, its lower bound, it would
    win); with them its cost is estimated at 3 + 4.5 − 2 = 5.5 s and it is never run."""
    priors = {1: 1.0, 2: 2.0, 4: 4.5, 8: 5.0}

    def widths_run(with_priors: bool) -> list[int]:
        policy = SpecPolicy("adaptive", 8, False, [1, 2, 4])
        if with_priors:
            policy.cost.set_priors({(2, w, "greedy"): s for w, s in priors.items()})
        seqs = [SimpleNamespace(request_id=f"r{i}", status=Status.RUNNING,
                                params=SimpleNamespace(greedy=True, temperature=0.0, seed=None)) for i in range(2)]
        clock, order = 0.0, []
        for _ in range(16):
            w = policy.choose(seqs)
            order += [w] if w not in order else []
            acc = min(w - 1, 2)
            clock += priors[w] + 1.0
            policy.observe(seqs, w, StepResult([[0]] * 2, [acc] * 2, [w - 1] * 2, [list(range(1, acc + 1))] * 2),
                           now=clock)
        assert w == 2
        return order

    assert widths_run(False) == [8, 1, 2, 4]
    assert widths_run(True) == [8, 1, 2]


def test_a_timing_far_over_its_prior_is_a_stall_and_dropped():
    cost = StepCostModel([1, 2], [1, 4], discard=0, min_samples=2)
    cost.set_priors({(1, 4, "greedy"): 0.001, (1, 1, "sampled"): 0.0005})
    for seconds in (4.7, 0.002, 0.003):        # a 4.7 s compile inside a 1 ms step's interval
        cost.observe(1, 4, seconds)
    assert cost.measured(1, 4) == 0.002
    cost.observe(1, 1, 0.02)                   # 40 × its prior: host-bound, kept
    cost.observe(1, 1, 0.02)
    assert cost.measured(1, 1) == 0.02
    cost.observe(2, 4, 4.7)                    # no prior for bucket 2: kept
    cost.observe(2, 4, 4.7)
    assert cost.measured(2, 4) == 4.7


def test_exploration_stays_within_one_budget_and_a_stalled_figure_is_still_retimed(whole_budget):
    """Probes, re-timings and looks share one credit: over an adversary's run (every wide step a
    loss) the time spent off plain is at most PROBE_BUDGET of the run's (plus one action's worth).
    A width whose figure holds a stall (1000 × its real cost) is still re-timed within
    MAX_PROBE_SPACING steps, whatever the credit says."""
    cost = lambda w: 0.01 * (1 + 0.1 * w)                # noqa: E731
    chosen = _run_policy(lambda w: 0, cost, steps=3000)
    tail = chosen[100:]
    extra = sum(cost(w) - cost(1) for w in tail)
    assert 0 < extra <= PROBE_BUDGET * sum(cost(w) for w in tail) + 4 * cost(8)   # (+ the credit's cap)
    assert set(tail) == {1, 2, 4, 8}                                               # re-timings got their turn

    policy = SpecPolicy("adaptive", 8, False, [1])
    seqs = [SimpleNamespace(request_id="r", status=Status.RUNNING, params=SimpleNamespace(greedy=True, temperature=0.0, seed=None))]
    for w in (1, 2, 4, 8):
        for _ in range(2):
            policy.cost.observe(1, w, 1000 * cost(w) if w == 8 else cost(w))
    policy._looked.add("r")
    clock, seen = 0.0, []
    for _ in range(MAX_PROBE_SPACING + 10):
        w = policy.choose(seqs)
        seen.append(w)
        clock += cost(w)
        policy.observe(seqs, w, StepResult([[0]], [0], [w - 1], [[]]), now=clock)
    assert 8 in seen[MAX_PROBE_SPACING // 2:]


def _serial_requests(policy, accepts_of_request, steps_each=60):
    """Requests one after another (concurrency 1): request r's drafts accept
    `accepts_of_request(r, w)` at width w; a full-width step costs 2.6 plain ones (a CPU at batch 1).
    Returns each request's widths."""
    params = SimpleNamespace(greedy=True, temperature=0.0, seed=None)
    clock, runs = 0.0, []
    for r in range(6):
        seqs, chosen = [SimpleNamespace(request_id=f"q{r}", status=Status.RUNNING, params=params)], []
        policy.interrupt()                                  # its prefill ran in between
        for _ in range(steps_each):
            w = policy.choose(seqs)
            acc = accepts_of_request(r, w)
            clock += 0.01 if w == 1 else 0.024 + 0.0002 * w
            policy.observe(seqs, w, StepResult([[0] * (acc + 1)], [acc], [w - 1], [list(range(1, acc + 1))]),
                           now=clock)
            chosen.append(w)
        policy.forget(f"q{r}")
        runs.append(chosen)
    return runs


def test_a_joining_request_gets_a_first_look_so_a_low_class_figure_does_not_keep_it_plain():
    """The first request's drafts are all rejected, every later one's all accepted. The class figure
    the first leaves is low; each later request is run once at the full width (a first look, paid
    from the probe budget) and then speculates on its own figure. Negative control: without first
    looks the next request starts from the low class figure and stays plain until a probe (with
    per-position rates a probe then turns it quickly: per-width figures kept it plain most of
    its life)."""
    accepts = lambda r, w: 0 if r == 0 else w - 1     # noqa: E731
    runs = _serial_requests(SpecPolicy("adaptive", 8, False, [1]), accepts)
    assert runs[0][10:].count(1) >= 0.8 * len(runs[0][10:])
    assert all(run.count(8) >= 0.7 * len(run) for run in runs[1:]), [run.count(8) for run in runs]
    assert runs[1][0] == 8 and 1 not in runs[1]

    blind = SpecPolicy("adaptive", 8, False, [1])
    blind._looked = type("Everyone", (set,), {"issuperset": lambda self, ids: True})()
    runs = _serial_requests(blind, accepts)
    assert runs[1][:8] == [1] * 8


def _turning_drafter(turn=800, steps=1200):
    """Two rows whose drafts are all rejected until step `turn`, then all accepted. Returns the
    widths chosen and `explore_scale` after each step."""
    policy = SpecPolicy("adaptive", 8, False, [1, 2, 4])
    seqs = [SimpleNamespace(request_id=f"r{i}", status=Status.RUNNING,
                            params=SimpleNamespace(greedy=True, temperature=0.0, seed=None)) for i in range(2)]
    chosen, clock, scales = [], 0.0, []
    for k in range(steps):
        w = policy.choose(seqs)
        acc = 0 if k < turn else w - 1
        clock += 0.01 * (1 + 0.1 * w)
        policy.observe(seqs, w, StepResult([[0]] * 2, [acc] * 2, [w - 1] * 2, [list(range(1, acc + 1))] * 2),
                       now=clock)
        chosen.append(w)
        scales.append(policy.explore_scale)
    return chosen, scales


def test_exploration_gets_cheaper_while_it_changes_nothing_and_whole_when_it_does(monkeypatch):
    """An adversary's probes keep confirming plain: the budget halves per probe down to 1/8, so
    probes and re-timings run far fewer steps off plain than at the whole budget. A drafter that
    turns good is still found."""
    import blockspec.engine.spec_policy as spec_policy
    chosen, scales = _turning_drafter()
    window = chosen[800 - 340:800]
    assert scales[799] == spec_policy.MIN_EXPLORE_SCALE
    assert chosen[1000:].count(1) <= 0.1 * len(chosen[1000:])      # found (by a probe or a re-timing), speculating
    monkeypatch.setattr(spec_policy, "MIN_EXPLORE_SCALE", 1.0)
    whole, _ = _turning_drafter()
    off_plain = lambda ws: len(ws) - ws.count(1)     # noqa: E731
    assert off_plain(window) <= 8 and 2 * off_plain(window) < off_plain(whole[800 - 340:800])


def test_a_cold_bucket_skips_the_full_width_when_a_smaller_bucket_says_it_loses():
    """A larger batch's step is never cheaper: the full width's cost at bucket 8 bounds it at bucket
    16 from below. Where it loses even at that bound, bucket 16 times plain and never the full
    width (on the CPU a 16-wide step costs 13 plain ones at 16 rows); where it could win, the full
    width is timed."""
    policy = SpecPolicy("adaptive", 8, False, [1, 8, 16])
    for w, cost in ((1, 1.0), (2, 6.0), (4, 7.0), (8, 8.0)):       # bucket 8, timed
        for _ in range(2):
            policy.cost.observe(8, w, cost)
    assert policy.cost.floor_from_smaller(16, 8) == 8.0 and policy.cost.floor_from_smaller(8, 8) is None
    low = {1: 16.0, 2: 17.0, 4: 18.0, 8: 19.0}                     # few accepted drafts
    assert policy._costs_or_width_to_time(16, low)[1] == 1           # plain first, not the full width
    for _ in range(2):
        policy.cost.observe(16, 1, 1.5)
    # (the skipped widths' stand-ins: plain's cost here scaled as at bucket 8, where the full
    # width lost, above their floors)
    assert policy._costs_or_width_to_time(16, low) == ({1: 1.5, 2: 9.0, 4: 10.5, 8: 12.0}, None)
    high = {1: 16.0, 2: 32.0, 4: 64.0, 8: 128.0}                    # every draft accepted
    assert policy._costs_or_width_to_time(16, high)[1] == 8          # only it could win at its floor: timed


def test_a_width_skipped_while_cold_is_the_first_re_timed():
    """Its cost is only a bound until it is timed: the first re-timing runs it (narrowest first)."""
    policy = SpecPolicy("adaptive", 8, False, [1, 2])
    seqs = [SimpleNamespace(request_id="r", status=Status.RUNNING, params=SimpleNamespace(greedy=True, temperature=0.0, seed=None))]
    set_class_figures(policy.acceptance, "greedy", [0.0, 0.5, 1.0, 1.7])
    policy._looked.add("r")
    clock, chosen = 0.0, []
    cost = {1: 1.0, 2: 3.0, 4: 3.2, 8: 5.0}
    for _ in range(400):
        w = policy.choose(seqs)
        chosen.append(w)
        clock += cost[w]
        acc = min(w - 1, 1)
        policy.observe(seqs, w, StepResult([[0] * (acc + 1)], [acc], [w - 1], [list(range(1, acc + 1))]), now=clock)
    first_four = chosen.index(4)
    assert policy.cost.table(1)[4] is not None                       # timed in the end
    assert set(chosen[:first_four]) <= {1, 2, 8}                     # not before the first re-timing …
    assert chosen[first_four:first_four + 2] == [4, 4]               # … which runs it, two steps


def test_a_cold_bucket_times_plain_first_where_a_timed_neighbour_says_the_full_width_loses():
    """Requests finishing shrink the batch into cold buckets. Where bucket 16 says the full width
    loses to plain (few accepted drafts), bucket 8 times plain first, not the full width, and
    estimates the other widths as plain's cost here × their ratio at 16: those that lose by over
    the margin at that estimate are not timed (the estimate stands in until a re-timing); one
    that could win is. Where the full width wins at 16, bucket 8 times it first, as before: its
    steps are also a look at every row's acceptance."""
    def warm_policy():
        policy = SpecPolicy("adaptive", 8, False, [1, 8, 16])
        for w, cost in ((1, 1.0), (2, 3.0), (4, 4.0), (8, 6.0)):       # bucket 16, timed
            for _ in range(2):
                policy.cost.observe(16, w, cost)
        return policy

    policy = warm_policy()
    low = {1: 8.0, 2: 8.5, 4: 9.0, 8: 9.5}                          # few accepted drafts
    assert policy._costs_or_width_to_time(8, low)[1] == 1             # plain first, not the full width
    for _ in range(2):
        policy.cost.observe(8, 1, 0.5)
    assert policy._costs_or_width_to_time(8, low) == ({1: 0.5, 2: 1.5, 4: 2.0, 8: 3.0}, None)
    assert policy.cost.estimate_from_neighbour(8, 4, {1: 0.5}) == 2.0
    better = {1: 8.0, 2: 8.5, 4: 40.0, 8: 20.0}                     # chain 4 could win at its estimate (40 / 2)
    assert policy._costs_or_width_to_time(8, better)[1] == 4
    high = {1: 8.0, 2: 16.0, 4: 32.0, 8: 64.0}                      # every draft accepted: wins at 16
    assert warm_policy()._costs_or_width_to_time(8, high)[1] == 8
    assert SpecPolicy("adaptive", 8, False, [1, 8, 16])._costs_or_width_to_time(8, low)[1] == 8   # nothing timed


def test_an_overlapped_step_is_not_timed_when_a_step_of_another_width_launched_in_its_interval():
    """Overlapped, a step's interval holds the launch of the next one: a probe's launch (and the
    drafter-context flush before it) must not be charged to the plain step before it."""
    policy = SpecPolicy("adaptive", 4, False, [1, 2])
    one = [SimpleNamespace(request_id="r", status=Status.RUNNING, params=SimpleNamespace(greedy=True, temperature=0.0, seed=None))]
    step = StepResult([[0]], [0], [0], [[]])
    clock = 0.0
    # (width, seconds since the last step ended, width launched during its interval)
    for w, dt, nxt in [(1, 1.0, 1), (1, 0.5, 1), (1, 3.0, 4), (4, 2.0, 1), (1, 1.0, 1), (1, 0.5, 1), (1, 0.5, None)]:
        clock += dt
        policy.observe(one, w, step, now=clock, next_width=nxt)
    assert kept(policy, 1, 1) == [0.5, 0.5, 0.5]       # not the 3 s interval holding the probe's launch


def test_a_buckets_cost_table_is_logged_once_when_its_last_width_is_timed(caplog):
    """At the first choice that finds every width of the bucket timed, and never again."""
    policy = SpecPolicy("adaptive", 2, False, [1, 2])
    one = [SimpleNamespace(request_id="r", status=Status.RUNNING, params=SimpleNamespace(greedy=True, temperature=0.0, seed=None))]
    step = StepResult([[0]], [0], [0], [[]])
    clock = 0.0
    with caplog.at_level(logging.INFO, logger="blockspec.spec_policy"):
        for w in [1, 1, 1, 2, 2]:            # plain timed twice (measured), width 2 once: not yet
            clock += 0.001
            policy.observe(one, w, step, now=clock)
        policy.choose(one)
        assert not caplog.records
        for w in [2, 2, 2, 1, 1]:            # width 2's second timing completes the table; then no repeat
            clock += 0.001
            policy.observe(one, w, step, now=clock)
            policy._quiet = None
            policy.choose(one)
    assert len(caplog.records) == 1 and "policy host time" in caplog.records[0].getMessage()


def _overlapped_run(policy, cost_of_width, steps):
    """Drive `policy` as an overlapped engine does: step k+1's width is chosen and launched before
    step k is observed (`next_width`); every step of an adversary's drafts is rejected."""
    seqs = [SimpleNamespace(request_id="r", status=Status.RUNNING, params=SimpleNamespace(greedy=True, temperature=0.0, seed=None))]
    policy._looked.add("r")
    clock, in_flight = 0.0, None
    for _ in range(steps):
        w = policy.choose(seqs)
        if in_flight is not None:
            clock += cost_of_width(in_flight)
            policy.observe(seqs, in_flight, StepResult([[0]], [0], [in_flight - 1], [[]]), now=clock, next_width=w)
        in_flight = w


@pytest.mark.parametrize("overlapped", [True, False])
def test_an_overlapped_engines_cost_retimings_are_timed(whole_budget, overlapped):
    """Overlapped, a step is timed only when the next one launched at its width, so a re-timing
    runs three steps: every width's figure keeps getting fresh samples. Told it is not overlapped
    (two-step re-timings), the same run times nothing after the cold bucket's first timings."""
    policy = SpecPolicy("adaptive", 8, False, [1])
    policy.overlapped = overlapped
    _overlapped_run(policy, lambda w: 0.01 * (1 + 0.1 * w), steps=64 * 40)
    seen = {w: policy.cost._seen.get((1, w), 0) for w in (2, 4, 8)}
    if overlapped:
        assert min(seen.values()) >= 4, seen          # cold timings (2–3) and re-timings since
    else:
        assert max(seen.values()) <= 3, seen


def test_costs_are_made_monotone_in_the_width_before_the_choice(monkeypatch):
    """A wider verify never costs less than a narrower one: a table saying so is noise, and the
    choice is made on the raised costs."""
    import blockspec.engine.spec_policy as spec_policy
    from blockspec.engine.step_cost import monotone_costs
    assert monotone_costs({1: 1.5, 2: 2.0, 4: 1.3, 8: 2.5}) == {1: 1.5, 2: 2.0, 4: 2.0, 8: 2.5}

    def choice() -> int:
        policy = SpecPolicy("adaptive", 8, False, [1])
        for w, c in {1: 1.5, 2: 2.0, 4: 1.3, 8: 2.5}.items():
            for _ in range(2):
                policy.cost.observe(1, w, c)
        policy._looked.add("r")
        for _ in range(30):          # one draft accepted a step: about 2 tokens at every width ≥ 2
            policy.acceptance.observe_step(["r"], lambda i: "greedy", [[1]], 8)
        seqs = [SimpleNamespace(request_id="r", status=Status.RUNNING,
                                params=SimpleNamespace(greedy=True, temperature=0.0, seed=None))]
        return policy.choose(seqs)
    assert choice() == 2                                   # 2 tokens for 2.0 s beats plain's 1 for 1.5
    monkeypatch.setattr(spec_policy, "monotone_costs", lambda costs: costs)
    assert choice() == 4                                   # the raw table: 2 tokens for a noisy 1.3 s


@pytest.mark.parametrize("overlapped", [False, True])
def test_quiet_plain_stretches_choose_what_the_full_choice_would(monkeypatch, overlapped):
    """Plain steps of an unchanged batch repeat the choice unrecomputed until a probe, a
    re-timing or a first look could be due: over an adversary's run (plain throughout, probes,
    re-timings and, with requests joining, first looks from the credit) the widths are those of
    the policy without quiet stretches, step for step, and most steps were quiet."""
    import blockspec.engine.spec_policy as spec_policy
    cost = lambda w: 0.01 * (1 + 0.1 * w)                # noqa: E731

    def run(quiet_steps: int) -> tuple[list[int], int]:
        monkeypatch.setattr(spec_policy, "QUIET_STEPS", quiet_steps)
        policy = SpecPolicy("adaptive", 8, False, [1, 2, 4])
        policy.overlapped = overlapped
        quiet, real = [0], policy._choose_quietly
        policy._choose_quietly = lambda ids: (w := real(ids), quiet.__setitem__(0, quiet[0] + (w is not None)))[0]
        seqs = [SimpleNamespace(request_id=f"r{i}", status=Status.RUNNING,
                                params=SimpleNamespace(greedy=False, temperature=1.0, seed=None)) for i in range(2)]
        chosen, clock = [], 0.0
        for k in range(3000):
            if churn and k % 97 == 96:                     # a row finishes; a request joins
                seqs[0].status = Status.FINISHED
            w = policy.choose(seqs)
            chosen.append(w)
            clock += cost(w)
            policy.observe(seqs, w, StepResult([[0]] * 2, [0] * 2, [w - 1] * 2, [[]] * 2), now=clock,
                           next_width=w if overlapped else None)
            if seqs[0].status is Status.FINISHED:
                policy.forget(seqs[0].request_id)
                seqs = [SimpleNamespace(request_id=f"n{k}", status=Status.RUNNING, params=seqs[1].params), seqs[1]]
        return chosen, quiet[0], policy.look_worth

    for churn in (False, True):
        if churn:       # exploration at its whole rate and a cheap full width: looks come soon after joins
            monkeypatch.setattr(spec_policy, "MIN_EXPLORE_SCALE", 1.0)
            cost = lambda w: 0.01 * (1 + 0.02 * w)        # noqa: E731
        full, none_quiet, _ = run(0)
        quiet, quiet_steps, look_worth = run(8)
        assert none_quiet == 0 and quiet == full
        assert set(full[200:]) == {1, 2, 4, 8} and quiet_steps > 0.5 * len(full)
    # With churn, first looks stopped being free early on (they never changed the choice), and
    # joining requests waited for the credit (still wanted during the stretches).
    assert look_worth < 0.1


def test_a_pending_context_write_is_charged_to_leaving_plain_not_to_staying_speculative():
    """A chain that beats plain by half on its steady cost loses to plain while the deferred
    context's write (timed at 1.5 plain steps) would come first; with nothing pending (the
    batch already speculating) it wins."""
    policy = SpecPolicy("adaptive", 4, False, [1])
    for w, c in {1: 1.0, 2: 1.95, 4: 2.0}.items():
        for _ in range(2):
            policy.cost.observe(1, w, c)
    policy._looked.add("r")
    for _ in range(30):                        # 2 drafts accepted a step at width 4: 3 tokens for 2.0 s
        policy.acceptance.observe_step(["r"], lambda i: "greedy", [[1, 2]], 4)
    seqs = [SimpleNamespace(request_id="r", status=Status.RUNNING, params=SimpleNamespace(greedy=True, temperature=0.0, seed=None))]
    pending = [True]
    policy.context_pending = lambda: pending[0]
    assert policy.choose(seqs) == 4            # no write timed yet: nothing to charge
    policy._quiet = None                       # (the pending write stood in for, not a step run: no stretch)
    for _ in range(3):
        policy.observe_flush(1.5)
    policy.observe_flush(9.0)                  # a stall among the writes: the lower quartile ignores it
    assert policy.choose(seqs) == 1            # 3 tokens for 3.5 s lose to 1 for 1.0
    pending[0] = False                         # (only a drafting step clears it, and ends a quiet stretch)
    policy._quiet = None
    assert policy.choose(seqs) == 4


@pytest.mark.parametrize("overlapped", [False, True])
def test_a_plain_steps_short_observe_leaves_what_the_full_one_would(monkeypatch, overlapped):
    """A plain step of an unchanged batch's `observe` only files its timing for later and counts
    the acceptance model's plain stretch: over a run that settles on plain, with step costs drifting, rows whose
    acceptance differs from their class's, and rows finishing and joining, the widths, the cost
    tables and the acceptance figures equal the full observe's, and most steps took the short
    path."""
    def run(short: bool):
        policy = SpecPolicy("adaptive", 8, False, [1, 2, 4])
        policy.overlapped = overlapped
        taken, real = [0], policy.acceptance.extend_stretch
        policy.acceptance.extend_stretch = (lambda ids: (ok := real(ids), taken.__setitem__(0, taken[0] + ok))[0]) \
            if short else (lambda ids: False)
        seqs = [SimpleNamespace(request_id=f"r{i}", status=Status.RUNNING,
                                params=SimpleNamespace(greedy=False, temperature=1.0, seed=None)) for i in range(2)]
        chosen, clock = [], 0.0
        for k in range(3000):
            if k % 700 == 699:                            # a row finishes in its step; another joins
                seqs[0].status = Status.FINISHED
            w = policy.choose(seqs)
            chosen.append(w)
            clock += 0.01 * w * (2 - k / 3000) * (1 + 0.3 * ((k * 7) % 5 == 0))    # steps get cheaper
            paths = [[1] if w > 1 else [], []]            # row 0 accepts a draft, row 1 none
            policy.observe(seqs, w, StepResult([[0]] * 2, [len(p) for p in paths], [w - 1] * 2, paths), now=clock,
                           next_width=w if overlapped else None)
            if seqs[0].status is Status.FINISHED:
                policy.forget(seqs[0].request_id)
                seqs = [SimpleNamespace(request_id=f"n{k}", status=Status.RUNNING, params=seqs[1].params), seqs[1]]
        ids = [s.request_id for s in seqs]
        return (chosen, policy.cost.table(2), policy.acceptance.expected_totals(ids, lambda i: "t<=1"),
                dict(policy.choices)), taken[0]

    full, _ = run(short=False)
    short, taken = run(short=True)
    assert short == full
    assert taken > 0.5 * len(full[0])


def test_a_quiet_stretch_ends_before_a_waiting_first_look_could_be_paid():
    """A joining request's first look, not free and waiting for the credit, runs at the first
    step the credit allows it, as without quiet stretches: the stretch after a plain choice
    ends before then."""
    policy = SpecPolicy("adaptive", 4, False, [2])
    for w, c in {1: 1.0, 2: 1.5, 4: 2.0}.items():
        for _ in range(2):
            policy.cost.observe(2, w, c)
    seqs = [SimpleNamespace(request_id=r, status=Status.RUNNING, params=SimpleNamespace(greedy=False, temperature=1.0, seed=None))
            for r in ("old", "new")]
    for _ in range(5):                                     # drafts always rejected: plain wins
        policy.acceptance.observe_step(["old", "new"], lambda i: "t<=1", [[], []], 4)
    policy._looked.add("old")
    policy.look_worth, policy._since_probe, policy.probe_interval = 0.0, 0, 16   # a look waits for credit
    policy._credit = 1.0 - 0.075                          # the look's spend (2.0 − 1.0) less 2.5 steps' credit
    assert policy.choose(seqs) == 1 and policy._look_wanted
    assert policy._quiet is not None and policy._quiet[1] == 1   # a stretch, though a look is wanted: one step
    assert [policy.choose(seqs) for _ in range(2)] == [1, 4]


def test_a_cold_buckets_bounds_are_kept_for_a_few_choices_and_redone_when_a_width_is_timed(monkeypatch):
    """`ColdBuckets.bounds` is computed once per COLD_RECHECK choices of a bucket, and again at
    once when the bucket's timed widths change."""
    from blockspec.engine.cold_bucket import COLD_RECHECK
    policy = SpecPolicy("adaptive", 8, False, [1, 2])
    for _ in range(2):
        policy.cost.observe(1, 8, 4.0)
    calls = []
    real = policy.cost.floor_from_smaller
    monkeypatch.setattr(policy.cost, "floor_from_smaller", lambda B, w: (calls.append(w), real(B, w))[1])
    timed = {8: 4.0}
    first = policy.cold.bounds(2, timed, "sampled")
    assert sorted(calls) == [1, 2, 4]                              # one floor per untimed width
    for _ in range(COLD_RECHECK - 1):
        assert policy.cold.bounds(2, timed, "sampled") is first
    assert len(calls) == 3
    policy.cold.bounds(2, timed, "sampled")                       # kept long enough: redone
    assert len(calls) == 6
    policy.cold.bounds(2, {1: 1.0, 8: 4.0}, "sampled")            # plain timed since: redone at once
    assert len(calls) == 8


def test_a_width_timed_out_of_order_is_retimed_before_the_turn():
    """A width timed dearer than a wider one (one noisy pair of samples: chain 8 at 1.5 ms beside
    chain 16's 1.0 ms) is re-timed at the next even re-timing, not when the turn reaches it;
    with the table in order the turn decides."""
    def next_retiming(costs: dict[int, float], probes: int = 0) -> int:
        policy = SpecPolicy("adaptive", 16, False, [1])
        policy._probes = probes                                       # re-timings run so far
        for w, c in costs.items():
            for _ in range(2):
                policy.cost.observe(1, w, c)
        others = [w for w in policy._widest_first if w != 16]
        return policy._next_retiming(1, others, monotone_costs(policy.cost.table(1)), 16)[0]
    in_order = {1: 0.7, 2: 0.72, 4: 0.99, 8: 1.0, 16: 1.01}
    assert next_retiming(in_order) == 8                                # the turn: widest other first
    assert next_retiming({**in_order, 2: 0.5, 8: 1.5}) == 1            # plain above chain 2: narrowest first
    assert next_retiming({**in_order, 8: 1.5}) == 8
    assert next_retiming({**in_order, 4: 0.71}) == 2                   # chain 2 above chain 4: narrowest first
    # Every other re-timing only: an inversion that persists does not starve the turn.
    assert next_retiming({**in_order, 8: 1.5}, probes=1) == 4 and next_retiming({**in_order, 8: 1.5}, probes=2) == 8


def test_speculative_quiet_stretches_lag_a_change_by_at_most_their_length(monkeypatch):
    """After a speculative choice the same batch's next `spec_quiet_steps` steps repeat it
    unrecomputed (every step still teaches the acceptance model). Over an oracle's run they
    choose what full choices choose; when the drafts turn bad the choice leaves the full width
    at most that many steps later, and full choices ran on a fraction of the steps."""
    import blockspec.engine.spec_policy as spec_policy
    monkeypatch.setattr(spec_policy, "MIN_EXPLORE_SCALE", 1.0)
    cost = lambda w: 0.01 * (1 + 0.1 * w)                 # noqa: E731

    def run(quiet_steps: int, turn: int | None) -> tuple[list[int], int]:
        policy = SpecPolicy("adaptive", 8, False, [1, 2, 4])
        policy.spec_quiet_steps = quiet_steps
        full, real = [0], policy._choose
        policy._choose = lambda seqs, ids: (full.__setitem__(0, full[0] + 1), real(seqs, ids))[1]
        seqs = [SimpleNamespace(request_id=f"r{i}", status=Status.RUNNING,
                                params=SimpleNamespace(greedy=True, temperature=0.0, seed=None)) for i in range(2)]
        chosen, clock = [], 0.0
        for k in range(400):
            w = policy.choose(seqs)
            chosen.append(w)
            acc = w - 1 if turn is None or k < turn else 0
            clock += cost(w)
            policy.observe(seqs, w, StepResult([[0]] * 2, [acc] * 2, [w - 1] * 2, [list(range(1, acc + 1))] * 2),
                           now=clock)
        return chosen, full[0]

    every, every_full = run(0, None)
    quiet, quiet_full = run(4, None)
    assert quiet == every and every.count(8) > 300 and quiet_full < 0.4 * every_full
    turn = 200
    every, _ = run(0, turn)
    quiet, _ = run(4, turn)
    left = lambda chosen: next(k for k in range(turn, 400) if chosen[k] != 8)     # noqa: E731
    assert quiet[:turn] == every[:turn] and left(every) <= left(quiet) <= left(every) + 4
    assert quiet[left(quiet) + 20:].count(1) > 0.8 * len(quiet[left(quiet) + 20:])   # then plain, as full choices


def test_a_retiming_from_an_untimed_width_reads_only_timed_costs():
    """The width chosen may be one a cold bucket skipped (an estimate standing in for its cost):
    the next re-timing's pick compares timed widths only."""
    policy = SpecPolicy("adaptive", 16, False, [1])
    for w, c in {1: 0.7, 2: 0.72, 8: 1.5, 16: 1.0}.items():
        for _ in range(2):
            policy.cost.observe(1, w, c)
    costs = {**policy.cost.table(1), 4: 0.9}                  # chain 4 untimed, estimated
    assert policy._next_retiming(1, [16, 8, 2, 1], monotone_costs(costs), 4)[0] == 8   # out of order with 16
