"""`blockspec serve`: arguments and the runner (the engine is built by a callable passed in)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

from blockspec.server.logging import DEFAULT_LOG_INTERVAL

logger = logging.getLogger("blockspec")

SPEC_CHOICES = ("none", "ngram", "dflash", "ddtree")
DTYPE_CHOICES = ("float32", "bfloat16", "float16")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number in [0, 65535], got {text}")
    return value


def add_serve_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    model = parser.add_argument_group("model")
    model.add_argument("--model", default=None, help="model directory (default: the bundled model)")
    model.add_argument("--draft-model", default=None, help="drafter directory (DFlash)")
    model.add_argument("--spec", default=None, choices=SPEC_CHOICES, help="speculative decoding algorithm")
    model.add_argument("--block-size", type=_positive_int, default=None, help="draft block size")
    model.add_argument("--budget", type=_positive_int, default=None, help="DDTree node budget")
    model.add_argument("--topk", type=_positive_int, default=None, help="DDTree top-k per depth")
    model.add_argument("--dtype", default="float32", choices=DTYPE_CHOICES)
    model.add_argument("--device", default="cpu", help="cpu or cuda")
    model.add_argument("--max-running-requests", type=_positive_int, default=None)
    model.add_argument("--kv-cache-tokens", type=_positive_int, default=None)
    http = parser.add_argument_group("server")
    http.add_argument("--host", default="127.0.0.1")
    http.add_argument("--port", type=_port, default=8000)
    http.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*")
    http.add_argument("--served-model-name", default=None, help="model id clients use (default: model dir name)")
    http.add_argument("--log-interval", type=_positive_float, default=DEFAULT_LOG_INTERVAL,
                      help="seconds between 'Decode batch' log lines while busy")
    return parser


def build_server(args: argparse.Namespace, build_engine: Callable[[argparse.Namespace], object]):
    """(uvicorn.Server, AsyncEngine) ready to run; the caller shuts the AsyncEngine down."""
    import uvicorn

    from blockspec.server.app import create_app
    from blockspec.server.async_engine import AsyncEngine
    from blockspec.server.logging import StatsLogger

    engine = build_engine(args)
    async_engine = AsyncEngine(engine, observers=[StatsLogger(args.log_interval)])
    try:
        app = create_app(async_engine, api_key=args.api_key,
                         served_model_name=args.served_model_name or engine.model_name)
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                                timeout_graceful_shutdown=5)
        return uvicorn.Server(config), async_engine
    except BaseException:
        async_engine.shutdown()
        raise


def run_serve(args: argparse.Namespace, build_engine: Callable[[argparse.Namespace], object]) -> int:
    """Build the engine, serve until interrupted, then stop the engine thread."""
    _ensure_log_output()
    server, async_engine = build_server(args, build_engine)
    name = server.config.app.state.server.model_name
    logger.info("serving %s (spec: %s) on http://%s:%d", name, async_engine.spec_algorithm,
                args.host, args.port)
    try:
        server.run()
    finally:
        async_engine.shutdown()
    return 0


def _ensure_log_output() -> None:
    """Make the periodic stats lines visible unless the application configured logging."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s")
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
