"""`blockspec check lossless` on the 12-token Qwen3 with a random DFlash drafter: passes with its
negative control detected, fails on a lossy verifier, and says when it lacks power."""

from __future__ import annotations

import json

import pytest
import torch

import blockspec.speculative.step as step_module
from blockspec.sampling import SamplingParams
from blockspec.speculative.verify import verify_tree
from blockspec.validation.check_lossless import LosslessCheckConfig, settings_from_lists
from bench_servers import run_cli
from dflash_fixtures import write_dflash_drafter

PROMPT_IDS = "1,4,2,7"


@pytest.fixture(scope="module")
def drafter(tiny_vocab_dir, tmp_path_factory):
    return str(write_dflash_drafter(tmp_path_factory.mktemp("lossless_drafter"), tiny_vocab_dir, block_size=8,
                                    std=0.3))


def run_check(model: str, drafter: str, tmp_path, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "lossless.json"
    code = run_cli(["check", "lossless", "--model", model, "--draft-model", drafter, "--spec", "dflash",
                    "--block-size", "4", "--prompt-ids", PROMPT_IDS, "--output", str(out), *extra])
    return code, json.loads(out.read_text())


def test_speculative_sampling_passes_and_the_control_is_detected(tiny_vocab_dir, drafter, tmp_path, capsys):
    code, report = run_check(tiny_vocab_dir, drafter, tmp_path, "--num-samples", "4000", "--num-tokens", "2",
                             "--temperature", "1.0")
    assert code == 0, capsys.readouterr().out
    assert report["passed"] and report["verdict"] == "PASS"
    (setting,) = report["settings"]
    assert setting["mode"] == "exact"  # 12^2 cells: the target's law is enumerated
    assert setting["test"]["p_value"] > report["alpha"] and setting["test"]["dof"] > 5
    assert setting["control"]["p_value"] < report["alpha"]
    assert setting["accepted_tokens"] > 0  # drafts were accepted, so the verifier's accept path was exercised
    printed = capsys.readouterr().out
    assert "control x1.1" in printed and "detected" in printed and printed.rstrip().endswith("PASS")


def over_accepting_verify_tree(target_probs, node_tokens, parents, uniforms):
    """A lossy verifier: every drafted child counts twice in the distribution it is checked against."""
    weights = torch.ones_like(target_probs)
    rows = torch.arange(target_probs.shape[0])
    for i in range(1, node_tokens.shape[1]):
        real = parents[:, i] >= 0
        weights[rows[real], parents[real, i], node_tokens[real, i]] = 2.0
    boosted = target_probs * weights
    return verify_tree(boosted / boosted.sum(-1, keepdim=True), node_tokens, parents, uniforms)


def test_a_lossy_verifier_fails(tiny_vocab_dir, drafter, tmp_path, monkeypatch):
    monkeypatch.setattr(step_module, "verify_tree", over_accepting_verify_tree)
    code, report = run_check(tiny_vocab_dir, drafter, tmp_path, "--num-samples", "4000", "--num-tokens", "2",
                             "--temperature", "1.0", "--spec-verify", "target-only")   # the rule it breaks
    assert code == 1
    assert report["settings"][0]["test"]["p_value"] < report["alpha"]
    assert report["verdict"].startswith("FAIL: speculative samples do not follow")


def test_too_few_samples_to_see_the_control_is_reported_as_lack_of_power(tiny_vocab_dir, drafter, tmp_path):
    code, report = run_check(tiny_vocab_dir, drafter, tmp_path, "--num-samples", "200", "--num-tokens", "1",
                             "--temperature", "1.0", "--control-factor", "1.02")
    assert code == 1
    (setting,) = report["settings"]
    assert setting["test"]["p_value"] > report["alpha"]  # the method itself looked fine …
    assert setting["control"]["p_value"] > report["alpha"]  # … but the test could not have seen a bias
    assert "lacks power" in report["verdict"]


def test_two_sample_mode_against_plain_sampling(tiny_vocab_dir, drafter, tmp_path):
    code, report = run_check(tiny_vocab_dir, drafter, tmp_path, "--mode", "two-sample", "--num-samples", "1500",
                             "--num-tokens", "1", "--temperature", "0.8", "--top-k", "6", "--control-factor", "1.5")
    (setting,) = report["settings"]
    assert setting["mode"] == "two-sample" and setting["test"]["num_samples"] == 3000
    assert code == 0, report


def test_settings_lists_are_zipped_and_broadcast():
    assert settings_from_lists(None, None, None, None)[0] == SamplingParams(temperature=1.0)
    settings = settings_from_lists([1.0, 0.7], [0.9], None, [0.0, 0.05])
    assert [(s.temperature, s.top_p, s.min_p) for s in settings] == [(1.0, 0.9, 0.0), (0.7, 0.9, 0.05)]
    with pytest.raises(ValueError, match="--top-k has 2 values"):
        settings_from_lists([1.0, 0.7, 0.5], None, [1, 2], None)


@pytest.mark.parametrize("overrides, message", [
    ({"spec": "none"}, "must not be none"),
    ({"settings": [SamplingParams(temperature=0.0)]}, "temperature 0 is greedy"),
    ({"control_factor": 1.0}, "control-factor"),
])
def test_bad_configurations_are_value_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        LosslessCheckConfig(model="m", **overrides).validate()
