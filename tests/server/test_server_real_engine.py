"""The server against the REAL engine (tiny Qwen3 on CPU), on 127.0.0.1.

(a) concurrent requests return exactly what they return alone, speculation off and on;
(b) a soak: hundreds of mixed requests, some clients hang up mid-stream; afterwards nothing is
    left in the engine and the K/V pool is entirely free;
(c) the table of bad inputs gets the right status from the real engine too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time

import httpx
import pytest

from live import API_KEY, live_server
from dflash_fixtures import write_dflash_drafter
from real_engine import DRAFT_BLOCK_SIZE, make_real_engine
from test_server_errors import BAD_BODIES, CHAT, COMPLETIONS, MESSAGES, _assert_openai_error, _body, _case_id

NUM_ORDINARY = 512 - 4  # the tiny tokenizer's ordinary tokens (special tokens come last)
WORDS = ("the lighthouse keeper climbed stairs every evening at dusk farmers brought cheese honey "
         "apples bread children ran between stalls while parents argued about prices").split()


@pytest.fixture(scope="module")
def drafter_dir(qwen3_dir, tmp_path_factory) -> str:
    return str(write_dflash_drafter(tmp_path_factory.mktemp("server_drafter"), qwen3_dir,
                                    block_size=DRAFT_BLOCK_SIZE))


@contextlib.contextmanager
def real_server(qwen3_dir, drafter_dir=None, spec="none", *, api_key=None, **config):
    engine = make_real_engine(qwen3_dir, spec=spec, draft_dir=drafter_dir if spec == "dflash" else None,
                              **config)
    with live_server(engine, api_key=api_key) as server:
        yield server


def engine_is_clean(server) -> dict:
    """Engine-side state, read on the engine thread."""
    def read(e):
        inner = e.inner
        return {"unfinished": inner.has_unfinished_requests(), "kv_tokens_used": inner.stats().kv_tokens_used,
                "running": len(inner.scheduler.running), "waiting": len(inner.scheduler.waiting),
                "free_pages": inner.allocator.num_free_pages, "usable_pages": inner.allocator.num_usable_pages}
    return server.in_engine_thread(read)


def assert_pool_free(server, timeout: float = 15.0) -> None:
    assert server.wait_until_idle(timeout), "requests still unfinished in the engine"
    state = engine_is_clean(server)
    assert state["kv_tokens_used"] == 0 and state["free_pages"] == state["usable_pages"], state
    assert state["running"] == state["waiting"] == 0, state
    deadline = time.monotonic() + 5
    while server.async_engine.latest_stats.kv_tokens_used and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.async_engine.latest_stats.kv_tokens_used == 0


# ---- one request over HTTP -----------------------------------------------------------------------

async def call(client: httpx.AsyncClient, path: str, body: dict, *, stream: bool = False,
               abandon: bool = False) -> dict:
    """POST one request; returns {status, text, finish_reason, completion_tokens, id}.

    stream: read the SSE stream to [DONE]; abandon: hang up right after the first chunk."""
    is_chat = path == CHAT
    if not stream:
        r = await client.post(path, json=body)
        if r.status_code != 200:
            return {"status": r.status_code, "error": r.text}
        data = r.json()
        choice = data["choices"][0]
        return {"status": 200, "id": data["id"], "finish_reason": choice["finish_reason"],
                "text": choice["message"]["content"] if is_chat else choice["text"],
                "completion_tokens": data["usage"]["completion_tokens"]}
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    out = {"status": None, "id": None, "text": "", "finish_reason": None, "completion_tokens": None,
           "done": False, "errors": []}
    async with client.stream("POST", path, json=body) as r:
        out["status"] = r.status_code
        if r.status_code != 200:
            out["error"] = (await r.aread()).decode()
            return out
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[len("data: "):]
            if payload == "[DONE]":
                out["done"] = True
                break
            chunk = json.loads(payload)
            if "error" in chunk:
                out["errors"].append(chunk["error"])
                continue
            out["id"] = chunk["id"]
            if abandon:
                return out  # leaving the block closes the connection mid-stream
            for c in chunk["choices"]:
                piece = c["delta"].get("content") if is_chat else c["text"]
                out["text"] += piece or ""
                if c["finish_reason"] is not None:
                    assert out["finish_reason"] is None, "two finish reasons"
                    out["finish_reason"] = c["finish_reason"]
            if chunk.get("usage"):
                out["completion_tokens"] = chunk["usage"]["completion_tokens"]
    return out


def outcome(result: dict) -> tuple:
    assert result["status"] == 200, result
    if "done" in result:
        assert result["done"] and not result["errors"], result
    return result["text"], result["finish_reason"], result["completion_tokens"]


def client_for(server, concurrency: int, api_key: str | None = None) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    return httpx.AsyncClient(base_url=server.base_url, timeout=httpx.Timeout(120.0), limits=limits,
                             headers=headers)


def run_sequentially(server, requests: list[tuple[str, dict]]) -> list[tuple]:
    async def go():
        async with client_for(server, 1) as client:
            return [outcome(await call(client, path, body)) for path, body in requests]
    return asyncio.run(go())


def run_concurrently(server, requests: list[tuple[str, dict]], stream_every: int = 4) -> list[tuple]:
    async def go():
        async with client_for(server, len(requests)) as client:
            return await asyncio.gather(*(call(client, path, body, stream=i % stream_every == 1)
                                          for i, (path, body) in enumerate(requests)))
    return [outcome(r) for r in asyncio.run(go())]


# ---- (a) concurrent == alone --------------------------------------------------------------------

def mixed_requests(model: str, count: int, *, seed: int, sampled: bool = False) -> list[tuple[str, dict]]:
    """Completions (token-id prompts of mixed lengths) and chats, mixed max_tokens; greedy, or
    seeded sampling."""
    rng = random.Random(seed)
    requests = []
    for i in range(count):
        max_tokens = rng.randint(1, 12)
        params = ({"temperature": 1.0, "top_p": 0.9, "seed": rng.randint(0, 10**6)} if sampled
                  else {"temperature": 0})
        extra = {"ignore_eos": True} if i % 3 else {}  # some may also stop at EOS
        if i % 4 == 3:
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30)))
            requests.append((CHAT, {"model": model, "messages": [{"role": "user", "content": words}],
                                    "max_tokens": max_tokens, **params, **extra}))
        else:
            length = rng.choice([1, 2, 5, 9, 17, 33, 60, 120])
            ids = [rng.randrange(NUM_ORDINARY) for _ in range(length)]
            requests.append((COMPLETIONS, {"model": model, "prompt": ids, "max_tokens": max_tokens,
                                           **params, **extra}))
    return requests


@pytest.fixture(scope="module")
def plain_server(qwen3_dir):
    with real_server(qwen3_dir, max_running_requests=48) as server:
        yield server


@pytest.fixture(scope="module")
def greedy_case(plain_server):
    """32 greedy requests and what each returns alone (one after the other, speculation off)."""
    requests = mixed_requests(plain_server.async_engine.model_name, 32, seed=1)
    return requests, run_sequentially(plain_server, requests)


@pytest.mark.parametrize("spec, sampled_trees", [("none", False), ("ngram", False), ("dflash", False),
                                                 ("dflash", True)])
def test_concurrent_requests_return_what_they_return_alone(spec, sampled_trees, qwen3_dir, drafter_dir, plain_server,
                                                           greedy_case):
    greedy, greedy_alone = greedy_case
    extra = {"sampled_trees": True} if sampled_trees else {}
    with contextlib.ExitStack() as stack:
        server = plain_server if spec == "none" else stack.enter_context(
            real_server(qwen3_dir, drafter_dir, spec, max_running_requests=48, **extra))
        assert server.async_engine.spec_algorithm == spec
        # Seeded sampled requests too: their own random streams make them batch-independent,
        # and unlike this tiny model's greedy output they are far from repetitive.
        sampled = mixed_requests(server.async_engine.model_name, 8, seed=2, sampled=True)
        sampled_alone = run_sequentially(server, sampled)
        together = run_concurrently(server, greedy + sampled)
        for i, (got, want) in enumerate(zip(together, greedy_alone + sampled_alone)):
            assert got == want, f"request {i}: concurrent {got} != alone {want}"
        assert any(r[1] == "length" for r in together)
        assert len({r[0] for r in together}) > 20, "outputs are suspiciously alike"
        assert_pool_free(server)


# ---- (b) soak -------------------------------------------------------------------------------------

SOAK_REQUESTS = 500
SOAK_CONCURRENCY = 64


def soak_plan(model: str) -> list[dict]:
    """500 requests over 16 distinct (prompt, params) shapes; ~10% of the streamed ones hang up
    after their first chunk (those ask for many tokens, so only an abort can end them soon)."""
    rng = random.Random(7)
    shapes = []
    for j in range(16):
        length = rng.choice([1, 4, 9, 20, 40])
        ids = [rng.randrange(NUM_ORDINARY) for _ in range(length)]
        params = {"temperature": 0} if j % 2 else {"temperature": 0.8, "seed": j}
        path = CHAT if j % 4 == 0 else COMPLETIONS
        body = ({"messages": [{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(length))}]}
                if path == CHAT else {"prompt": ids})
        shapes.append((path, {"model": model, "max_tokens": rng.randint(4, 12), "ignore_eos": j % 3 != 0,
                              **params, **body}))
    plan = []
    for i in range(SOAK_REQUESTS):
        shape = rng.randrange(len(shapes))
        path, body = shapes[shape]
        stream = rng.random() < 0.5
        abandon = stream and rng.random() < 0.1
        if abandon:
            body = {**body, "max_tokens": 300, "ignore_eos": True}
        plan.append({"shape": shape, "path": path, "body": body, "stream": stream, "abandon": abandon})
    return plan


@pytest.fixture(scope="module")
def soak_server(qwen3_dir):
    # A K/V pool far smaller than 64 requests' worth: the soak also preempts.
    with real_server(qwen3_dir, spec="ngram", max_running_requests=SOAK_CONCURRENCY, kv_cache_tokens=1024) as s:
        # Instruments (called on the engine thread only): preemptions, and how requests finished.
        inner = s.engine.inner
        preempt, step = inner.scheduler.preempt, inner.step
        s.preemptions, s.finished = 0, {}

        def counting_preempt(seq):
            s.preemptions += 1
            preempt(seq)

        def recording_step():
            outputs = step()
            s.finished.update((o.request_id, o.finish_reason) for o in outputs if o.finished)
            return outputs
        inner.scheduler.preempt, inner.step = counting_preempt, recording_step
        yield s


def test_soak_mixed_requests_with_disconnects(soak_server):
    server = soak_server
    plan = soak_plan(server.async_engine.model_name)

    async def go():
        sem = asyncio.Semaphore(SOAK_CONCURRENCY)
        async with client_for(server, SOAK_CONCURRENCY) as client:
            async def one(item):
                async with sem:
                    return await asyncio.wait_for(
                        call(client, item["path"], item["body"], stream=item["stream"], abandon=item["abandon"]),
                        timeout=90)
            return await asyncio.gather(*(one(item) for item in plan))

    started = time.monotonic()
    results = asyncio.run(go())
    elapsed = time.monotonic() - started
    by_shape: dict[int, set] = {}
    abandoned_ids = []
    for item, result in zip(plan, results):
        assert result["status"] == 200, result
        if item["abandon"]:
            assert result["id"] is not None
            abandoned_ids.append(f"{result['id']}-0")
            continue
        text, finish, tokens = outcome(result)
        assert finish in ("stop", "length"), result
        max_tokens = item["body"]["max_tokens"]
        assert 1 <= tokens <= max_tokens and (finish == "stop" or tokens == max_tokens), result
        by_shape.setdefault(item["shape"], set()).add((text, finish, tokens))
    assert 20 <= len(abandoned_ids) <= 60, len(abandoned_ids)
    # Same greedy or seeded request, same answer: whatever the load, batch and preemptions.
    for shape, answers in by_shape.items():
        assert len(answers) == 1, (shape, answers)
    # Every hung-up request was aborted in the engine, and nothing is left behind.
    deadline = time.monotonic() + 15
    while not set(abandoned_ids) <= set(server.engine.aborted) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert set(abandoned_ids) <= set(server.engine.aborted)
    assert_pool_free(server)
    # ... and the abort is what ended them (each asked for 300 tokens), not running to the end.
    assert not set(abandoned_ids) & set(server.finished)
    assert len(server.finished) == SOAK_REQUESTS - len(abandoned_ids)
    assert server.preemptions > 0, "the soak never ran out of K/V pages"
    print(f"soak: {SOAK_REQUESTS} requests in {elapsed:.1f}s, {server.preemptions} preemptions")
    # And it still serves.
    r = httpx.post(server.url(COMPLETIONS), json={"model": server.async_engine.model_name, "prompt": [5, 6],
                                                  "max_tokens": 3, "temperature": 0}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


# ---- (c) bad inputs -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def guarded(qwen3_dir):
    """A real engine behind an API key, with a K/V pool smaller than the context length."""
    with real_server(qwen3_dir, api_key=API_KEY, max_running_requests=4, kv_cache_tokens=256) as server:
        with httpx.Client(base_url=server.base_url, timeout=30,
                          headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            yield server, http


@pytest.mark.parametrize("path,changes,status,param,code", BAD_BODIES,
                         ids=[_case_id(p, c) for p, c, *_ in BAD_BODIES])
def test_bad_request_body_real_engine(guarded, path, changes, status, param, code):
    server, http = guarded
    base = {"model": server.async_engine.model_name, "max_tokens": 4,
            **({"messages": MESSAGES} if path == CHAT else {"prompt": "alpha bravo"})}
    error = _assert_openai_error(http.post(path, json=_body(base, changes)), status, param, code)
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("raw", [b'{"model": ', b"not json", b"\xff\xfe", b"[1, 2]", b"null", b""])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_malformed_json_real_engine(guarded, path, raw):
    _, http = guarded
    r = http.post(path, content=raw, headers={"content-type": "application/json"})
    assert _assert_openai_error(r, 400)["type"] == "invalid_request_error"


def test_engine_side_refusals_real_engine(guarded):
    server, http = guarded
    model, limit = server.async_engine.model_name, server.async_engine.max_model_len
    words = "alpha " * (limit + 10)
    _assert_openai_error(http.post(CHAT, json={"model": model, "messages": [{"role": "user", "content": words}],
                                               "max_tokens": 4}), 400, "messages", "context_length_exceeded")
    _assert_openai_error(http.post(COMPLETIONS, json={"model": model, "prompt": [7] * (limit + 1), "max_tokens": 4}),
                         400, "prompt", "context_length_exceeded")
    # Out of the real vocabulary: refused by Engine.add_request.
    for bad in ([512], [10**6], [3, -1]):
        _assert_openai_error(http.post(COMPLETIONS, json={"model": model, "prompt": bad, "max_tokens": 4}),
                             400, "prompt")
    # Within the context length but larger than this engine's K/V pool (256 tokens).
    r = http.post(COMPLETIONS, json={"model": model, "prompt": [7] * 300, "max_tokens": 4})
    assert "K/V" in _assert_openai_error(r, 400, "prompt")["message"]
    # n choices added together: one refused choice leaves none behind.
    _assert_openai_error(http.post(COMPLETIONS, json={"model": model, "prompt": [[1, 2], [512]], "n": 2,
                                                      "max_tokens": 4}), 400, "prompt")
    _assert_openai_error(http.post(CHAT, json={"model": "no-such-model", "messages": MESSAGES}), 404, "model",
                         "model_not_found")


@pytest.mark.parametrize("headers,code", [({}, None), ({"Authorization": "Bearer wrong"}, "invalid_api_key"),
                                          ({"Authorization": f"Basic {API_KEY}"}, None)])
def test_api_key_real_engine(guarded, headers, code):
    server, _ = guarded
    body = {"model": server.async_engine.model_name, "prompt": "alpha", "max_tokens": 2}
    r = httpx.post(server.url(COMPLETIONS), json=body, headers=headers, timeout=30)
    _assert_openai_error(r, 401, None, code)
    assert API_KEY not in r.text


def test_real_engine_serves_and_is_clean_after_bad_inputs(guarded):
    server, http = guarded
    r = http.post(COMPLETIONS, json={"model": server.async_engine.model_name, "prompt": [1, 2, 3],
                                     "max_tokens": 3, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3 and r.json()["choices"][0]["finish_reason"] == "length"
    assert_pool_free(server)
