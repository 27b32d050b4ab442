"""Bridge between the synchronous, single-threaded engine and asyncio.

One background thread owns the engine: it is the only thread that ever calls it. The event
loop talks to it through a thread-safe command queue that the thread drains between steps,
and gets outputs back through one `asyncio.Queue` per request, fed with
`loop.call_soon_threadsafe`. When there is no work the thread blocks on the command queue.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from blockspec.engine.outputs import SpecMetrics, StepOutput

logger = logging.getLogger("blockspec")

# After this many steps in a row without output (e.g. nothing schedulable) the thread waits a
# little for commands instead of spinning, so it cannot starve the event loop of the GIL.
_EMPTY_STEPS_BEFORE_BACKOFF = 8
_BACKOFF_SECONDS = 0.001


class EngineError(RuntimeError):
    """The engine failed while serving a request (the request is gone)."""


class EngineDeadError(EngineError):
    """The engine thread is not running (shut down or never started)."""


def device_unusable(error: BaseException) -> bool:
    """Whether a step's error left the accelerator unusable for this process: a CUDA error
    (device-side assert, illegal address…) poisons the context, so every later step would fail
    too. Out-of-memory is not one (torch raises it as its own type, "CUDA out of memory")."""
    return type(error).__name__ == "AcceleratorError" or str(error).startswith("CUDA error")


class EngineObserver(Protocol):
    """Hooks called on the engine thread (metrics, periodic logging). Must be quick."""

    def on_request_added(self, request_id: str, num_prompt_tokens: int, now: float) -> None: ...

    def on_outputs(self, outputs: Sequence[StepOutput], now: float) -> None: ...

    def on_step_done(self, stats: Any, step_seconds: float, now: float) -> None: ...

    def on_idle(self, stats: Any, now: float) -> None: ...


# ---- commands from the event loop to the engine thread ----------------------------------------

@dataclass
class _Add:
    request_id: str
    prompt_ids: list[int]
    params: Any
    sink: "_Sink"
    accepted: asyncio.Future


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Call:
    fn: Callable[[Any], Any]
    result: concurrent.futures.Future


class _Stop:
    pass


@dataclass
class _Sink:
    """Where one request's outputs go: its event loop and queue."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    last: StepOutput | None = None  # latest output, to report an abort's token counts


@dataclass
class _Tracked:
    sink: _Sink
    num_prompt_tokens: int


# ---- the consumer side -------------------------------------------------------------------------

class RequestStream:
    """Async iterator over one request's StepOutputs; `abort()` when the consumer leaves."""

    def __init__(self, owner: "AsyncEngine", request_id: str, sink: _Sink):
        self._owner = owner
        self.request_id = request_id
        self._sink = sink
        self.finished = False

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> StepOutput:
        if self.finished:
            raise StopAsyncIteration
        try:
            item = await self._sink.queue.get()
        except BaseException:  # CancelledError: the consumer went away
            self.abort()
            raise
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item

    def abort(self) -> None:
        """Stop the request in the engine; a no-op once it has finished."""
        if not self.finished:
            self.finished = True
            self._owner.abort(self.request_id)


class AsyncEngine:
    """Runs `engine.step()` on a dedicated thread; safe to use from any event loop."""

    def __init__(self, engine, *, observers: Iterable[EngineObserver] = ()):
        self.engine = engine
        self.model_name: str = engine.model_name
        self.max_model_len: int = engine.max_model_len
        self.spec_algorithm: str = engine.spec_algorithm
        self.tokenizer = engine.tokenizer
        self._observers: tuple[EngineObserver, ...] = tuple(observers)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._requests: dict[str, _Tracked] = {}  # owned by the engine thread
        self._stopped = threading.Event()
        self._empty_steps = 0  # consecutive steps that produced no output
        self.latest_stats = None  # snapshot from the engine thread, read by /metrics and /health
        self._thread = threading.Thread(target=self._run, name="blockspec-engine", daemon=True)
        self._thread.start()

    # ---- event-loop API -------------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._stopped.is_set()

    def add_observer(self, observer: EngineObserver) -> None:
        # Replace the tuple instead of mutating it: the engine thread may be iterating it.
        self._observers = self._observers + (observer,)

    async def add_request(self, request_id: str, prompt_ids: list[int], params) -> RequestStream:
        """Hand a request to the engine; raises the engine's ValueError before any output."""
        self._check_running()
        loop = asyncio.get_running_loop()
        sink = _Sink(loop, asyncio.Queue())
        accepted = loop.create_future()
        self._commands.put(_Add(request_id, list(prompt_ids), params, sink, accepted))
        try:
            await accepted
        except asyncio.CancelledError:
            # The add may still succeed on the engine thread; the abort queued after it undoes it.
            self.abort(request_id)
            raise
        return RequestStream(self, request_id, sink)

    async def generate(self, request_id: str, prompt_ids: list[int], params) -> AsyncIterator[StepOutput]:
        """Stream one request's outputs; the request is aborted if the consumer stops early."""
        stream = await self.add_request(request_id, prompt_ids, params)
        try:
            async for output in stream:
                yield output
        finally:
            stream.abort()

    def abort(self, request_id: str) -> None:
        """Thread-safe and idempotent; unknown ids are ignored."""
        self._commands.put(_Abort(request_id))

    def call(self, fn: Callable[[Any], Any]) -> concurrent.futures.Future:
        """Run `fn(engine)` on the engine thread between steps (e.g. to inspect it in tests)."""
        self._check_running()
        result: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(_Call(fn, result))
        return result

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the thread; requests still in flight get an EngineDeadError."""
        if self._thread.is_alive():
            self._commands.put(_Stop())
            self._thread.join(timeout)
        self._stopped.set()

    def _check_running(self) -> None:
        if not self.is_running:
            raise EngineDeadError("the engine is not running")

    # ---- engine thread -------------------------------------------------------------------
    def _run(self) -> None:
        self._read_stats()
        try:
            while True:
                was_busy = self._busy()
                if not self._apply_commands(self._first_command_wait()):
                    break
                if self._busy():
                    if not self._step_once():
                        break
                elif was_busy:
                    self._empty_steps = 0
                    self._notify("on_idle", self._read_stats(), time.monotonic())
        except BaseException:  # a bug in this loop itself: never leave clients hanging
            logger.exception("engine thread crashed")
        finally:
            self._stopped.set()
            self._fail_all(EngineDeadError("the engine was shut down"))
            self._fail_pending_commands()

    def _busy(self) -> bool:
        return bool(self._requests)

    def _first_command_wait(self) -> float | None:
        """None: idle, block until a command arrives; 0: busy, only drain what is queued; a
        short wait when steps have stopped producing output (nothing schedulable)."""
        if not self._busy():
            return None
        return _BACKOFF_SECONDS if self._empty_steps >= _EMPTY_STEPS_BEFORE_BACKOFF else 0.0

    def _apply_commands(self, wait: float | None) -> bool:
        """Apply queued commands, waiting `wait` seconds for the first (None: forever);
        False once a stop command was seen."""
        while True:
            try:
                command = self._commands.get(block=wait != 0, timeout=wait)
            except queue.Empty:
                return True
            wait = 0
            if isinstance(command, _Stop):
                return False
            self._apply(command)

    def _apply(self, command) -> None:
        if isinstance(command, _Add):
            self._apply_add(command)
        elif isinstance(command, _Abort):
            self._apply_abort(command.request_id)
        elif isinstance(command, _Call):
            self._apply_call(command)

    def _apply_add(self, command: _Add) -> None:
        if command.request_id in self._requests:
            error: BaseException | None = ValueError(f"request_id {command.request_id!r} is already in use")
        else:
            try:
                self.engine.add_request(command.request_id, command.prompt_ids, command.params)
                error = None
            except Exception as e:  # ValueError is the expected kind; anything else is a bug
                error = e
        if error is None:
            self._requests[command.request_id] = _Tracked(command.sink, len(command.prompt_ids))
            self._notify("on_request_added", command.request_id, len(command.prompt_ids), time.monotonic())
        _resolve(command.sink.loop, command.accepted, error)

    def _apply_abort(self, request_id: str) -> None:
        tracked = self._requests.pop(request_id, None)
        if tracked is None:
            return
        self._abort_in_engine(request_id)
        self._notify("on_outputs", [_abort_output(request_id, tracked)], time.monotonic())

    def _apply_call(self, command: _Call) -> None:
        try:
            command.result.set_result(command.fn(self.engine))
        except Exception as e:
            command.result.set_exception(e)

    def _abort_in_engine(self, request_id: str) -> None:
        try:
            self.engine.abort_request(request_id)
        except Exception:
            logger.exception("abort_request(%r) failed", request_id)

    def _step_once(self) -> bool:
        """One engine step and its delivery; False when the engine cannot go on."""
        started = time.monotonic()
        try:
            outputs = self.engine.step()
        except Exception as e:
            logger.exception("engine step failed; failing %d request(s)", len(self._requests))
            self._fail_all(EngineError(f"the engine failed: {type(e).__name__}"))
            if device_unusable(e):
                logger.error("the device is unusable after that error (a CUDA error is sticky): the engine stops, "
                             "/health answers 503 and new requests are refused; restart the server")
                return False
            return True
        now = time.monotonic()
        self._empty_steps = 0 if outputs else self._empty_steps + 1
        # Observers (metrics) first, so a client that scrapes /metrics right after its last
        # chunk sees the step that produced it.
        self._notify("on_outputs", outputs, now)
        self._notify("on_step_done", self._read_stats(), now - started, now)
        self._deliver(outputs)
        return True

    def _deliver(self, outputs: Sequence[StepOutput]) -> None:
        """Route outputs to their requests' queues, one loop wake-up per event loop."""
        batches: dict[asyncio.AbstractEventLoop, list] = {}
        for output in outputs:
            tracked = self._requests.get(output.request_id)
            if tracked is None:
                continue  # aborted meanwhile, or not ours
            if output.finished:
                del self._requests[output.request_id]
                # The engine keeps mutating its metrics object; hand out a frozen copy.
                output = replace(output, metrics=copy.deepcopy(output.metrics))
            tracked.sink.last = output
            batches.setdefault(tracked.sink.loop, []).append((tracked.sink.queue, output))
        for loop, items in batches.items():
            _post(loop, _put_all, items)

    def _fail_all(self, error: EngineError) -> None:
        """Remove every request from the engine and hand each consumer `error`."""
        failed, self._requests = self._requests, {}
        now = time.monotonic()
        for request_id, tracked in failed.items():
            self._abort_in_engine(request_id)
            self._notify("on_outputs", [_abort_output(request_id, tracked)], now)
            _post(tracked.sink.loop, tracked.sink.queue.put_nowait, error)

    def _fail_pending_commands(self) -> None:
        """After the loop ended: nothing queued may wait forever."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Add):
                _resolve(command.sink.loop, command.accepted, EngineDeadError("the engine was shut down"))
            elif isinstance(command, _Call):
                command.result.set_exception(EngineDeadError("the engine was shut down"))

    def _read_stats(self):
        try:
            self.latest_stats = self.engine.stats()
        except Exception:
            logger.exception("engine.stats() failed")
        return self.latest_stats

    def _notify(self, hook: str, *args) -> None:
        for observer in self._observers:
            try:
                getattr(observer, hook)(*args)
            except Exception:
                logger.exception("observer %s.%s failed", type(observer).__name__, hook)


def _abort_output(request_id: str, tracked: _Tracked) -> StepOutput:
    """The output an aborted request would have finished with (for metrics only)."""
    last = tracked.sink.last
    return StepOutput(request_id, [], "", True, "abort", tracked.num_prompt_tokens,
                      last.num_output_tokens if last else 0,
                      copy.deepcopy(last.metrics) if last else SpecMetrics())


def _put_all(items: list) -> None:
    for q, item in items:
        q.put_nowait(item)


def _post(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass  # that event loop is closed: nobody is listening any more


def _resolve(loop: asyncio.AbstractEventLoop, future: asyncio.Future, error: BaseException | None) -> None:
    def settle() -> None:
        if future.done():
            return  # the waiter was cancelled
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
    _post(loop, settle)
