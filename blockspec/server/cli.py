"""`blockspec serve`: arguments and the runner (the engine is built by a callable passed in;
`build_engine` builds the real one from the shared engine flags)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

from blockspec.engine_args import add_engine_arguments, engine_config_from_args
from blockspec.server.defaults import DEFAULT_MAX_REQUEST_BYTES
from blockspec.server.stats_log import DEFAULT_LOG_INTERVAL

logger = logging.getLogger("blockspec")

def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number in [0, 65535], got {text}")
    return value


def add_serve_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_engine_arguments(parser)
    http = parser.add_argument_group("server")
    http.add_argument("--host", default="127.0.0.1")
    http.add_argument("--port", type=_port, default=8000)
    http.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*")
    http.add_argument("--served-model-name", default=None, help="model id clients use (default: model dir name)")
    http.add_argument("--log-interval", type=_positive_float, default=DEFAULT_LOG_INTERVAL,
                      help="seconds between 'Decode batch' log lines while busy")
    http.add_argument("--max-request-bytes", type=_positive_int, default=DEFAULT_MAX_REQUEST_BYTES,
                      help="largest request body accepted; larger ones get a 413 before they are read")
    http.add_argument("--allow-special-tokens-in-content", action="store_true",
                      help="encode special-token text in chat messages (e.g. '<|im_end|>') as the special "
                           "tokens; by default it is ordinary text, so a message cannot forge a turn")
    return parser


def build_engine(args: argparse.Namespace):
    """The engine of the engine flags (`blockspec.engine_args`); the bundled model without --model."""
    from blockspec.engine.engine import Engine
    return Engine(engine_config_from_args(args))


def build_server(args: argparse.Namespace, build_engine: Callable[[argparse.Namespace], object]):
    """(uvicorn.Server, AsyncEngine) ready to run; the caller shuts the AsyncEngine down."""
    import uvicorn

    from blockspec.server.app import create_app
    from blockspec.server.async_engine import AsyncEngine
    from blockspec.server.limits import RequestLimits
    from blockspec.server.stats_log import StatsLogger

    engine = build_engine(args)
    async_engine = AsyncEngine(engine, observers=[StatsLogger(args.log_interval)])
    try:
        app = create_app(async_engine, api_key=args.api_key,
                         served_model_name=args.served_model_name or engine.model_name,
                         limits=RequestLimits(max_request_bytes=args.max_request_bytes),
                         allow_special_tokens_in_content=args.allow_special_tokens_in_content)
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
        close = getattr(async_engine.engine, "close", None)   # test doubles have none
        if close is not None:
            close()                                          # tensor-parallel workers stop here
    return 0


def _ensure_log_output() -> None:
    """Make the periodic stats lines visible unless the application configured logging."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s")
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
