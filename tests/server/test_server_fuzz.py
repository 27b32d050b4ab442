"""Fuzzing the live server (fake engine) from its own published OpenAPI schema with schemathesis:
bodies that fit the schema and bodies that break it, for every operation. No answer may be a
5xx, none may hang, and afterwards nothing is left in the engine and /health answers at once.

Bounded: a fixed number of examples per operation and mode (about a minute in all on the test
machine), each request with a timeout.
"""

from __future__ import annotations

import collections
import time

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from fake_engine import FakeEngine
from hardening import assert_still_serves, ordinary_completion
from live import live_server

MODEL = "fake-model"
REQUEST_TIMEOUT_S = 15  # a hang is a failure, not a stuck test
POSITIVE, NEGATIVE = GenerationMode.POSITIVE, GenerationMode.NEGATIVE
# (method, path, mode, examples); negative data needs a part to break (a body or a parameter).
PLAN = [("POST", "/v1/chat/completions", POSITIVE, 500), ("POST", "/v1/chat/completions", NEGATIVE, 500),
        ("POST", "/v1/completions", POSITIVE, 500), ("POST", "/v1/completions", NEGATIVE, 500),
        ("GET", "/v1/models/{model_id}", POSITIVE, 30),
        ("GET", "/v1/models", POSITIVE, 5), ("GET", "/health", POSITIVE, 5), ("GET", "/metrics", POSITIVE, 5)]


@pytest.fixture(scope="module")
def server():
    # Short context and many concurrent requests: a fuzzed n=128 x max_tokens request ends fast.
    engine = FakeEngine(max_model_len=48, max_running=256, kv_tokens_total=1 << 16)
    with live_server(engine) as s:
        s.expected = ordinary_completion(s.base_url, MODEL)
        yield s


@pytest.fixture(scope="module")
def schema(server):
    return schemathesis.openapi.from_url(server.url("/openapi.json"), timeout=10)


@pytest.mark.parametrize("method,path,mode,examples", PLAN, ids=[f"{m} {p} {g}" for m, p, g, _ in PLAN])
def test_fuzzed_requests_never_get_a_5xx(server, schema, method, path, mode, examples):
    operation = schema[path][method]
    seen: list[int] = []

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case):
        started = time.monotonic()
        response = case.call(base_url=server.base_url, timeout=REQUEST_TIMEOUT_S)
        seen.append(response.status_code)
        assert response.status_code < 500, (case.as_curl_command(), response.status_code, response.text[:500])
        assert time.monotonic() - started < REQUEST_TIMEOUT_S

    check()
    print(method, path, mode, "statuses:", dict(collections.Counter(seen)))
    assert seen, "no request was sent"
    assert server.wait_until_idle(10), "fuzzed requests left work in the engine"
    assert_still_serves(server.base_url, MODEL, server.expected)


def test_fuzzing_reached_the_engine(server, schema):
    """Positive bodies are generated with the served model's name: some must run in the engine
    (else the fuzz only ever met the validation layer)."""
    assert len(server.engine.prompts) > 10, len(server.engine.prompts)
