"""Live servers for tests: a real uvicorn server on 127.0.0.1 (ephemeral port) in a background thread.

The engine is swappable: set BLOCKSPEC_SERVER_TEST_ENGINE="package.module:factory" to run the
same tests against any object with the Engine interface (e.g. the real engine on a tiny
checkpoint); by default the fake engine of fake_engine.py is used. Either way the engine is
wrapped in a RecordingEngine that notes aborts and which threads called it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
from dataclasses import dataclass

import httpx
import openai
import pytest
from serving import serve_in_thread

from blockspec.server.app import create_app
from blockspec.server.async_engine import AsyncEngine
from fake_engine import FakeEngine

ENGINE_ENV = "BLOCKSPEC_SERVER_TEST_ENGINE"
API_KEY = "sk-test-key"


def build_test_engine():
    spec = os.environ.get(ENGINE_ENV)
    if not spec:
        return FakeEngine(step_delay=0.001)
    module, _, factory = spec.partition(":")
    return getattr(importlib.import_module(module), factory)()


def using_fake_engine() -> bool:
    return not os.environ.get(ENGINE_ENV)


class RecordingEngine:
    """Delegates to an engine, recording abort_request ids and the threads that call it."""

    def __init__(self, inner):
        self.inner = inner
        self.aborted: list[str] = []
        self.prompts: dict[str, list[int]] = {}  # request id -> prompt token ids
        self.calling_threads: set[int] = set()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _note(self) -> None:
        self.calling_threads.add(threading.get_ident())

    def add_request(self, request_id, prompt_token_ids, params):
        self._note()
        self.prompts[request_id] = list(prompt_token_ids)
        return self.inner.add_request(request_id, prompt_token_ids, params)

    def abort_request(self, request_id):
        self._note()
        self.aborted.append(request_id)
        return self.inner.abort_request(request_id)

    def step(self):
        self._note()
        return self.inner.step()

    def has_unfinished_requests(self):
        self._note()
        return self.inner.has_unfinished_requests()

    def stats(self):
        self._note()
        return self.inner.stats()


@dataclass
class LiveServer:
    base_url: str
    engine: RecordingEngine
    async_engine: AsyncEngine
    app: object

    def url(self, path: str) -> str:
        return self.base_url + path

    def in_engine_thread(self, fn, timeout: float = 10.0):
        """fn(engine) evaluated on the engine thread (the engine is not thread-safe)."""
        return self.async_engine.call(fn).result(timeout)

    def wait_until_idle(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.in_engine_thread(lambda e: e.has_unfinished_requests()):
                return True
            time.sleep(0.01)
        return False


@contextlib.contextmanager
def live_server(engine=None, *, api_key: str | None = None, served_model_name: str | None = None,
                **app_options):
    """app_options: more create_app keywords (limits, allow_special_tokens_in_content)."""
    engine = RecordingEngine(engine if engine is not None else build_test_engine())
    async_engine = AsyncEngine(engine)
    app = create_app(async_engine, api_key=api_key, served_model_name=served_model_name, **app_options)
    try:
        with serve_in_thread(app) as base_url:
            yield LiveServer(base_url, engine, async_engine, app)
    finally:
        async_engine.shutdown()
