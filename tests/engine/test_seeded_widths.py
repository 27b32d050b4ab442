"""SeededWidths (engine/seeded_widths.py): a seeded request's widths from its own history alone."""

import pytest

from blockspec.engine.seeded_widths import PROBE_EVERY, SeededWidths, proxy_cost

WIDTHS = [1, 2, 4, 8, 16]


def run(model: SeededWidths, accepted_per_step, steps: int, lag: int = 1) -> list[int]:
    """Widths chosen over `steps` steps when every step at width w accepts
    min(accepted_per_step, w − 1) drafts on a chain; results arrive `lag` steps late."""
    chosen, in_flight = [], []
    for _ in range(steps):
        w = model.next_width("r")
        chosen.append(w)
        in_flight.append(w)
        while len(in_flight) > lag - 1:
            ran = in_flight.pop(0)
            n = min(accepted_per_step, ran - 1)
            model.observe("r", list(range(1, n + 1)), ran)
    return chosen


def test_an_oracle_keeps_the_full_width_and_an_adversary_goes_plain_with_probes():
    assert set(run(SeededWidths(WIDTHS), 15, 40)) == {16}
    adversary = run(SeededWidths(WIDTHS), 0, 48)
    assert adversary[:2] == [16, 16]                          # optimistic until observed
    probes = [k for k, w in enumerate(adversary) if w == 16]
    assert set(adversary[4:]) == {1, 16} and all(k % PROBE_EVERY == PROBE_EVERY - 1 for k in probes if k >= 4)


def test_a_middling_request_settles_between():
    widths = run(SeededWidths(WIDTHS), 2, 40)
    settled = [w for k, w in enumerate(widths[8:], 8) if k % PROBE_EVERY != PROBE_EVERY - 1]
    assert set(settled) == {4}, widths          # 3 tokens a step at width 4 beat plain and 8 / 16 (cost)


def test_the_widths_do_not_depend_on_when_results_arrive():
    """Synchronous (each result before the next choice) and overlapped (one step late) engines
    see the same widths: a step reads only results at least two own steps old."""
    for accepted in (0, 2, 15):
        assert run(SeededWidths(WIDTHS), accepted, 40, lag=1) == run(SeededWidths(WIDTHS), accepted, 40, lag=2)


def test_requests_are_independent_and_forgotten():
    model = SeededWidths(WIDTHS)
    run(model, 0, 20)
    assert model.next_width("other") == 16
    model.forget("r")
    assert model.next_width("r") == 16


def test_proxy_cost():
    assert proxy_cost(1) == 1.0 and proxy_cost(2) < proxy_cost(16)
    with pytest.raises(ValueError):
        SeededWidths(WIDTHS, alpha=0.0)
