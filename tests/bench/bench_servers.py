"""Servers for the bench/check tests, on 127.0.0.1 with an ephemeral port in a background thread:
the real blockspec app over a real engine, and a deliberately broken OpenAI-compatible double."""

from __future__ import annotations

import contextlib

from serving import serve_in_thread
from fastapi import FastAPI, Request

GREEDY_WORDS = "the sea is calm and the waves are slow under a grey sky tonight".split()


@contextlib.contextmanager
def blockspec_server(model_dir: str, **engine_config):
    """The real blockspec server (app + AsyncEngine + Engine) on a model directory."""
    from blockspec.engine.config import EngineConfig
    from blockspec.engine.engine import Engine
    from blockspec.server.app import create_app
    from blockspec.server.async_engine import AsyncEngine

    async_engine = AsyncEngine(Engine(EngineConfig(model=model_dir, **engine_config)))
    try:
        with serve_in_thread(create_app(async_engine)) as url:
            yield url
    finally:
        async_engine.shutdown()


def greedy_only_app(algorithm: str = "dflash") -> FastAPI:
    """A broken 'speculative' server: the same greedy text whatever temperature or seed it is
    asked for, while it reports a speculative algorithm with a healthy accept length."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "greedy-double", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        n = int(body.get("max_tokens") or 16)
        text = " ".join(GREEDY_WORDS[i % len(GREEDY_WORDS)] for i in range(n))
        return {"id": "x", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "length"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5},
                "spec_decoding": {"algorithm": algorithm, "verify_steps": max(1, n // 3), "drafted_tokens": 21,
                                  "accepted_tokens": 2 * n // 3, "accept_length": n / max(1, n // 3)}}

    return app


def run_cli(argv: list[str]) -> int:
    """`blockspec ARGV` through `register`, as the main CLI wires it; returns the exit code."""
    import argparse

    from blockspec.cli.bench import register
    parser = argparse.ArgumentParser(prog="blockspec")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)
