"""`serve` arguments and the runner, with the fake engine passed in as build_engine."""

from __future__ import annotations

import argparse
import threading
import time

import httpx
import pytest

from blockspec.server import cli
from fake_engine import FakeEngine


def parse(*argv: str) -> argparse.Namespace:
    return cli.add_serve_arguments(argparse.ArgumentParser()).parse_args(list(argv))


def test_defaults():
    args = parse()
    assert (args.host, args.port, args.api_key, args.log_interval) == ("127.0.0.1", 8000, None, 10.0)
    assert args.model is None and args.spec is None and args.served_model_name is None


def test_all_options():
    args = parse("--model", "m", "--draft-model", "d", "--spec", "ddtree", "--block-size", "16",
                 "--budget", "64", "--topk", "4", "--host", "0.0.0.0", "--port", "9001", "--api-key", "k",
                 "--dtype", "bfloat16", "--device", "cuda", "--max-running-requests", "8",
                 "--kv-cache-tokens", "4096", "--served-model-name", "alias", "--log-interval", "2.5")
    assert (args.model, args.draft_model, args.spec, args.block_size, args.budget, args.topk) == \
        ("m", "d", "ddtree", 16, 64, 4)
    assert (args.host, args.port, args.api_key, args.dtype, args.device) == ("0.0.0.0", 9001, "k", "bfloat16", "cuda")
    assert (args.max_running_requests, args.kv_cache_tokens, args.served_model_name, args.log_interval) == \
        (8, 4096, "alias", 2.5)


@pytest.mark.parametrize("argv", [["--spec", "eagle"], ["--port", "70000"], ["--block-size", "0"],
                                  ["--log-interval", "0"], ["--dtype", "int3"]])
def test_bad_arguments_exit(argv, capsys):
    with pytest.raises(SystemExit) as info:
        parse(*argv)
    assert info.value.code == 2


def test_built_server_serves_with_api_key_and_alias():
    args = parse("--port", "0", "--api-key", "k", "--served-model-name", "alias", "--log-interval", "0.1")
    seen = []

    def build_engine(a):
        seen.append(a)
        return FakeEngine()
    server, async_engine = cli.build_server(args, build_engine)
    assert seen == [args]
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(base + "/health").status_code == 200
        assert httpx.get(base + "/v1/models").status_code == 401
        models = httpx.get(base + "/v1/models", headers={"Authorization": "Bearer k"}).json()
        assert models["data"][0]["id"] == "alias"
    finally:
        server.should_exit = True
        thread.join(10)
        async_engine.shutdown()


def test_run_serve_stops_the_engine_thread_when_the_server_ends(monkeypatch):
    made = {}
    real_build = cli.build_server

    def build_and_remember(args, build_engine):
        made["server"], made["engine"] = real_build(args, build_engine)
        made["server"].run = lambda: None  # the server "ends" at once
        return made["server"], made["engine"]
    monkeypatch.setattr(cli, "build_server", build_and_remember)
    monkeypatch.setattr(cli, "_ensure_log_output", lambda: None)  # keep global logging untouched
    assert cli.run_serve(parse("--port", "0"), lambda a: FakeEngine()) == 0
    assert not made["engine"].is_running


def test_hardening_flags_reach_the_app():
    assert (parse().max_request_bytes, parse().allow_special_tokens_in_content) == (4 * 1024 * 1024, False)
    args = parse("--port", "0", "--max-request-bytes", "300", "--allow-special-tokens-in-content")
    server, async_engine = cli.build_server(args, lambda a: FakeEngine())
    try:
        state = server.config.app.state.server
        assert state.limits.max_request_bytes == 300
        assert state.preparer.allow_special_tokens_in_content is True
    finally:
        async_engine.shutdown()
    with pytest.raises(SystemExit):
        parse("--max-request-bytes", "0")
