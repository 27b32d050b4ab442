"""SpecMetrics' counting rules (docs/metrics.md)."""

from blockspec.engine.outputs import SpecMetrics


def test_a_step_without_drafts_counts_under_its_configuration_only():
    m = SpecMetrics(algorithm="dflash")
    m.record_step(15, 3, 4, "chain16")
    for _ in range(3):                         # the adaptive policy's plain steps: no drafts verified
        m.record_step(0, 0, 1, "plain")
    m.record_step(3, 3, 2, "chain4")           # a stop cut the step: 2 of its 3 accepted drafts kept
    assert (m.verify_steps, m.drafted_tokens, m.accepted_tokens, m.committed_tokens) == (2, 18, 5, 6)
    assert m.accept_length == 3.0 and m.configurations == {"chain16": 1, "plain": 3, "chain4": 1}
    assert m.accepted_per_position[:4] == [2, 2, 1, 0]
