"""Per-request limits that hold before any parsing: the Content-Type, the body size, and the time
a client may take to send its body.

The body is checked against `max_request_bytes` from its Content-Length header before a byte of
it is read (413 at once), and again while it is read (a chunked body has no length). A body
that trickles in for longer than `body_timeout_s` gets a 408, so a slow client holds a
connection for a bounded time and never reaches the engine.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fastapi import Request
from starlette.requests import ClientDisconnect

from blockspec.server.defaults import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_REQUEST_BYTES
from blockspec.server.errors import APIError, invalid_request

JSON_MEDIA_TYPE = "application/json"


@dataclass(frozen=True)
class RequestLimits:
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be >= 1, got {self.max_request_bytes}")
        if not self.body_timeout_s > 0:
            raise ValueError(f"body_timeout_s must be > 0, got {self.body_timeout_s}")


def _too_large(limit: int) -> APIError:
    return APIError(413, f"The request body is larger than this server's limit of {limit} bytes "
                         f"(--max-request-bytes).", code="request_too_large")


def check_content_type(request: Request) -> None:
    """JSON only, as the OpenAI API: its 400 `unsupported_content_type` for anything else.
    A missing Content-Type is read as JSON (raw HTTP clients often send none)."""
    header = request.headers.get("content-type")
    if header is None:
        return
    media_type = header.split(";", 1)[0].strip().lower()
    if media_type != JSON_MEDIA_TYPE:
        raise invalid_request(f"Unsupported content type: '{header}'. This API method only accepts "
                              f"'{JSON_MEDIA_TYPE}' requests, but you specified the header "
                              f"'Content-Type: {header}'. Please try again with a supported content type.",
                              code="unsupported_content_type")


async def read_body(request: Request, limits: RequestLimits) -> bytes:
    """The request body, within the size and time limits."""
    check_content_type(request)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_request_bytes:
        raise _too_large(limits.max_request_bytes)  # before reading: the server discards the rest
    try:
        return await asyncio.wait_for(_read_capped(request, limits.max_request_bytes), limits.body_timeout_s)
    except asyncio.TimeoutError:
        raise APIError(408, f"The request body did not arrive within {limits.body_timeout_s:g} seconds.",
                       code="request_timeout") from None
    except ClientDisconnect:
        raise APIError(499, "Client closed the request.") from None


async def _read_capped(request: Request, limit: int) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)
