"""/metrics (Prometheus text), /health, /v1/models, and the periodic 'Decode batch' log line."""

from __future__ import annotations

import asyncio
import logging
import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from blockspec.engine.outputs import SpecMetrics, StepOutput
from blockspec.sampling import SamplingParams
from blockspec.server.async_engine import AsyncEngine
from blockspec.server.stats_log import StatsLogger, format_stats_line
from blockspec.server.metrics import ServerMetrics
from live import live_server
from fake_engine import FakeEngine, FakeStats

COUNTERS = ["blockspec:prompt_tokens_total", "blockspec:generation_tokens_total",
            "blockspec:spec_draft_tokens_total", "blockspec:spec_accepted_tokens_total",
            "blockspec:spec_verify_steps_total"]
GAUGES = ["blockspec:num_requests_running", "blockspec:num_requests_waiting",
          "blockspec:kv_cache_usage_ratio", "blockspec:spec_accept_length"]
LINE = re.compile(r"Decode batch, #running-req: (\d+), #token: (\d+), token usage: (\d+\.\d\d), "
                  r"accept len: (\d+\.\d\d), gen throughput \(token/s\): (\d+\.\d\d), #queue-req: (\d+)"
                  r"(?:, spec config: [a-z0-9]+ \d+%(?: [a-z0-9]+ \d+%)*)?$")


def scrape(http: httpx.Client) -> dict[tuple, float]:
    """{(sample name, sorted labels): value} from /metrics, through the official parser."""
    r = http.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def value(samples: dict, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_metrics_parse_and_counters_move(http, server, model_name):
    before = scrape(http)
    for name in COUNTERS + GAUGES:
        value(before, name)  # every metric is exported from the start
    prompt = "alpha bravo charlie"
    r = http.post("/v1/completions", json={"model": model_name, "prompt": prompt, "max_tokens": 6,
                                           "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200
    assert server.wait_until_idle()
    after = scrape(http)

    def grew(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("blockspec:requests_total", finish_reason="length") == 1
    assert grew("blockspec:requests_total", finish_reason="stop") == 0
    assert grew("blockspec:prompt_tokens_total") == r.json()["usage"]["prompt_tokens"]
    assert grew("blockspec:generation_tokens_total") == 6
    assert grew("blockspec:time_to_first_token_seconds_count") == 1
    assert grew("blockspec:time_per_output_token_seconds_count") == 1
    spec = r.json()["spec_decoding"]
    assert grew("blockspec:spec_verify_steps_total") == spec["verify_steps"]
    assert grew("blockspec:spec_draft_tokens_total") == spec["drafted_tokens"]
    assert grew("blockspec:spec_accepted_tokens_total") == spec["accepted_tokens"]
    assert value(after, "blockspec:num_requests_running") == 0
    assert value(after, "blockspec:num_requests_waiting") == 0
    assert 0.0 <= value(after, "blockspec:kv_cache_usage_ratio") <= 1.0
    if spec["verify_steps"]:
        assert value(after, "blockspec:spec_accept_length") >= 1.0


def test_two_apps_in_one_process_have_separate_registries():
    with live_server(FakeEngine()) as a, live_server(FakeEngine()) as b:
        httpx.post(a.url("/v1/completions"), json={"model": "fake-model", "prompt": "alpha", "max_tokens": 3})
        assert a.wait_until_idle()
        with httpx.Client(base_url=a.base_url) as ca, httpx.Client(base_url=b.base_url) as cb:
            assert value(scrape(ca), "blockspec:generation_tokens_total") == 3
            assert value(scrape(cb), "blockspec:generation_tokens_total") == 0


def test_accept_length_gauge_is_the_ratio_over_recent_requests():
    metrics = ServerMetrics(recent_requests=2)
    for i, (committed, steps) in enumerate([(100, 10), (6, 3), (9, 3)]):
        m = SpecMetrics("dflash", verify_steps=steps, committed_tokens=committed)
        metrics.on_outputs([StepOutput(f"r{i}", [1], "x", True, "stop", 1, committed, m)], now=0.0)
    assert metrics.accept_length._value.get() == pytest.approx((6 + 9) / (3 + 3))  # r0 fell out


def test_health_and_models(http, model_name, server):
    r = http.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    models = http.get("/v1/models").json()
    assert models["object"] == "list"
    assert [(m["id"], m["object"]) for m in models["data"]] == [(model_name, "model")]
    assert models["data"][0]["max_model_len"] == server.async_engine.max_model_len


def test_health_reports_a_stopped_engine():
    with live_server(FakeEngine()) as s:
        s.async_engine.shutdown()
        r = httpx.get(s.url("/health"))
        assert r.status_code == 503
        assert r.json()["error"]["type"] == "server_error"
        r = httpx.post(s.url("/v1/completions"), json={"model": "fake-model", "prompt": "alpha"})
        assert r.status_code == 503


# ---- the periodic log line ----------------------------------------------------------------

def _out(rid: str, n_new: int, verify_steps: int, committed: int, finished=False) -> StepOutput:
    m = SpecMetrics("dflash", verify_steps=verify_steps, committed_tokens=committed)
    return StepOutput(rid, [7] * n_new, "w" * n_new, finished, "length" if finished else None, 3, committed, m)


def test_stats_logger_logs_once_per_interval_with_window_numbers(caplog):
    caplog.set_level(logging.INFO, logger="blockspec")
    log = StatsLogger(interval=1.0)
    stats = FakeStats(num_running=2, num_waiting=5, kv_tokens_used=30, kv_tokens_total=120)
    # t = 0.0 .. 1.0: two requests, 4 steps each of 0.25 s; request a commits 3/step, b 1/step.
    for k in range(1, 5):
        log.on_outputs([_out("a", 3, k, 3 * k), _out("b", 1, k, k)], now=0.25 * k)
        log.on_step_done(stats, 0.25, now=0.25 * k)
    lines = [r.getMessage() for r in caplog.records if r.name == "blockspec"]
    assert lines == [format_stats_line(stats, accept_length=2.0, throughput=16.0)]
    assert LINE.match(lines[0]).groups() == ("2", "30", "0.25", "2.00", "16.00", "5")


def test_stats_logger_is_quiet_when_idle_and_restarts_its_window(caplog):
    caplog.set_level(logging.INFO, logger="blockspec")
    log = StatsLogger(interval=1.0)
    stats = FakeStats(1, 0, 10, 100)
    log.on_outputs([_out("a", 1, 1, 1)], now=0.1)
    log.on_step_done(stats, 0.1, now=0.1)
    log.on_idle(stats, now=0.2)
    # A step long after the idle period starts a new window instead of logging a diluted rate.
    log.on_outputs([_out("b", 2, 1, 2)], now=100.0)
    log.on_step_done(stats, 0.5, now=100.0)
    assert not caplog.records
    log.on_outputs([_out("b", 2, 2, 4)], now=100.5)
    log.on_step_done(stats, 0.5, now=100.5)
    assert [r.getMessage() for r in caplog.records] == [format_stats_line(stats, 2.0, 4.0)]


def test_log_line_appears_periodically_while_busy(caplog):
    caplog.set_level(logging.INFO, logger="blockspec")
    engine = FakeEngine(step_delay=0.01)
    async_engine = AsyncEngine(engine, observers=[StatsLogger(interval=0.05)])

    async def run() -> None:
        params = SamplingParams(temperature=0, max_tokens=60)
        async for _ in async_engine.generate("r", [5, 6], params):
            pass
    try:
        asyncio.run(asyncio.wait_for(run(), 20))
        # The step that finished the request may log just after its output reached us.
        asyncio.run(asyncio.sleep(0.1))
        busy_lines = [r.getMessage() for r in caplog.records if r.name == "blockspec"]
        asyncio.run(asyncio.sleep(0.2))  # idle: no more lines
        idle_lines = [r.getMessage() for r in caplog.records if r.name == "blockspec"]
    finally:
        async_engine.shutdown()
    assert len(busy_lines) >= 2
    assert all(LINE.match(line) for line in busy_lines), busy_lines
    assert idle_lines == busy_lines


def test_stats_line_and_metrics_count_the_policy_configurations():
    from blockspec.engine.outputs import SpecMetrics, StepOutput
    from blockspec.server.metrics import ServerMetrics, configuration_width
    stats = type("S", (), {"num_running": 1, "num_waiting": 0, "kv_tokens_used": 8, "kv_tokens_total": 64})()
    line = format_stats_line(stats, 2.0, 10.0, {"plain": 1, "chain16": 3})
    assert LINE.match(line) and line.endswith(", spec config: chain16 75% plain 25%")
    assert [configuration_width(n) for n in ("plain", "chain4", "tree7")] == [1, 4, 8]
    with pytest.raises(ValueError, match="configuration"):
        configuration_width("fast")
    metrics = ServerMetrics()
    m = SpecMetrics("dflash")
    for name in ("chain16", "plain", "chain16"):
        m.record_step(3, 1, 2, name)
    metrics.on_outputs([StepOutput("r", [1], "", True, "length", 1, 6, m)], 0.0)
    text = metrics.render().decode()
    assert 'blockspec:spec_configuration_steps_total{configuration="chain16"} 2.0' in text
    assert "blockspec:spec_verify_width_count 3.0" in text and "blockspec:spec_verify_width_sum 33.0" in text
