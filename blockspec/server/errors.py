"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}`, never a traceback.

Every request gets an id (the `x-request-id` response header). An unexpected exception becomes
one OpenAI-style 500 and ONE error log line with that id and the exception; its traceback is
logged once, at debug level (a flood of 500s must not flood the log).
"""

from __future__ import annotations

import json
import logging
import re
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("blockspec")

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


class APIError(Exception):
    """An error answered with an OpenAI-style body."""

    def __init__(self, status: int, message: str, *, type: str = INVALID_REQUEST,
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def to_dict(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


class _ErrorJSONResponse(JSONResponse):
    def render(self, content) -> bytes:
        # ASCII escapes: a message may quote client text that has no UTF-8 form (a lone surrogate).
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_response(error: APIError) -> JSONResponse:
    return _ErrorJSONResponse(error.to_dict(), status_code=error.status)


def internal_error() -> APIError:
    return APIError(500, "The server had an error while processing your request.", type=SERVER_ERROR)


def log_unexpected(request_id: str | None, what: str, exc: BaseException) -> None:
    """One error line per failed request; the traceback once, at debug level."""
    logger.error("request %s: %s failed: %s: %s", request_id, what, type(exc).__name__, exc)
    logger.debug("traceback of request %s", request_id, exc_info=exc)


def request_id_of(request: Request) -> str | None:
    return request.scope.get("state", {}).get("request_id")


# ---- pydantic validation errors → one OpenAI-style 400 --------------------------------------

# pydantic puts the tried union member into `loc` ('stop', 'str'); those are not fields.
_UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "literal"})


def _param_path(loc: tuple) -> str | None:
    """('messages', 0, 'content') -> 'messages[0].content'; union tags like 'list[int]' dropped."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier() and part.lower() not in _UNION_TAGS:
            path += f".{part}" if path else part
    return path or None


def _most_telling(errors: list[dict]) -> dict:
    """The error to report. A union tries every member; when one member got as far as checking
    the value ("contains a lone surrogate", "must be <= 2"), that says more than the other
    members' "should be a valid string"."""
    return next((e for e in errors if not str(e.get("type", "")).endswith("_type")), errors[0])


def from_validation_error(exc: ValidationError) -> APIError:
    first = _most_telling(exc.errors(include_url=False))
    param = _param_path(tuple(first.get("loc", ())))
    kind = first.get("type")
    if kind == "extra_forbidden":
        return invalid_request(f"Unrecognized request argument supplied: {param}", param)
    if kind == "missing":
        return invalid_request(f"Missing required parameter: '{param}'.", param)
    if kind == "unsupported_content":
        return invalid_request(f"Invalid value for '{param}': {first.get('msg')}", param, "unsupported_content")
    where = f" for '{param}'" if param else ""
    return invalid_request(f"Invalid value{where}: {first.get('msg', 'invalid value')}", param)


_LEADING_NAME = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)")


def param_named_in(message: str, candidates) -> str | None:
    """The field a ValueError message starts with ('top_p must be ...' -> 'top_p'), if known."""
    match = _LEADING_NAME.match(message)
    return match.group(1) if match and match.group(1) in candidates else None


# ---- exception handlers -------------------------------------------------------------------

def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _handle_api_error)
    app.add_exception_handler(RequestValidationError, _handle_request_validation)
    app.add_exception_handler(StarletteHTTPException, _handle_http_exception)
    # Not an `Exception` handler: Starlette re-raises after calling one, and uvicorn then logs
    # the traceback a second time. The middleware answers and logs instead.
    app.add_middleware(RequestIdMiddleware)


async def _handle_api_error(request: Request, exc: APIError) -> JSONResponse:
    return error_response(exc)


async def _handle_request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {}
    param = _param_path(tuple(first.get("loc", ()))[1:])  # drop 'body' / 'query'
    return error_response(invalid_request(f"Invalid request: {first.get('msg', 'invalid')}", param))


async def _handle_http_exception(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = INVALID_REQUEST if exc.status_code < 500 else SERVER_ERROR
    response = error_response(APIError(exc.status_code, str(exc.detail), type=kind))
    for name, value in (exc.headers or {}).items():
        response.headers[name] = value
    return response


class RequestIdMiddleware:
    """Pure ASGI: gives each HTTP request an id (scope state and `x-request-id` header) and turns
    an exception that nothing handled into an OpenAI-style 500 with one log line."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = f"req_{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = request_id
        started = False

        async def send_with_id(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message = {**message, "headers": [*message.get("headers", ()),
                                                  (b"x-request-id", request_id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            log_unexpected(request_id, f"{scope['method']} {scope['path']}", exc)
            if not started:  # once headers are out nothing can be said; the server closes the connection
                await error_response(internal_error())(scope, receive, send_with_id)
