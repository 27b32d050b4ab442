"""`python -m blockspec.bench.acceptance`: accept length of drafter snapshots with the engine,
per dataset and temperature, with per-position rates that add up and a plot against steps."""

from __future__ import annotations

import json

import pytest

from blockspec.bench import acceptance
from dflash_fixtures import write_dflash_drafter

BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def drafters(qwen3_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("acceptance")
    return [str(write_dflash_drafter(tmp / f"d{seed}", qwen3_dir, block_size=BLOCK_SIZE, seed=seed))
            for seed in (0, 1)]


def test_records_per_snapshot_dataset_and_temperature(qwen3_dir, drafters, tmp_path):
    out, png = tmp_path / "acc.json", tmp_path / "acc.png"
    assert acceptance.main(["--target", qwen3_dir, "--drafter", f"100={drafters[0]}", "--drafter",
                            f"200={drafters[1]}", "--datasets", "humaneval", "--num-prompts", "2",
                            "--max-tokens", "6", "--batch", "2", "--output", str(out), "--plot", str(png)]) == 0
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("python -m blockspec.bench.acceptance") and doc["device"] == "cpu"
    assert [(r["step"], r["dataset"], r["temperature"]) for r in doc["records"]] == [
        (100, "humaneval", 0.0), (100, "humaneval", 1.0), (200, "humaneval", 0.0), (200, "humaneval", 1.0)]
    for r in doc["records"]:
        assert r["num_prompts"] == 2 and 2 <= r["output_tokens"] <= 12     # unseeded: an EOS may come early
        assert r["drafted_tokens"] == r["verify_steps"] * (BLOCK_SIZE - 1)
        rates = r["acceptance_per_position"]
        assert len(rates) == BLOCK_SIZE - 1 and rates == sorted(rates, reverse=True)
        assert sum(rates) * r["verify_steps"] == pytest.approx(r["accepted_tokens"])
        # committed per step ≤ accepted + 1 (a max_tokens cut can keep fewer)
        assert 1 <= r["accept_length"] <= 1 + r["accepted_tokens"] / r["verify_steps"] + 1e-9
    assert png.stat().st_size > 0


@pytest.mark.parametrize("bad, message", [(["--datasets", "mtbench"], "--datasets"),
                                          (["--drafter", "final"], "--drafter"),
                                          (["--temperatures", "0.6:2"], "--temperatures"),
                                          (["--temperatures", "hot"], "--temperatures")])
def test_bad_arguments_exit_2(qwen3_dir, drafters, tmp_path, capsys, bad, message):
    with pytest.raises(SystemExit) as exc:
        acceptance.main(["--target", qwen3_dir, "--drafter", f"1={drafters[0]}", *bad,
                         "--output", str(tmp_path / "x.json")])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_rejection_verification_is_passed_through(qwen3_dir, drafters, tmp_path):
    out = tmp_path / "rej.json"
    assert acceptance.main(["--target", qwen3_dir, "--drafter", f"1={drafters[0]}", "--datasets", "humaneval",
                            "--num-prompts", "2", "--max-tokens", "6", "--batch", "2", "--temperatures", "1",
                            "--spec-verify", "rejection", "--output", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["spec_verify"] == "rejection" and len(doc["records"]) == 1
    tree_out = tmp_path / "tree.json"                      # sampled DDTree trees, with top_p and a budget
    assert acceptance.main(["--target", qwen3_dir, "--drafter", f"1={drafters[0]}", "--spec", "ddtree",
                            "--budget", "5", "--datasets", "humaneval", "--num-prompts", "2", "--max-tokens", "6",
                            "--batch", "2", "--temperatures", "0.6", "--top-p", "0.95", "--spec-verify", "rejection",
                            "--output", str(tree_out)]) == 0
    tree_doc = json.loads(tree_out.read_text())
    assert (tree_doc["spec"], tree_doc["budget"], tree_doc["top_p"]) == ("ddtree", 5, 0.95)
    assert tree_doc["records"][0]["drafted_tokens"] <= 5 * tree_doc["records"][0]["verify_steps"]
    with pytest.raises(SystemExit) as exc:                 # n-gram drafts are point masses: refused, not ignored
        acceptance.main(["--target", qwen3_dir, "--drafter", f"1={drafters[0]}", "--spec", "ngram",
                         "--spec-verify", "rejection", "--output", str(tmp_path / "no.json")])
    assert exc.value.code == 2


def test_temperature_items_carry_their_own_top_p(qwen3_dir, drafters, tmp_path):
    out = tmp_path / "grid.json"
    assert acceptance.main(["--target", qwen3_dir, "--drafter", f"1={drafters[0]}", "--datasets", "humaneval",
                            "--num-prompts", "2", "--max-tokens", "6", "--batch", "2", "--eager",
                            "--temperatures", "0,0.6:0.95,1", "--top-p", "0.9", "--output", str(out)]) == 0
    recs = json.loads(out.read_text())["records"]
    assert [(r["temperature"], r["top_p"]) for r in recs] == [(0.0, 1.0), (0.6, 0.95), (1.0, 0.9)]
