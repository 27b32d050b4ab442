"""`blockspec check temperature`: passes against blockspec's speculative server, fails against a
server that is silently greedy on its 'speculative' path."""

from __future__ import annotations

import re

import pytest

from blockspec.validation.temperature import (Completion, TemperatureCheckConfig, TemperatureSamples,
                                              check_not_silently_greedy)
from bench_servers import blockspec_server, greedy_only_app, run_cli, serve_in_thread

SMALL = ["--num-seeds", "6", "--max-tokens", "12", "--repeats", "2"]


def result_rows(output: str) -> dict[str, str]:
    """{check name: PASS/FAIL} from the printed table (name, two spaces or more, verdict)."""
    rows = (re.match(r"^(\S.*?)\s{2,}(PASS|FAIL)(\s|$)", line) for line in output.splitlines())
    return {m.group(1): m.group(2) for m in rows if m}


def test_passes_against_blockspec_ngram_server(qwen3_dir, capsys):
    # Static: the check wants a seeded request's exact text back in a batch and alone, which the
    # adaptive policy promises for the distribution only (docs/adaptive.md).
    with blockspec_server(qwen3_dir, spec="ngram", max_running_requests=8, spec_policy="static") as url:
        code = run_cli(["check", "temperature", "--url", url, *SMALL])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = result_rows(out)
    assert set(rows.values()) == {"PASS"} and len(rows) == 8, rows
    assert "accept length > 1" in rows and "T=1 not silently greedy" in rows


def test_fails_against_a_silently_greedy_speculative_server(capsys):
    with serve_in_thread(greedy_only_app(algorithm="dflash")) as url:
        code = run_cli(["check", "temperature", "--url", url, *SMALL])
    out = capsys.readouterr().out
    assert code == 1
    rows = result_rows(out)
    assert rows["T=1 not silently greedy"] == "FAIL"
    assert rows["T=0.6 different across seeds"] == rows["T=1 different across seeds"] == "FAIL"
    # What a greedy server does get right still passes: the failure is pinned on sampling.
    assert rows["no errors"] == rows["T=0 identical across repeats"] == rows["accept length > 1"] == "PASS"
    assert out.rstrip().endswith("FAIL")


def test_unreachable_server_is_exit_code_2():
    assert run_cli(["check", "temperature", "--url", "http://127.0.0.1:9", "--timeout", "5", *SMALL]) == 2


def test_temperatures_need_zero_and_a_positive_one():
    with pytest.raises(ValueError, match="needs 0"):
        TemperatureCheckConfig(url="http://x", temperatures=[0.6, 1.0]).validate()
    with pytest.raises(ValueError, match="--num-seeds"):
        TemperatureCheckConfig(url="http://x", num_seeds=1).validate()


def _samples(first_tokens: list[str], texts: list[str]) -> TemperatureSamples:
    ok = lambda text: Completion(ok=True, text=text)  # noqa: E731
    return TemperatureSamples(greedy=[ok("A B C")] * 2, greedy_first=ok("A"), seeded={1.0: [ok(t) for t in texts]},
                              alone={1.0: ok(texts[0])}, first={1.0: [ok(f) for f in first_tokens]})


def test_a_peaked_first_token_alone_is_not_a_failure():
    """Every seed starting with the greedy token is what a peaked target does: only identical
    full outputs as well count as 'silently greedy'."""
    peaked = check_not_silently_greedy(_samples(["A"] * 4, ["A B C", "A x y", "A B z", "A q r"]))
    assert peaked.passed and "point mass" in peaked.detail
    greedy = check_not_silently_greedy(_samples(["A"] * 4, ["A B C"] * 4))
    assert not greedy.passed
    varied = check_not_silently_greedy(_samples(["A", "D", "A", "E"], ["A B C"] * 4))
    assert varied.passed
