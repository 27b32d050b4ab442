"""OpenAI-compatible HTTP server: FastAPI app, asyncio bridge to the engine, metrics, logging."""

from blockspec.server.app import create_app
from blockspec.server.async_engine import AsyncEngine, EngineDeadError, EngineError
from blockspec.server.metrics import ServerMetrics

__all__ = ["AsyncEngine", "EngineDeadError", "EngineError", "ServerMetrics", "create_app"]
