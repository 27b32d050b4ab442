"""The OpenAI-compatible FastAPI app: /v1/chat/completions, /v1/completions, /v1/models,
/health, /metrics.

A request is validated completely (body size, schema, model, unsupported fields, sampling
parameters, context length, and the engine's own add_request) before any byte of the response is
sent, so every invalid request gets a proper 4xx. Parsing and tokenising run on worker threads
(`prepare.py`), never on the event loop. n choices are n engine requests that run concurrently;
choice j of a seeded request uses seed + j.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from blockspec.engine.outputs import SpecMetrics, StepOutput
from blockspec.server.async_engine import AsyncEngine, EngineDeadError, EngineError, RequestStream
from blockspec.server.errors import (SERVER_ERROR, APIError, install_error_handlers, internal_error, invalid_request,
                                     log_unexpected, param_named_in, request_id_of)
from blockspec.server.limits import RequestLimits, read_body
from blockspec.server.logprobs_format import LogprobFormatter
from blockspec.server.metrics import PROMETHEUS_CONTENT_TYPE, ServerMetrics
from blockspec.server.openapi import install_openapi
from blockspec.server.prepare import SAMPLING_FIELDS, Prepared, RequestPreparer
from blockspec.server.constraints import ToolPlan
from blockspec.server.protocol import ModelCard, ModelList
from blockspec.server.tool_calls import ToolCallStream

logger = logging.getLogger("blockspec")

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass
class _Choice:
    """One choice of a response = one engine request."""

    index: int
    stream: RequestStream
    text: str = ""
    final: StepOutput | None = None
    logprobs: list = field(default_factory=list)  # TokenLogprobs of every token so far
    text_offset: int = 0                          # completions stream: characters of tokens already sent
    tool_stream: ToolCallStream | None = None  # a tools request's streamed reply, parsed for calls


@dataclass
class _Job:
    """A validated request, running in the engine."""

    response_id: str
    created: int
    prompts: list[list[int]]
    choices: list[_Choice]
    request_id: str | None = None  # the HTTP request's id, for the log
    logprobs: bool = False         # the request asked for logprobs
    tools: ToolPlan | None = None

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
               served_model_name: str | None = None, metrics: ServerMetrics | None = None,
               limits: RequestLimits | None = None, allow_special_tokens_in_content: bool = False) -> FastAPI:
    """Build the app. The caller owns `async_engine` and shuts it down after the server stops.

    allow_special_tokens_in_content: encode special-token text in chat messages as the special
    tokens (trusted clients only; by default it is ordinary text and cannot forge a turn)."""
    model_name = served_model_name or async_engine.model_name
    preparer = RequestPreparer(async_engine.tokenizer, model_name, async_engine.max_model_len,
                               allow_special_tokens_in_content=allow_special_tokens_in_content)
    server = _Server(async_engine, api_key, model_name, metrics or ServerMetrics(), preparer,
                     limits or RequestLimits())
    async_engine.add_observer(server.metrics)
    app = FastAPI(title="blockspec", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    install_error_handlers(app)
    _add_routes(app, server)
    install_openapi(app, model_name, server.limits)
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
    def __init__(self, engine: AsyncEngine, api_key: str | None, model_name: str, metrics: ServerMetrics,
                 preparer: RequestPreparer, limits: RequestLimits):
        self.engine = engine
        self.api_key = api_key
        self.model_name = model_name
        self.metrics = metrics
        self.preparer = preparer
        self.limits = limits
        self.created = int(time.time())
        self.logprob_format = LogprobFormatter(engine.tokenizer)

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
        self.preparer.check_model(model_id)
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
        prepared = await self._prepare(request, self.preparer.chat)
        job = await self._start("chatcmpl", prepared, request_id_of(request))
        if prepared.body.stream:
            return _sse_response(self._chat_events(job, _include_usage(prepared)), job)
        await _run_unless_disconnected(request, _collect(job))
        return JSONResponse(self._chat_body(job))

    async def completions(self, request: Request) -> Response:
        prepared = await self._prepare(request, self.preparer.completion)
        job = await self._start("cmpl", prepared, request_id_of(request))
        if prepared.body.stream:
            return _sse_response(self._completion_events(job, _include_usage(prepared)), job)
        await _run_unless_disconnected(request, _collect(job))
        return JSONResponse(self._completion_body(job))

    async def _prepare(self, request: Request, prepare: Callable[[bytes], Prepared]) -> Prepared:
        """Read the body within the limits, then parse, validate and tokenise it off the loop: on
        the loop's default thread pool (a few threads, so one huge prompt does not hold up the
        short ones; shut down with the loop)."""
        raw = await read_body(request, self.limits)
        return await asyncio.get_running_loop().run_in_executor(None, prepare, raw)

    # ---- running -------------------------------------------------------------------------
    async def _start(self, prefix: str, prepared: Prepared, request_id: str | None) -> _Job:
        """Add every choice to the engine at once; on any refusal undo the others and raise."""
        prompts, params, prompt_param = prepared.prompts, prepared.params, prepared.prompt_param
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
        parses = bool(prepared.tools and prepared.tools.parses_calls)
        choices = [_Choice(i, stream, tool_stream=prepared.tools.format.stream() if parses else None)
                   for (i, _, _), stream in zip(plan, results)]
        return _Job(response_id, int(time.time()), prompts, choices, request_id, params[0].logprobs is not None,
                    prepared.tools)

    # ---- response bodies -----------------------------------------------------------------
    def _envelope(self, job: _Job, obj: str) -> dict:
        return {"id": job.response_id, "object": obj, "created": job.created, "model": self.model_name}

    def _chat_body(self, job: _Job) -> dict:
        choices = []
        for c in job.choices:
            message = {"role": "assistant", "content": c.text, "refusal": None}
            reason = c.final.finish_reason if c.final else None
            if c.tool_stream is not None:
                fields, reason = job.tools.format.reply(c.text, reason)
                message.update(fields)
            choices.append({"index": c.index, "message": message,
                            "logprobs": self.logprob_format.chat(c.logprobs) if job.logprobs else None,
                            "finish_reason": reason})
        return {**self._envelope(job, "chat.completion"), "choices": choices, "usage": job.usage(),
                "spec_decoding": job.spec_decoding(self.engine.spec_algorithm)}

    def _completion_body(self, job: _Job) -> dict:
        choices = [{"index": c.index, "text": c.text,
                    "logprobs": self.logprob_format.completion(c.logprobs, 0) if job.logprobs else None,
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

        def choice(c: _Choice, delta: dict, finish_reason=None, logprobs=None) -> dict:
            return {"index": c.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

        async def events() -> AsyncIterator[dict]:
            for c in job.choices:
                yield self._chunk(job, obj, [choice(c, {"role": "assistant", "content": ""})], include_usage)
            async for c, out in _merge(job.choices):
                logprobs = self.logprob_format.chat(out.logprobs) if job.logprobs and out.logprobs else None
                reason = out.finish_reason
                if c.tool_stream is None:
                    deltas = [{"content": out.new_text}] if out.new_text or logprobs else []
                else:
                    deltas, reason = c.tool_stream.step(out.new_text, out.finished, reason)
                    # The tokens' logprobs go out even while their text is held back.
                    deltas = deltas or ([{}] if logprobs else [])
                for k, delta in enumerate(deltas):
                    yield self._chunk(job, obj, [choice(c, delta, logprobs=logprobs if k == 0 else None)],
                                      include_usage)
                if out.finished:
                    yield self._finish_chunk(job, obj, [choice(c, {}, reason)], include_usage)
            for chunk in self._final_chunks(job, obj, include_usage):
                yield chunk

        async for text in _sse(events(), job.request_id):
            yield text

    async def _completion_events(self, job: _Job, include_usage: bool) -> AsyncIterator[str]:
        obj = "text_completion"

        async def events() -> AsyncIterator[dict]:
            async for c, out in _merge(job.choices):
                if out.new_text or out.finished or (job.logprobs and out.logprobs):
                    logprobs = None
                    if job.logprobs:
                        logprobs = self.logprob_format.completion(out.logprobs or [], c.text_offset)
                        c.text_offset += self.logprob_format.completion_length(out.logprobs or [])
                    choices = [{"index": c.index, "text": out.new_text, "logprobs": logprobs,
                                "finish_reason": out.finish_reason if out.finished else None}]
                    yield self._finish_chunk(job, obj, choices, include_usage)
            for chunk in self._final_chunks(job, obj, include_usage):
                yield chunk

        async for text in _sse(events(), job.request_id):
            yield text

    def _finish_chunk(self, job: _Job, obj: str, choices: list[dict], include_usage: bool) -> dict:
        """A chunk; the last chunk of a stream without a usage chunk also carries spec_decoding."""
        chunk = self._chunk(job, obj, choices, include_usage)
        if job.all_finished and not include_usage:
            chunk["spec_decoding"] = job.spec_decoding(self.engine.spec_algorithm)
        return chunk


# ---- helpers -----------------------------------------------------------------------------------

def _include_usage(prepared: Prepared) -> bool:
    options = prepared.body.stream_options
    return bool(options and options.include_usage)


def _add_error(error: BaseException, prompt_param: str) -> BaseException:
    """What a refused add_request becomes: a 400, a 503, or (a bug) itself, for the middleware's
    single 500 log line."""
    if isinstance(error, ValueError):
        return invalid_request(str(error), param_named_in(str(error), SAMPLING_FIELDS) or prompt_param)
    if isinstance(error, EngineDeadError):
        return APIError(503, "The engine is not running.", type=SERVER_ERROR)
    return error


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
                choice.logprobs.extend(item.logprobs or [])
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


async def _sse(chunks: AsyncIterator[dict], request_id: str | None) -> AsyncIterator[str]:
    """Chunks as server-sent events, then [DONE]. Headers are already sent, so an error becomes
    an error event (what OpenAI does mid-stream), never a dropped connection or a traceback."""
    try:
        async for chunk in chunks:
            yield _sse_data(chunk)
    except EngineError as e:
        yield _sse_data(APIError(500, str(e), type=SERVER_ERROR).to_dict())
    except Exception as e:
        log_unexpected(request_id, "streaming a response", e)
        yield _sse_data(internal_error().to_dict())
    yield "data: [DONE]\n\n"
