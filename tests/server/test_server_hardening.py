"""Hostile inputs over HTTP to a live server (the fake engine): each gets its OpenAI-style error,
and afterwards /health answers within 100 ms and an ordinary request is served as before."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import pytest

from blockspec.server.limits import DEFAULT_MAX_REQUEST_BYTES, RequestLimits
from blockspec.server.protocol import (ChatCompletionRequest, ChatMessage, CompletionRequest, MAX_STOP_STRING_CHARS,
                                       MAX_STOP_STRINGS)
from fake_engine import FakeEngine
from hardening import (CHAT, COMPLETIONS, assert_health_is_fast, assert_openai_error, assert_probes_fast,
                       assert_still_serves, ordinary_completion, probe_while)
from live import live_server

MODEL = "fake-model"
MESSAGES = [{"role": "user", "content": "alpha bravo"}]
TWENTY_MB = 20 * 1024 * 1024


@pytest.fixture(scope="module")
def server():
    with live_server(FakeEngine(step_delay=0.001), limits=RequestLimits(body_timeout_s=1.0)) as s:
        s.expected = ordinary_completion(s.base_url, MODEL)
        yield s


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=30) as c:
        yield c


def _chat(**changes) -> dict:
    return {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, **changes}


def _completion(**changes) -> dict:
    return {"model": MODEL, "prompt": "alpha bravo", "max_tokens": 4, **changes}


# ---- 1: body size -----------------------------------------------------------------------------

def _post_raw(server, head: bytes, first_bytes: bytes, timeout: float = 5.0) -> bytes:
    """Send a request's headers and the first bytes of its body; read what comes back."""
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head + first_bytes)
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.split(b"\r\n\r\n", 1)[1].endswith(b"}"):
            piece = sock.recv(65536)
            if not piece:
                break
            reply += piece
    return reply


def test_oversized_body_is_refused_before_it_is_sent(server):
    """A declared 20 MB body: 413 after 64 KiB of it, without waiting for the rest."""
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"Content-Length: {TWENTY_MB}\r\n\r\n").encode()
    started = time.monotonic()
    reply = _post_raw(server, head, b'{"model": "fake-model", "messages": [{"role": "user", "content": "'
                      + b"a" * 65536)
    assert time.monotonic() - started < 2.0
    status_line, _, rest = reply.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 413"), reply[:300]
    error = json.loads(rest.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "request_too_large" and str(DEFAULT_MAX_REQUEST_BYTES) in error["message"]
    assert_still_serves(server.base_url, MODEL, server.expected)


def _slow_body(size: int, pause: float):
    """A JSON chat body of `size` bytes, sent in 1 MiB pieces with pauses (in flight a while)."""
    prefix = b'{"model": "fake-model", "messages": [{"role": "user", "content": "'
    suffix = b'"}]}'
    filler = size - len(prefix) - len(suffix)
    yield prefix
    while filler > 0:
        piece = min(filler, 1 << 20)
        yield b"alpha " * (piece // 6) + b"a" * (piece % 6)
        filler -= piece
        time.sleep(pause)
    yield suffix


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_20mb_body_in_flight_leaves_health_and_other_requests_alone(server, declared):
    result = {}

    def send_big():
        headers = {"content-type": "application/json"}
        if declared:
            headers["content-length"] = str(TWENTY_MB)
        started = time.monotonic()
        try:
            result["response"] = httpx.post(server.url(CHAT), content=_slow_body(TWENTY_MB, 0.03),
                                            headers=headers, timeout=60)
        except httpx.TransportError as e:  # e.g. a reset before the 413 could be read: a failure
            result["error"] = e
        result["seconds"] = time.monotonic() - started

    sender = threading.Thread(target=send_big)
    sender.start()
    latencies, chats = probe_while(sender.is_alive, server.base_url,
                                   lambda: httpx.post(server.url(CHAT), json=_chat(temperature=0), timeout=10))
    sender.join(60)
    assert_probes_fast(latencies)
    assert len(latencies) >= 3, "the big body was not in flight long enough to probe"
    for r in chats:
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length", r.text
    assert "error" not in result, result
    assert_openai_error(result["response"], 413, code="request_too_large")
    assert_still_serves(server.base_url, MODEL, server.expected)


def test_trickling_body_times_out(server):
    """A body that stops arriving gets a 408 after the body timeout (1 s here)."""
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"Content-Length: 1000\r\n\r\n").encode()
    started = time.monotonic()
    reply = _post_raw(server, head, b'{"model": ', timeout=10)
    assert 0.9 < time.monotonic() - started < 5
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b'"request_timeout"' in reply
    assert_still_serves(server.base_url, MODEL, server.expected)


def test_unread_stream_does_not_hold_the_engine():
    """A client that never reads its stream: the engine still finishes the request at max_tokens
    (its capacity is freed) while the response waits on the full socket."""
    engine = FakeEngine(max_model_len=512, max_running=32)
    with live_server(engine) as s:
        expected = ordinary_completion(s.base_url, MODEL)
        payload = json.dumps(_completion(n=32, max_tokens=400, ignore_eos=True, stream=True)).encode()
        head = (f"POST {COMPLETIONS} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n").encode()
        host, port = s.base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills after a few chunks
            sock.sendall(head + payload)
            deadline = time.monotonic() + 10
            while len(s.engine.prompts) < 1 + 32 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(s.engine.prompts) == 1 + 32, "the streamed request never reached the engine"
            assert s.wait_until_idle(20), "an unread stream kept its requests in the engine"
            assert not s.engine.aborted  # they finished at max_tokens
            assert_still_serves(s.base_url, MODEL, expected)


# ---- 2, 3, 5, 6, 7: bodies ------------------------------------------------------------------------

@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("raw", [b'{"model": "fake-model", "messages": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
                                 b'{"model": "fake-model", "prompt": ' + b'{"a":' * 10_000 + b"1" + b"}" * 10_001,
                                 b'{"model": "fake-model", "prompt": "x", "temperature": NaN}'],
                         ids=["nested-lists", "nested-objects", "NaN"])
def test_unparseable_json(server, http, path, raw):
    r = http.post(path, content=raw, headers={"content-type": "application/json"})
    assert "could not parse the JSON body" in assert_openai_error(r, 400)["message"]
    assert_still_serves(server.base_url, MODEL, server.expected)


SURROGATE = '"\\ud800"'  # the JSON escape of a lone surrogate, as a client sends it


@pytest.mark.parametrize("path,template,param", [
    (COMPLETIONS, '{"model": "fake-model", "prompt": %s}', "prompt"),
    (COMPLETIONS, '{"model": "fake-model", "prompt": ["alpha", %s]}', "prompt[1]"),
    (COMPLETIONS, '{"model": "fake-model", "prompt": "alpha", "stop": [%s]}', "stop[0]"),
    (CHAT, '{"model": "fake-model", "messages": [{"role": "user", "content": %s}]}', "messages[0].content"),
    (CHAT, '{"model": "fake-model", "messages": [{"role": "user", "content": [{"type": "text", "text": %s}]}]}',
     "messages[0].content[0].text"),
    (CHAT, '{"model": %s, "messages": [{"role": "user", "content": "alpha"}]}', "model"),
], ids=["prompt", "prompt-list", "stop", "content", "content-part", "model"])
def test_lone_surrogate_is_a_400_naming_the_field(server, http, path, template, param):
    r = http.post(path, content=(template % SURROGATE).encode(), headers={"content-type": "application/json"})
    assert "surrogate" in assert_openai_error(r, 400, param=param)["message"]
    assert_still_serves(server.base_url, MODEL, server.expected)


BAD_VALUES = [  # (path, changes, param): each one a 400 naming the field
    (COMPLETIONS, {"stop": [""]}, "stop"),
    (COMPLETIONS, {"stop": ""}, "stop"),
    (CHAT, {"stop": ["alpha", ""]}, "stop"),
    (COMPLETIONS, {"stop": ["x"] * (MAX_STOP_STRINGS + 1)}, "stop"),
    (COMPLETIONS, {"stop": "y" * (MAX_STOP_STRING_CHARS + 1)}, "stop"),
    (CHAT, {"temperature": 3}, "temperature"),
    (CHAT, {"temperature": 2.0001}, "temperature"),
    (COMPLETIONS, {"top_p": 1.5}, "top_p"),
    (COMPLETIONS, {"min_p": -0.1}, "min_p"),
    (CHAT, {"presence_penalty": 2.5}, "presence_penalty"),
    (CHAT, {"frequency_penalty": -3}, "frequency_penalty"),
    (CHAT, {"top_logprobs": 21}, "top_logprobs"),
    (COMPLETIONS, {"logprobs": 6}, "logprobs"),
    (CHAT, {"logit_bias": {"5": 101}}, "logit_bias"),
    (COMPLETIONS, {"max_tokens": "8"}, "max_tokens"),
    (COMPLETIONS, {"max_tokens": 8.0}, "max_tokens"),
    (CHAT, {"max_completion_tokens": "8"}, "max_completion_tokens"),
    (COMPLETIONS, {"seed": "42"}, "seed"),
    (CHAT, {"n": "2"}, "n"),
    (CHAT, {"temperature": "0.5"}, "temperature"),
    (COMPLETIONS, {"stream": "true"}, "stream"),
    (COMPLETIONS, {"ignore_eos": 1}, "ignore_eos"),
    (COMPLETIONS, {"prompt": [1, "2"]}, "prompt"),
    (COMPLETIONS, {"stop_token_ids": ["3"]}, "stop_token_ids[0]"),
]


@pytest.mark.parametrize("path,changes,param", BAD_VALUES,
                         ids=[f"{next(iter(c))}={next(iter(c.values()))!r}"[:40] for _, c, _ in BAD_VALUES])
def test_out_of_range_and_mistyped_values(server, http, path, changes, param):
    body = _chat(**changes) if path == CHAT else _completion(**changes)
    assert_openai_error(http.post(path, json=body), 400, param=param)
    assert_still_serves(server.base_url, MODEL, server.expected)


@pytest.mark.parametrize("changes", [{"temperature": 2}, {"temperature": 0}, {"top_p": 1}, {"seed": 42},
                                     {"stop": ["x"] * MAX_STOP_STRINGS}, {"presence_penalty": 0.0}])
def test_values_at_the_edges_are_accepted(http, changes):
    r = http.post(COMPLETIONS, json=_completion(**changes))
    assert r.status_code == 200, r.text


# ---- 8: Content-Type ------------------------------------------------------------------------------

@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_non_json_content_type_is_refused_like_openai(server, http, content_type):
    r = http.post(CHAT, content=json.dumps(_chat()).encode(), headers={"content-type": content_type})
    error = assert_openai_error(r, 400, code="unsupported_content_type")
    assert content_type in error["message"]
    assert_still_serves(server.base_url, MODEL, server.expected)


@pytest.mark.parametrize("headers", [{"content-type": "application/json; charset=utf-8"},
                                     {"content-type": "Application/JSON"}, {}])
def test_json_content_types_are_accepted(http, headers):
    r = http.post(CHAT, content=json.dumps(_chat()).encode(), headers=headers)
    assert r.status_code == 200, r.text


# ---- 9: a 500 is one log line ---------------------------------------------------------------------

class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def test_a_500_is_logged_once_with_its_request_id():
    engine = FakeEngine()
    ours, uvicorn_errors = _Records(), _Records()
    blockspec_logger, uvicorn_logger = logging.getLogger("blockspec"), logging.getLogger("uvicorn.error")
    old_level = blockspec_logger.level
    blockspec_logger.addHandler(ours)
    blockspec_logger.setLevel(logging.DEBUG)
    uvicorn_logger.addHandler(uvicorn_errors)
    try:
        with live_server(engine) as s:
            expected = ordinary_completion(s.base_url, MODEL)

            def broken_encode(text):
                raise RuntimeError("secret internal detail")
            good_encode, engine.tokenizer.encode = engine.tokenizer.encode, broken_encode
            r = httpx.post(s.url(COMPLETIONS), json=_completion(), timeout=10)
            engine.tokenizer.encode = good_encode
            assert "secret internal detail" not in assert_openai_error(r, 500)["message"]
            request_id = r.headers["x-request-id"]
            assert_still_serves(s.base_url, MODEL, expected)
    finally:
        blockspec_logger.removeHandler(ours)
        blockspec_logger.setLevel(old_level)
        uvicorn_logger.removeHandler(uvicorn_errors)
    about_it = [rec for rec in ours.records if request_id in rec.getMessage()]
    errors = [rec for rec in about_it if rec.levelno >= logging.WARNING]
    assert len(errors) == 1, [rec.getMessage() for rec in errors]
    assert "RuntimeError: secret internal detail" in errors[0].getMessage() and errors[0].exc_info is None
    tracebacks = [rec for rec in ours.records if rec.exc_info]
    assert len(tracebacks) == 1 and tracebacks[0].levelno == logging.DEBUG and request_id in tracebacks[0].getMessage()
    assert not [rec for rec in uvicorn_errors.records if rec.levelno >= logging.ERROR]


# ---- 11: the OpenAPI schema -----------------------------------------------------------------------

def _resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def test_openapi_schema_describes_every_accepted_field(server, http):
    schema = http.get("/openapi.json").json()
    assert set(schema["paths"]) >= {CHAT, COMPLETIONS, "/v1/models", "/health"}
    for path, model in ((CHAT, ChatCompletionRequest), (COMPLETIONS, CompletionRequest)):
        body = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        properties = _resolve(schema, body)["properties"]
        assert set(properties) == set(model.model_fields), path
        assert properties["model"]["enum"] == [MODEL]
    message = schema["components"]["schemas"]["ChatMessage"]["properties"]
    assert set(message) == set(ChatMessage.model_fields)
    temperature = schema["components"]["schemas"]["ChatCompletionRequest"]["properties"]["temperature"]
    assert {"type": "number", "minimum": 0, "maximum": 2} in temperature["anyOf"]
    assert_health_is_fast(server.base_url)
