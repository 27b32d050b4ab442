"""bench/sampling_summary.py: the accept-length table from acceptance JSONs, and the rebundle rule
of issue 16 (win at every T > 0 setting, lose at most 3 % at T = 0)."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "sampling_summary.py"
spec = importlib.util.spec_from_file_location("sampling_summary", SCRIPT)
S = importlib.util.module_from_spec(spec)
spec.loader.exec_module(S)


def table(before_t0=5.0, arm_t0=4.9, arm_t1=2.2, arm_t06=3.5):
    return {"before": {"chain": {"0": before_t0, "0.6:0.95": 3.0, "1": 1.3},
                       "tree16_sampled": {"0": 6.0, "0.6:0.95": 3.4, "1": 2.0}},
            "kl": {"chain": {"0": arm_t0, "0.6:0.95": 3.1, "1": 1.5},
                   "tree16_sampled": {"0": 6.0, "0.6:0.95": arm_t06, "1": arm_t1}}}


def test_an_arm_that_wins_sampled_and_keeps_greedy_is_the_winner():
    v = S.rebundle_verdict(table())
    assert v["winner"] == "kl" and v["arms"]["kl"]["rebundle"]
    assert v["arms"]["kl"]["sampled"]["1"] == {"arm": 2.2, "before": 2.0, "wins": True}
    assert v["arms"]["kl"]["worst_t0_change"] == pytest.approx(-0.02)


@pytest.mark.parametrize("kwargs", [dict(arm_t0=4.8),                 # −4 % at T = 0 with the chain
                                    dict(arm_t1=1.9),                 # loses at T = 1
                                    dict(arm_t06=3.4)])               # a tie at T = 0.6 is no win
def test_the_rule_refuses(kwargs):
    v = S.rebundle_verdict(table(**kwargs))
    assert v["winner"] is None and not v["arms"]["kl"]["rebundle"]


def test_missing_measurements_never_win():
    t = table()
    del t["kl"]["chain"]["0"], t["kl"]["tree16_sampled"]["0"]
    assert S.rebundle_verdict(t)["winner"] is None
    assert S.rebundle_verdict({"before": table()["before"]})["winner"] is None


def test_accept_table_reads_acceptance_outputs(tmp_path):
    recs = [{"temperature": 0.0, "top_p": 1.0, "accept_length": 4.5}, {"temperature": 0.6, "top_p": 0.95,
            "accept_length": 3.0}, {"temperature": 1.0, "top_p": 1.0, "accept_length": 1.7}]
    (tmp_path / "acc_kl0.5_chain_rejection.json").write_text(json.dumps({"records": recs}))
    (tmp_path / "acc_before_chain.json").write_text(json.dumps({"records": recs[:1]}))
    (tmp_path / "acc_ce_tree16_sampled.json").write_text('{"records": [')      # cut off: skipped
    assert S.accept_table(tmp_path) == {"kl0.5": {"chain_rejection": {"0": 4.5, "0.6:0.95": 3.0, "1": 1.7}},
                                        "before": {"chain": {"0": 4.5}}}
