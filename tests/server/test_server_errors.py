"""Bad requests get OpenAI-style errors with the right status, and the server keeps serving."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from live import API_KEY, live_server, using_fake_engine
from fake_engine import FakeEngine

MESSAGES = [{"role": "user", "content": "alpha bravo"}]


_DROP = object()  # a change that removes the field


def _body(base: dict, changes: dict) -> dict:
    body = {**base, **changes}
    return {k: v for k, v in body.items() if v is not _DROP}


def _chat(model: str, **changes) -> dict:
    return _body({"model": model, "messages": MESSAGES, "max_tokens": 4}, changes)


def _completion(model: str, **changes) -> dict:
    return _body({"model": model, "prompt": "alpha bravo", "max_tokens": 4}, changes)

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"

# (path, body changes, status, expected param, expected code)
BAD_BODIES = [
    (CHAT, {"temperature": -1}, 400, "temperature", None),
    (CHAT, {"top_p": 0}, 400, "top_p", None),
    (CHAT, {"n": 0}, 400, "n", None),
    (CHAT, {"max_tokens": 0}, 400, "max_tokens", None),
    (CHAT, {"max_completion_tokens": 0}, 400, "max_completion_tokens", None),
    (CHAT, {"messages": _DROP}, 400, "messages", None),
    (CHAT, {"messages": "hello"}, 400, "messages", None),
    (CHAT, {"messages": []}, 400, "messages", None),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role", None),
    (CHAT, {"messages": [{"content": "x"}]}, 400, "messages[0].role", None),
    (CHAT, {"temperature": "hot"}, 400, "temperature", None),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]},
     400, "messages[0].content", "unsupported_content"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "and"},
                                                      {"type": "video_url", "video_url": {"url": "http://x/v.mp4"}}]}]},
     400, "messages[0].content", "unsupported_content"),
    (CHAT, {"model": "no-such-model"}, 404, "model", "model_not_found"),
    (CHAT, {"model": _DROP}, 400, "model", None),
    (CHAT, {"top_logprobs": 3}, 400, "top_logprobs", None),                 # without logprobs=true
    (CHAT, {"logprobs": False, "top_logprobs": 0}, 400, "top_logprobs", None),
    (CHAT, {"logprobs": 1}, 400, "logprobs", None),
    (CHAT, {"logit_bias": {"abc": 10}}, 400, "logit_bias", None),
    (CHAT, {"logit_bias": {"-5": 10}}, 400, "logit_bias", None),
    (CHAT, {"logit_bias": {"5": "10"}}, 400, "logit_bias", None),
    (CHAT, {"repetition_penalty": 0}, 400, "repetition_penalty", None),
    # The fake's template (and the tiny real one) renders no tools: giving some is refused.
    (CHAT, {"tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools", None),
    (CHAT, {"tools": [{"type": "retrieval"}]}, 400, "tools[0].type", None),
    (CHAT, {"tool_choice": "required"}, 400, "tool_choice", None),
    (CHAT, {"tool_choice": "sometimes"}, 400, "tool_choice", None),
    (CHAT, {"response_format": {"type": "yaml"}}, 400, "response_format", None),
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
     400, "response_format.json_schema.schema", None),
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, 400,
     "response_format.json_schema.schema", None),
    (CHAT, {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a+"}}, 400,
     "structured_outputs", None),
    (COMPLETIONS, {"structured_outputs": {"regex": "a+", "choice": ["a"]}}, 400, "structured_outputs", None),
    (COMPLETIONS, {"structured_outputs": {"regex": "[a-"}}, 400, "structured_outputs.regex", None),
    (COMPLETIONS, {"structured_outputs": {"grammar": "root ::= b"}}, 400, "structured_outputs.grammar", None),
    (COMPLETIONS, {"structured_outputs": {"choice": ["a"]}, "ignore_eos": True}, 400, "ignore_eos", None),
    (CHAT, {"no_such_field": 1}, 400, "no_such_field", None),
    (CHAT, {"stream_options": {"include_usage": True}}, 400, "stream_options", None),
    (CHAT, {"stop": 5}, 400, "stop", None),
    (CHAT, {"seed": 2**70}, 400, "seed", None),
    (COMPLETIONS, {"max_tokens": -5}, 400, "max_tokens", None),
    (COMPLETIONS, {"top_k": -2}, 400, "top_k", None),
    (COMPLETIONS, {"min_p": 2}, 400, "min_p", None),
    (COMPLETIONS, {"n": 1000}, 400, "n", None),
    (COMPLETIONS, {"prompt": []}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": [-1, 3]}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": {"text": "x"}}, 400, "prompt", None),
    (COMPLETIONS, {"logprobs": True}, 400, "logprobs", None),
    (COMPLETIONS, {"logprobs": -1}, 400, "logprobs", None),
    (COMPLETIONS, {"echo": True}, 400, "echo", "unsupported_parameter"),
    (COMPLETIONS, {"best_of": 3}, 400, "best_of", "unsupported_parameter"),
    (COMPLETIONS, {"frequency_penalty": 2.5}, 400, "frequency_penalty", None),
]



def _case_id(path: str, changes: dict) -> str:
    name, value = next(iter(changes.items()))
    shown = "missing" if value is _DROP else repr(value)
    return f"{'chat' if path == CHAT else 'completions'}-{name}={shown}"[:60]


def _assert_openai_error(response: httpx.Response, status: int, param=..., code=...) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in response.text
    if param is not ...:
        assert error["param"] == param
    if code is not ...:
        assert error["code"] == code
    return error


def _assert_still_serves(http: httpx.Client, model: str) -> None:
    r = http.post(COMPLETIONS, json=_completion(model, max_tokens=2, temperature=0))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("path,changes,status,param,code", BAD_BODIES,
                         ids=[_case_id(p, c) for p, c, *_ in BAD_BODIES])
def test_bad_request_body(http, model_name, path, changes, status, param, code):
    base = {"model": model_name, "max_tokens": 4,
            **({"messages": MESSAGES} if path == CHAT else {"prompt": "alpha bravo"})}
    body = _body(base, changes)
    error = _assert_openai_error(http.post(path, json=body), status, param, code)
    assert error["type"] == "invalid_request_error"
    _assert_still_serves(http, model_name)


@pytest.mark.parametrize("raw", [b'{"model": ', b"not json", b"\xff\xfe", b"[1, 2]", b"null", b""])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_malformed_json(http, model_name, path, raw):
    r = http.post(path, content=raw, headers={"content-type": "application/json"})
    error = _assert_openai_error(r, 400)
    assert error["type"] == "invalid_request_error"
    _assert_still_serves(http, model_name)


def test_oversize_chat_prompt(http, server, model_name):
    words = "alpha " * (server.async_engine.max_model_len + 10)
    r = http.post(CHAT, json=_chat(model_name, messages=[{"role": "user", "content": words}]))
    _assert_openai_error(r, 400, "messages", "context_length_exceeded")
    r = http.post(CHAT, json=_chat(model_name, messages=[{"role": "user", "content": words}],
                                   max_tokens=_DROP))  # the default max_tokens cannot save it
    _assert_openai_error(r, 400, "messages", "context_length_exceeded")
    _assert_still_serves(http, model_name)


def test_oversize_completion_prompt_and_max_tokens(http, server, model_name):
    limit = server.async_engine.max_model_len
    ids = server.async_engine.tokenizer.encode("alpha")[:1] * (limit + 1)
    _assert_openai_error(http.post(COMPLETIONS, json=_completion(model_name, prompt=ids)),
                         400, "prompt", "context_length_exceeded")
    _assert_openai_error(http.post(COMPLETIONS, json=_completion(model_name, max_tokens=limit)),
                         400, "prompt", "context_length_exceeded")
    _assert_still_serves(http, model_name)


def test_failed_choice_leaves_no_request_behind(http, server, model_name):
    """n choices are added together: when the engine refuses them nothing stays in the engine."""
    r = http.post(COMPLETIONS, json=_completion(model_name, prompt=[[1, 2], [-1]], n=2))
    _assert_openai_error(r, 400, "prompt")
    assert server.wait_until_idle()


def test_unknown_model_and_route(http, model_name):
    _assert_openai_error(http.get("/v1/models/nope"), 404, "model", "model_not_found")
    assert http.get(f"/v1/models/{model_name}").status_code == 200
    _assert_openai_error(http.get("/v1/nothing-here"), 404)
    _assert_openai_error(http.get(CHAT), 405)


def test_openai_client_raises_typed_errors(client, model_name):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model_name, messages=MESSAGES, temperature=-1)
    assert info.value.param == "temperature"
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope", messages=MESSAGES)
    assert info.value.code == "model_not_found"


# ---- API key ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def secured():
    with live_server(api_key=API_KEY) as s:
        with httpx.Client(base_url=s.base_url, timeout=20) as c:
            yield s, c


@pytest.mark.parametrize("headers,code", [({}, None),
                                          ({"Authorization": "Bearer wrong"}, "invalid_api_key"),
                                          ({"Authorization": f"Basic {API_KEY}"}, None),
                                          ({"Authorization": "Bearer"}, None)])
@pytest.mark.parametrize("method,path", [("POST", CHAT), ("POST", COMPLETIONS), ("GET", "/v1/models")])
def test_api_key_required(secured, headers, code, method, path):
    s, c = secured
    body = _chat(s.async_engine.model_name) if path == CHAT else _completion(s.async_engine.model_name)
    r = c.request(method, path, headers=headers, json=body if method == "POST" else None)
    _assert_openai_error(r, 401, None, code)
    assert API_KEY not in r.text


def test_api_key_accepted_and_health_open(secured):
    s, c = secured
    assert c.get("/health").status_code == 200
    assert c.get("/metrics").status_code == 200
    assert c.get("/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
    with openai.OpenAI(base_url=s.url("/v1"), api_key=API_KEY, max_retries=0, timeout=20) as good:
        r = good.completions.create(model=s.async_engine.model_name, prompt="alpha", max_tokens=2)
        assert r.usage.completion_tokens >= 1
    with openai.OpenAI(base_url=s.url("/v1"), api_key="wrong", max_retries=0, timeout=20) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()


# ---- server-side failures: 500 with an OpenAI error, never a traceback or a hang -----------------

@pytest.fixture
def fragile():
    engine = FakeEngine()
    with live_server(engine) as s:
        with httpx.Client(base_url=s.base_url, timeout=20) as c:
            yield s, engine, c


def test_engine_step_failure_is_a_500_and_the_server_recovers(fragile):
    s, engine, c = fragile
    s.in_engine_thread(lambda e: setattr(e.inner, "fail_next_step", True))
    r = c.post(COMPLETIONS, json=_completion("fake-model"))
    assert _assert_openai_error(r, 500)["type"] == "server_error"
    assert "injected" not in r.text  # internals stay in the server log
    assert s.wait_until_idle()
    _assert_still_serves(c, "fake-model")


def test_a_cuda_error_is_a_500_then_health_and_new_requests_are_503(fragile):
    """After a CUDA error the device is unusable: the failing request gets a 500, then /health
    says 503 (a supervisor restarts the server) and new requests are refused with a 503."""
    import torch
    s, engine, c = fragile
    s.in_engine_thread(lambda e: setattr(e.inner, "fail_next_step",
                                         torch.AcceleratorError("CUDA error: device-side assert triggered")))
    r = c.post(COMPLETIONS, json=_completion("fake-model"))
    assert _assert_openai_error(r, 500)["type"] == "server_error"
    assert "device-side" not in r.text
    for _ in range(200):
        if c.get("/health").status_code == 503:
            break
        time.sleep(0.01)
    assert _assert_openai_error(c.get("/health"), 503)["type"] == "server_error"
    assert _assert_openai_error(c.post(COMPLETIONS, json=_completion("fake-model")), 503)["type"] == "server_error"


def test_engine_step_failure_mid_stream_is_an_error_event(fragile):
    s, engine, c = fragile
    s.in_engine_thread(lambda e: setattr(e.inner, "fail_next_step", True))
    with openai.OpenAI(base_url=s.url("/v1"), api_key="x", max_retries=0, timeout=20) as client:
        with pytest.raises(openai.APIError):
            list(client.completions.create(model="fake-model", prompt="alpha", max_tokens=4, stream=True))
    _assert_still_serves(c, "fake-model")


def test_unexpected_handler_error_is_an_openai_500(fragile):
    s, engine, c = fragile

    def broken_encode(text):
        raise RuntimeError("secret internal detail")
    engine.tokenizer.encode = broken_encode
    r = c.post(COMPLETIONS, json=_completion("fake-model"))
    assert _assert_openai_error(r, 500)["type"] == "server_error"
    assert "secret internal detail" not in r.text


def test_missing_chat_template_is_a_400():
    with live_server(FakeEngine(has_chat_template=False)) as s:
        r = httpx.post(s.url(CHAT), json=_chat("fake-model"), timeout=20)
        _assert_openai_error(r, 400, "messages")


def test_served_model_name_is_what_clients_must_use():
    with live_server(FakeEngine(), served_model_name="my-alias") as s:
        assert httpx.get(s.url("/v1/models")).json()["data"][0]["id"] == "my-alias"
        _assert_openai_error(httpx.post(s.url(CHAT), json=_chat("fake-model")), 404, "model", "model_not_found")
        assert httpx.post(s.url(CHAT), json=_chat("my-alias")).json()["model"] == "my-alias"


@pytest.mark.skipif(not using_fake_engine(), reason="needs the fake engine's vocabulary")
def test_out_of_vocab_token_ids(http, model_name):
    _assert_openai_error(http.post(COMPLETIONS, json=_completion(model_name, prompt=[10**6])), 400, "prompt")
