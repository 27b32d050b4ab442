"""The OpenAI-compatible FastAPI app: /v1/chat/completions, /v1/completions, /v1/models,
/health, /metrics.

A request is validated completely (schema, model, unsupported fields, sampling parameters,
context length, and the engine's own add_request) before any byte of the response is sent, so
every invalid request gets a proper 400. n choices are n engine requests that run
concurrently; choice j of a seeded request uses seed + j.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, fields

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.background import BackgroundTask

from blockspec.engine.outputs import SpecMetrics, StepOutput
from blockspec.sampling import SamplingParams
from blockspec.server.async_engine import AsyncEngine, EngineDeadError, EngineError, RequestStream
from blockspec.server.errors import (SERVER_ERROR, APIError, from_validation_error, install_error_handlers,
                                     invalid_request, param_named_in)
from blockspec.server.metrics import PROMETHEUS_CONTENT_TYPE, ServerMetrics
from blockspec.server.protocol import (ChatCompletionRequest, ChatMessage, CompletionRequest, ModelCard,
                                       ModelList, unsupported_parameters)

logger = logging.getLogger("blockspec")

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_CHAT_MAX_TOKENS_CAP = 1024  # chat default: the remaining context, at most this
SAMPLING_FIELDS = frozenset(f.name for f in fields(SamplingParams))
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

try:  # chat templates are jinja2; their errors (e.g. roles must alternate) are the client's fault
    from jinja2.exceptions import TemplateError as _TemplateError
except ImportError:  # pragma: no cover
    _TemplateError = ValueError


@dataclass
class _Choice:
    """One choice of a response = one engine request."""

    index: int
    stream: RequestStream
    text: str = ""
    final: StepOutput | None = None


@dataclass
class _Job:
    """A validated request, running in the engine."""

    response_id: str
    created: int
    prompts: list[list[int]]
    choices: list[_Choice]

    def usage(self) -> dict:
        prompt = sum(len(p) for p in self.prompts)
        completion = sum(c.final.num_output_tokens for c in self.choices if c.final)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def spec_decoding(self, algorithm: str) -> dict:
        total = SpecMetrics(algorithm=algorithm)
        for choice in self.choices:
            if choice.final:
                total.merge(choice.final.metrics)
        return total.to_dict()

    @property
    def all_finished(self) -> bool:
        return all(c.final is not None for c in self.choices)


def create_app(async_engine: AsyncEngine, *, api_key: str | None = None,
               served_model_name: str | None = None, metrics: ServerMetrics | None = None) -> FastAPI:
    """Build the app. The caller owns `async_engine` and shuts it down after the server stops."""
    server = _Server(async_engine, api_key, served_model_name or async_engine.model_name,
                     metrics or ServerMetrics())
    async_engine.add_observer(server.metrics)
    app = FastAPI(title="blockspec", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    install_error_handlers(app)
    _add_routes(app, server)
    return app


def _add_routes(app: FastAPI, server: "_Server") -> None:
    auth = [Depends(server.check_api_key)]
    app.add_api_route("/v1/chat/completions", server.chat_completions, methods=["POST"], dependencies=auth)
    app.add_api_route("/v1/completions", server.completions, methods=["POST"], dependencies=auth)
    app.add_api_route("/v1/models", server.list_models, methods=["GET"], dependencies=auth)
    app.add_api_route("/v1/models/{model_id:path}", server.get_model, methods=["GET"], dependencies=auth)
    app.add_api_route("/health", server.health, methods=["GET"])
    app.add_api_route("/metrics", server.prometheus, methods=["GET"])


class _Server:
    def __init__(self, engine: AsyncEngine, api_key: str | None, model_name: str, metrics: ServerMetrics):
        self.engine = engine
        self.api_key = api_key
        self.model_name = model_name
        self.metrics = metrics
        self.created = int(time.time())

    # ---- small endpoints ------------------------------------------------------------------
    async def check_api_key(self, request: Request) -> None:
        if self.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise APIError(401, "You didn't provide an API key. You need to provide your API key in an "
                                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
        if not hmac.compare_digest(token.encode(), self.api_key.encode()):
            raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")

    def _model_card(self) -> ModelCard:
        return ModelCard(id=self.model_name, created=self.created, max_model_len=self.engine.max_model_len)

    async def list_models(self) -> dict:
        return ModelList(data=[self._model_card()]).model_dump()

    async def get_model(self, model_id: str) -> dict:
        self._check_model(model_id)
        return self._model_card().model_dump()

    async def health(self) -> Response:
        if not self.engine.is_running:
            return JSONResponse(APIError(503, "The engine is not running.", type=SERVER_ERROR).to_dict(),
                                status_code=503)
        return JSONResponse({"status": "ok"})

    async def prometheus(self) -> Response:
        self.metrics.update_stats(self.engine.latest_stats)
        return Response(self.metrics.render(), media_type=PROMETHEUS_CONTENT_TYPE)

    # ---- completions ---------------------------------------------------------------------
    async def chat_completions(self, request: Request) -> Response:
        body = await _parse_body(request, ChatCompletionRequest)
        self._check_request(body)
        prompt = self._chat_prompt(body.messages)
        max_tokens, max_param = _chat_max_tokens(body, len(prompt), self.engine.max_model_len)
        params = _choice_params(body, max_tokens, max_param)
        self._check_context(prompt, max_tokens, "messages")
        job = await self._start("chatcmpl", [prompt], params, "messages")
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return _sse_response(self._chat_events(job, include_usage), job)
        await _run_unless_disconnected(request, _collect(job))
        return JSONResponse(self._chat_body(job))

    async def completions(self, request: Request) -> Response:
        body = await _parse_body(request, CompletionRequest)
        self._check_request(body)
        prompts = self._completion_prompts(body.prompt)
        max_tokens = DEFAULT_COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        params = _choice_params(body, max_tokens, "max_tokens")
        for prompt in prompts:
            self._check_context(prompt, max_tokens, "prompt")
        job = await self._start("cmpl", prompts, params, "prompt")
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return _sse_response(self._completion_events(job, include_usage), job)
        await _run_unless_disconnected(request, _collect(job))
        return JSONResponse(self._completion_body(job))

    # ---- validation ----------------------------------------------------------------------
    def _check_model(self, model: str) -> None:
        if model != self.model_name:
            raise APIError(404, f"The model `{model}` does not exist or you do not have access to it.",
                           param="model", code="model_not_found")

    def _check_request(self, body: ChatCompletionRequest | CompletionRequest) -> None:
        self._check_model(body.model)
        unsupported = unsupported_parameters(body)
        if unsupported:
            name = unsupported[0]
            raise invalid_request(f"Unsupported parameter: '{name}' is not supported by this server "
                                  f"(blockspec); leave it unset.", name, "unsupported_parameter")
        if body.stream_options is not None and not body.stream:
            raise invalid_request("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                                  "stream_options")

    def _check_context(self, prompt: list[int], max_tokens: int, prompt_param: str) -> None:
        limit = self.engine.max_model_len
        if len(prompt) + max_tokens > limit:
            where = "messages" if prompt_param == "messages" else "prompt"
            raise invalid_request(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the {where}, {max_tokens} in the "
                f"completion). Please reduce the length of the {where} or completion.",
                prompt_param, "context_length_exceeded")

    def _chat_prompt(self, messages: list[ChatMessage]) -> list[int]:
        # Templates know "system"; OpenAI's "developer" role means the same thing.
        conversation = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                        for m in messages]
        try:
            return list(self.engine.tokenizer.apply_chat_template(conversation, add_generation_prompt=True))
        except (ValueError, _TemplateError) as e:
            raise invalid_request(str(e), "messages") from e

    def _completion_prompts(self, prompt) -> list[list[int]]:
        if isinstance(prompt, str):
            prompts = [prompt]
        elif not prompt:
            raise invalid_request("prompt must not be empty", "prompt")
        else:
            prompts = prompt if not isinstance(prompt[0], int) else [prompt]
        encode = self.engine.tokenizer.encode
        ids = [list(encode(p)) if isinstance(p, str) else list(p) for p in prompts]
        if any(not p for p in ids):
            raise invalid_request("prompt must not be empty", "prompt")
        return ids

    # ---- running -------------------------------------------------------------------------
    async def _start(self, prefix: str, prompts: list[list[int]], params: list[SamplingParams],
                     prompt_param: str) -> _Job:
        """Add every choice to the engine at once; on any refusal undo the others and raise."""
        response_id = f"{prefix}-{uuid.uuid4().hex}"
        plan = [(p * len(params) + j, ids, choice_params)
                for p, ids in enumerate(prompts) for j, choice_params in enumerate(params)]
        results = await asyncio.gather(
            *(self.engine.add_request(f"{response_id}-{i}", ids, ps) for i, ids, ps in plan),
            return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for r in results:
                if isinstance(r, RequestStream):
                    r.abort()
            raise _add_error(errors[0], prompt_param)
        choices = [_Choice(i, stream) for (i, _, _), stream in zip(plan, results)]
        return _Job(response_id, int(time.time()), prompts, choices)

    # ---- response bodies -----------------------------------------------------------------
    def _envelope(self, job: _Job, obj: str) -> dict:
        return {"id": job.response_id, "object": obj, "created": job.created, "model": self.model_name}

    def _chat_body(self, job: _Job) -> dict:
        choices = [{"index": c.index,
                    "message": {"role": "assistant", "content": c.text, "refusal": None},
                    "logprobs": None, "finish_reason": c.final.finish_reason if c.final else None}
                   for c in job.choices]
        return {**self._envelope(job, "chat.completion"), "choices": choices, "usage": job.usage(),
                "spec_decoding": job.spec_decoding(self.engine.spec_algorithm)}

    def _completion_body(self, job: _Job) -> dict:
        choices = [{"index": c.index, "text": c.text, "logprobs": None,
                    "finish_reason": c.final.finish_reason if c.final else None}
                   for c in job.choices]
        return {**self._envelope(job, "text_completion"), "choices": choices, "usage": job.usage(),
                "spec_decoding": job.spec_decoding(self.engine.spec_algorithm)}

    # ---- streaming -------------------------------------------------------------------------
    def _chunk(self, job: _Job, obj: str, choices: list[dict], include_usage: bool) -> dict:
        chunk = {**self._envelope(job, obj), "choices": choices}
        if include_usage:
            chunk["usage"] = None  # OpenAI: null on every chunk but the final usage chunk
        return chunk

    def _final_chunks(self, job: _Job, obj: str, include_usage: bool) -> list[dict]:
        if not include_usage:
            return []
        return [{**self._envelope(job, obj), "choices": [], "usage": job.usage(),
                 "spec_decoding": job.spec_decoding(self.engine.spec_algorithm)}]

    async def _chat_events(self, job: _Job, include_usage: bool) -> AsyncIterator[str]:
        obj = "chat.completion.chunk"

        def choice(c: _Choice, delta: dict, finish_reason=None) -> dict:
            return {"index": c.index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

        async def events() -> AsyncIterator[dict]:
            for c in job.choices:
                yield self._chunk(job, obj, [choice(c, {"role": "assistant", "content": ""})], include_usage)
            async for c, out in _merge(job.choices):
                if out.new_text:
                    yield self._chunk(job, obj, [choice(c, {"content": out.new_text})], include_usage)
                if out.finished:
                    yield self._finish_chunk(job, obj, [choice(c, {}, out.finish_reason)], include_usage)
            for chunk in self._final_chunks(job, obj, include_usage):
                yield chunk

        async for text in _sse(events()):
            yield text

    async def _completion_events(self, job: _Job, include_usage: bool) -> AsyncIterator[str]:
        obj = "text_completion"

        async def events() -> AsyncIterator[dict]:
            async for c, out in _merge(job.choices):
                if out.new_text or out.finished:
                    choices = [{"index": c.index, "text": out.new_text, "logprobs": None,
                                "finish_reason": out.finish_reason if out.finished else None}]
                    yield self._finish_chunk(job, obj, choices, include_usage)
            for chunk in self._final_chunks(job, obj, include_usage):
                yield chunk

        async for text in _sse(events()):
            yield text

    def _finish_chunk(self, job: _Job, obj: str, choices: list[dict], include_usage: bool) -> dict:
        """A chunk; the last chunk of a stream without a usage chunk also carries spec_decoding."""
        chunk = self._chunk(job, obj, choices, include_usage)
        if job.all_finished and not include_usage:
            chunk["spec_decoding"] = job.spec_decoding(self.engine.spec_algorithm)
        return chunk


# ---- helpers -----------------------------------------------------------------------------------

async def _parse_body(request: Request, model: type[BaseModel]):
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise invalid_request("We could not parse the JSON body of your request. The body must be a "
                              "JSON object.") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise from_validation_error(e) from None


def _chat_max_tokens(body: ChatCompletionRequest, prompt_len: int, max_model_len: int) -> tuple[int, str]:
    """(max_tokens, the request field it came from); default: the rest of the context, capped."""
    if body.max_completion_tokens is not None:
        return body.max_completion_tokens, "max_completion_tokens"
    if body.max_tokens is not None:
        return body.max_tokens, "max_tokens"
    return max(1, min(max_model_len - prompt_len, DEFAULT_CHAT_MAX_TOKENS_CAP)), "max_tokens"


def _choice_params(body, max_tokens: int, max_tokens_param: str) -> list[SamplingParams]:
    """SamplingParams of each of the n choices (seed + j for choice j)."""
    values = {"temperature": 1.0 if body.temperature is None else body.temperature,
              "top_p": 1.0 if body.top_p is None else body.top_p,
              "top_k": 0 if body.top_k is None else body.top_k,
              "min_p": 0.0 if body.min_p is None else body.min_p,
              "max_tokens": max_tokens, "stop": body.stop, "stop_token_ids": body.stop_token_ids,
              "ignore_eos": body.ignore_eos}
    seeds = [None if body.seed is None else body.seed + j for j in range(body.n)]
    try:
        return [SamplingParams(**values, seed=seed) for seed in seeds]
    except ValueError as e:
        param = param_named_in(str(e), SAMPLING_FIELDS)
        raise invalid_request(str(e), max_tokens_param if param == "max_tokens" else param) from None


def _add_error(error: BaseException, prompt_param: str) -> APIError:
    if isinstance(error, ValueError):
        return invalid_request(str(error), param_named_in(str(error), SAMPLING_FIELDS) or prompt_param)
    if isinstance(error, EngineDeadError):
        return APIError(503, "The engine is not running.", type=SERVER_ERROR)
    logger.error("add_request failed", exc_info=error)
    return APIError(500, "The server had an error while processing your request.", type=SERVER_ERROR)


async def _merge(choices: list[_Choice]) -> AsyncIterator[tuple[_Choice, StepOutput]]:
    """Interleave the outputs of all choices as they arrive; records each choice's text and final
    output. Leaving early (error, cancellation, closed generator) aborts every unfinished choice."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(choice: _Choice) -> None:
        try:
            async for out in choice.stream:
                queue.put_nowait((choice, out))
        except Exception as e:
            queue.put_nowait((choice, e))
        finally:
            queue.put_nowait((choice, None))

    tasks = [asyncio.create_task(pump(c)) for c in choices]
    try:
        pending = len(tasks)
        while pending:
            choice, item = await queue.get()
            if item is None:
                pending -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                choice.text += item.new_text
                if item.finished:
                    choice.final = item
                yield choice, item
    finally:
        for task in tasks:
            task.cancel()
        for c in choices:
            c.stream.abort()


async def _collect(job: _Job) -> None:
    try:
        async for _ in _merge(job.choices):
            pass
    except EngineDeadError:
        raise APIError(503, "The engine is not running.", type=SERVER_ERROR) from None
    except EngineError as e:
        raise APIError(500, str(e), type=SERVER_ERROR) from None


async def _run_unless_disconnected(request: Request, work) -> None:
    """Await `work`; if the client hangs up first, cancel it (which aborts its engine requests)."""
    work_task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({work_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not work_task.done():
            work_task.cancel()
    try:
        await work_task
    except asyncio.CancelledError:
        if not watcher.cancelled() and watcher.done():
            raise APIError(499, "Client closed the request.") from None
        raise


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _sse_response(events: AsyncIterator[str], job: _Job) -> StreamingResponse:
    # The background task runs when the response is over, also when the client left before the
    # event generator ever started (then nothing else would abort the job's engine requests).
    return StreamingResponse(events, media_type="text/event-stream", headers=_SSE_HEADERS,
                             background=BackgroundTask(_abort_all, job))


async def _abort_all(job: _Job) -> None:  # async: runs on the event loop, not a worker thread
    for choice in job.choices:
        choice.stream.abort()  # a no-op for finished choices


def _sse_data(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def _sse(chunks: AsyncIterator[dict]) -> AsyncIterator[str]:
    """Chunks as server-sent events, then [DONE]. Headers are already sent, so an error becomes
    an error event (what OpenAI does mid-stream), never a dropped connection or a traceback."""
    try:
        async for chunk in chunks:
            yield _sse_data(chunk)
    except EngineError as e:
        yield _sse_data(APIError(500, str(e), type=SERVER_ERROR).to_dict())
    except Exception:
        logger.exception("error while streaming a response")
        yield _sse_data(APIError(500, "The server had an error while processing your request.",
                                 type=SERVER_ERROR).to_dict())
    yield "data: [DONE]\n\n"
