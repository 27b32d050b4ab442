"""AsyncEngine: one engine thread, validation before output, aborts, failures, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest

from blockspec.sampling import SamplingParams
from blockspec.server.async_engine import AsyncEngine, EngineDeadError, EngineError
from fake_engine import FakeEngine

TIMEOUT = 10.0


@pytest.fixture
def engine():
    return FakeEngine(step_delay=0.002, spec_algorithm="none")


@pytest.fixture
def async_engine(engine):
    ae = AsyncEngine(engine)
    yield ae
    ae.shutdown()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT))


async def collect(ae: AsyncEngine, rid: str, prompt, params) -> list:
    return [out async for out in ae.generate(rid, prompt, params)]


def test_generate_streams_deltas_until_finished(async_engine, engine):
    outs = run(collect(async_engine, "r", [5, 6], SamplingParams(temperature=0, max_tokens=5)))
    assert [len(o.new_token_ids) for o in outs] == [1] * 5  # spec "none": one token per step
    assert [o.finished for o in outs] == [False] * 4 + [True]
    assert outs[-1].finish_reason == "length" and outs[-1].num_output_tokens == 5
    assert "".join(o.new_text for o in outs) == engine.tokenizer.decode(sum((o.new_token_ids for o in outs), []))


def test_add_request_error_arrives_before_any_output(async_engine, engine):
    async def go():
        with pytest.raises(ValueError, match="context length"):
            await async_engine.add_request("big", [5] * 300, SamplingParams(max_tokens=4))
    run(go())
    assert engine.added == []


def test_concurrent_requests_all_finish_and_engine_stays_on_one_thread(async_engine, engine):
    async def go():
        params = SamplingParams(temperature=0, max_tokens=7)
        return await asyncio.gather(*(collect(async_engine, f"r{i}", [5 + i], params) for i in range(6)))
    results = run(go())
    assert [sum(len(o.new_token_ids) for o in outs) for outs in results] == [7] * 6
    assert len(engine.calling_threads) == 1
    assert threading.get_ident() not in engine.calling_threads


def test_idle_engine_thread_does_not_step(async_engine, engine):
    run(collect(async_engine, "r", [5], SamplingParams(max_tokens=3)))
    steps = engine.num_steps
    time.sleep(0.2)
    assert engine.num_steps == steps


def test_closing_the_generator_early_aborts(async_engine, engine):
    async def go():
        params = SamplingParams(temperature=0, max_tokens=100)
        async with contextlib.aclosing(async_engine.generate("r", [5], params)) as outs:
            async for _ in outs:
                break
    run(go())
    assert async_engine.call(lambda e: e.has_unfinished_requests()).result(TIMEOUT) is False
    assert engine.aborted == ["r"]


def test_cancelling_the_consumer_aborts(async_engine, engine):
    async def go():
        task = asyncio.create_task(collect(async_engine, "r", [5], SamplingParams(max_tokens=200)))
        while engine.num_steps < 3:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    run(go())
    assert async_engine.call(lambda e: e.has_unfinished_requests()).result(TIMEOUT) is False
    assert engine.aborted == ["r"]


def test_step_failure_fails_the_requests_and_the_engine_keeps_serving(async_engine, engine):
    async def go():
        engine.fail_next_step = True  # read by the engine thread on its next step
        with pytest.raises(EngineError):
            await collect(async_engine, "doomed", [5], SamplingParams(max_tokens=50))
        return await collect(async_engine, "next", [5], SamplingParams(max_tokens=3))
    outs = run(go())
    assert outs[-1].finished
    assert "doomed" in engine.aborted


def test_a_cuda_error_stops_the_engine(engine):
    """A CUDA error poisons the device (every later step would fail): the requests fail, the
    engine stops and refuses new ones, rather than retrying on a dead context. An ordinary step
    error (above) and out-of-memory keep it serving."""
    import torch
    from blockspec.server.async_engine import device_unusable
    assert device_unusable(torch.AcceleratorError("CUDA error: device-side assert triggered"))
    assert device_unusable(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not device_unusable(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not device_unusable(RuntimeError("injected step failure"))
    ae = AsyncEngine(engine)

    async def go():
        engine.fail_next_step = torch.AcceleratorError("CUDA error: device-side assert triggered")
        with pytest.raises(EngineError):
            await collect(ae, "doomed", [5], SamplingParams(max_tokens=50))
        while ae.is_running:
            await asyncio.sleep(0.005)
        with pytest.raises(EngineDeadError):
            await ae.add_request("late", [5], SamplingParams())
    try:
        run(go())
    finally:
        ae.shutdown()
    assert "doomed" in engine.aborted and not ae.is_running


def test_shutdown_fails_requests_in_flight_and_refuses_new_ones(engine):
    engine.step_delay = 0.01
    ae = AsyncEngine(engine)

    async def go():
        task = asyncio.create_task(collect(ae, "r", [5], SamplingParams(max_tokens=200)))
        while engine.num_steps < 2:
            await asyncio.sleep(0.005)
        await asyncio.to_thread(ae.shutdown)
        with pytest.raises(EngineDeadError):
            await task
        with pytest.raises(EngineDeadError):
            await ae.add_request("late", [5], SamplingParams())
    run(go())
    assert not ae.is_running


def test_call_runs_on_the_engine_thread(async_engine, engine):
    run(collect(async_engine, "r", [5], SamplingParams(max_tokens=2)))
    assert {async_engine.call(lambda e: threading.get_ident()).result(TIMEOUT)} == engine.calling_threads
    with pytest.raises(ZeroDivisionError):
        async_engine.call(lambda e: 1 / 0).result(TIMEOUT)


def test_two_event_loops_can_share_one_engine(async_engine):
    """Each request's queue belongs to the loop that made it (e.g. one loop per test thread)."""
    results = {}

    def worker(i: int) -> None:
        results[i] = run(collect(async_engine, f"t{i}", [5], SamplingParams(temperature=0, max_tokens=4)))
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert [results[i][-1].num_output_tokens for i in range(2)] == [4, 4]


class _StalledEngine(FakeEngine):
    """Has a request but never makes progress (as when nothing can be scheduled)."""

    def step(self):
        self._called()
        self.num_steps += 1
        return []


def test_a_stalled_engine_is_not_stepped_in_a_hot_loop():
    engine = _StalledEngine()
    ae = AsyncEngine(engine)

    async def go():
        stream = await ae.add_request("stuck", [5], SamplingParams(max_tokens=4))
        await asyncio.sleep(0.2)
        stream.abort()
    try:
        run(go())
    finally:
        ae.shutdown()
    # Backing off 1 ms per step allows at most ~200 steps in 0.2 s; a hot loop makes many thousands.
    assert 8 <= engine.num_steps < 400
    assert engine.aborted == ["stuck"]
