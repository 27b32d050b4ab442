"""OpenAI-compatible HTTP server: FastAPI app, asyncio bridge to the engine, metrics, logging.

Nothing is imported here, so that `blockspec.server.cli` (argument parsing) loads on machines
without fastapi/uvicorn: import `blockspec.server.app` etc. directly.
"""
