"""A client that goes away aborts its engine requests (streamed and non-streamed)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from live import build_test_engine, live_server, using_fake_engine
from fake_engine import FakeEngine

LONG = 200  # tokens: far more than are produced before the client hangs up


@pytest.fixture(scope="module")
def server():
    # A slow fake (20 ms per step) so generation is surely still running when the client leaves.
    engine = FakeEngine(step_delay=0.02, max_model_len=512) if using_fake_engine() else build_test_engine()
    with live_server(engine) as s:
        yield s


def _body(server, stream: bool, n: int = 1) -> dict:
    limit = server.async_engine.max_model_len
    return {"model": server.async_engine.model_name, "prompt": "alpha bravo", "n": n, "temperature": 0,
            "max_tokens": min(LONG, limit - 16), "ignore_eos": True, "stream": stream}


def _wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def _aborted_requests(server) -> float:
    text = httpx.get(server.url("/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "blockspec:requests_total" and sample.labels["finish_reason"] == "abort":
                return sample.value
    raise AssertionError("no abort counter")


@pytest.mark.parametrize("n", [1, 2])
def test_stream_disconnect_aborts_the_request(server, n):
    aborts_before = _aborted_requests(server)
    with httpx.Client(base_url=server.base_url, timeout=20) as c:
        with c.stream("POST", "/v1/completions", json=_body(server, stream=True, n=n)) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                    response_id = json.loads(line[6:])["id"]
                    break
    # Leaving the block closed the connection in the middle of the stream.
    expected = {f"{response_id}-{i}" for i in range(n)}
    assert _wait_for(lambda: expected <= set(server.engine.aborted)), server.engine.aborted
    assert server.wait_until_idle()
    assert _aborted_requests(server) == aborts_before + n


def test_non_streamed_disconnect_aborts_the_request(server):
    aborted_before = len(server.engine.aborted)
    payload = json.dumps(_body(server, stream=False)).encode()
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
        assert _wait_for(lambda: server.in_engine_thread(lambda e: e.has_unfinished_requests()))
    assert _wait_for(lambda: len(server.engine.aborted) > aborted_before)
    assert server.wait_until_idle()


def test_server_serves_after_disconnects(server):
    body = {**_body(server, stream=False), "max_tokens": 3}
    r = httpx.post(server.url("/v1/completions"), json=body, timeout=20)
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 3


def test_engine_is_only_called_from_one_thread(server):
    assert len(server.engine.calling_threads) == 1
