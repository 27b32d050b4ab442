"""The published OpenAPI schema (GET /openapi.json).

The completion routes read their bodies themselves (size cap, parsing off the event loop), so
FastAPI cannot see their request models; the schema is completed here from the same pydantic
models that validate the bodies, so it describes exactly the fields and ranges accepted.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic.json_schema import models_json_schema

from blockspec.server.limits import RequestLimits
from blockspec.server.protocol import ChatCompletionRequest, CompletionRequest, ErrorResponse, ModelCard, ModelList

_REF = "#/components/schemas/{model}"
_BODIES = {"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest}
_ERROR_STATUSES = {"400": "Invalid request", "401": "Missing or wrong API key", "404": "Unknown model",
                   "408": "The body did not arrive in time", "413": "The body is too large",
                   "500": "Server error", "503": "The engine is not running"}


def build_openapi(app: FastAPI, model_name: str, limits: RequestLimits) -> dict:
    schema = get_openapi(
        title="blockspec", version="0.1.0", routes=app.routes,
        description=f"OpenAI-compatible API. Request bodies are JSON, at most {limits.max_request_bytes} "
                    "bytes; numbers must be JSON numbers.")
    _, defs = models_json_schema(
        [(m, "validation") for m in (*_BODIES.values(), ErrorResponse, ModelCard, ModelList)], ref_template=_REF)
    components = defs["$defs"]
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        components[name]["properties"]["model"]["enum"] = [model_name]  # the one model served
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(components)
    for name in ("HTTPValidationError", "ValidationError"):  # FastAPI's 422: this server answers 400
        schemas.pop(name, None)
    for item in schema["paths"].values():
        for operation in item.values():
            operation.get("responses", {}).pop("422", None)
    error = {"content": {"application/json": {"schema": {"$ref": _REF.format(model="ErrorResponse")}}}}
    for path, model in _BODIES.items():
        operation = schema["paths"][path]["post"]
        operation["requestBody"] = {"required": True, "content": {
            "application/json": {"schema": {"$ref": _REF.format(model=model.__name__)}}}}
        operation["responses"] = {
            "200": {"description": "The completion (JSON), or server-sent events when 'stream' is true",
                    "content": {"application/json": {"schema": {"type": "object"}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            **{status: {"description": text, **error} for status, text in _ERROR_STATUSES.items()}}
    return schema


def install_openapi(app: FastAPI, model_name: str, limits: RequestLimits) -> None:
    cached: list[dict] = []

    async def openapi_json() -> JSONResponse:
        if not cached:
            cached.append(build_openapi(app, model_name, limits))
        return JSONResponse(cached[0])

    app.add_api_route("/openapi.json", openapi_json, methods=["GET"], include_in_schema=False)
