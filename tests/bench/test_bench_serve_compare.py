"""`blockspec bench serve --compare-static`: the serving sweep against an adaptive, a plain and a
static server side by side (tiny Qwen3, n-gram speculation), and its argument errors."""

from __future__ import annotations

import contextlib
import json

import pytest

from blockspec.bench.serve_compare import parse_servers
from bench_servers import blockspec_server, run_cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_three_servers_side_by_side(qwen3_dir, tmp_path, capsys):
    with contextlib.ExitStack() as stack:
        urls = {"adaptive": stack.enter_context(blockspec_server(qwen3_dir, spec="ngram", max_running_requests=4)),
                "plain": stack.enter_context(blockspec_server(qwen3_dir, spec="none", max_running_requests=4)),
                "static-ngram8": stack.enter_context(blockspec_server(qwen3_dir, spec="ngram", spec_policy="static",
                                                                      max_running_requests=4))}
        out = tmp_path / "cmp"
        code = run_cli(["bench", "serve", "--compare-static", ",".join(f"{k}={v}" for k, v in urls.items()),
                        "--dataset", "random", "--num-prompts", "4", "--random-input-len", "6", "--max-tokens", "8",
                        "--concurrency", "1,2", "--temperature", "0", "--ignore-eos", "--output-dir", str(out),
                        "--no-progress"])
    assert code == 0
    doc = json.loads((out / "compare.json").read_text())
    assert {(r["configuration"], r["concurrency"]) for r in doc["records"]} == \
        {(name, c) for name in urls for c in (1, 2)}
    assert all(r["completed"] == 4 and r["tok_s"] > 0 for r in doc["records"])
    summary = doc["summary"]["0"]
    assert [s["concurrency"] for s in summary] == [1, 2]
    for s in summary:
        assert s["best_static"] in ("plain", "static-ngram8")
        plain = next(r["tok_s"] for r in doc["records"] if r["configuration"] == "plain" and r["concurrency"] == s["concurrency"])
        assert s["adaptive_vs_plain"] == pytest.approx(s["adaptive_tok_s"] / plain)
    assert (out / doc["plots"]["0"]).read_bytes().startswith(PNG_MAGIC)
    assert "÷ plain" in capsys.readouterr().out


@pytest.mark.parametrize("text, message", [("adaptive=http://a", "plain"), ("plain=u,adaptive", "NAME=URL"),
                                           ("plain=u,adaptive=v,plain=w", "twice")])
def test_bad_server_lists_name_the_flag(text, message):
    with pytest.raises(ValueError, match=message):
        parse_servers(text)


@pytest.mark.parametrize("servers", [[], ["--url", "http://a", "--compare-static", "adaptive=http://a,plain=http://b"]])
def test_url_and_compare_are_exclusive(servers, tmp_path):
    """The CLI turns this ValueError into exit code 2 (blockspec.cli)."""
    with pytest.raises(ValueError, match="--url or --compare-static"):
        run_cli(["bench", "serve", *servers, "--dataset", "random", "--num-prompts", "2", "--output-dir", str(tmp_path)])
