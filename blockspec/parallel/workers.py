"""The worker processes of a tensor-parallel engine, and rank 0's view of the sharded target.

Rank 0 is the engine's own process: it hosts the scheduler (and the server), holds shard 0
and starts ranks 1…N−1 as `spawn`ed processes. Every target call the engine makes (forward,
embed, logits, the cache's allocation and compaction) is broadcast to the other ranks first
(`channel.py`), then run on rank 0's shard; each rank runs its own shard, and the layers'
collectives (`layers.py`) meet inside. What the engine receives (logits gathered, hidden
states replicated after every all-reduce) is what TP=1 would compute, up to rounding.
`TensorParallelTarget.close()` stops the workers (the engine's and `LLM`'s close call it).
"""

from __future__ import annotations

import logging
import multiprocessing.connection
import os
import traceback
import weakref

import torch
import torch.multiprocessing as mp
from torch import nn

from blockspec.parallel.channel import Channel, Ref
from blockspec.parallel.group import NCCL_ENV, connect, free_port
from blockspec.parallel.load import load_shard
from blockspec.parallel.sharding import ShardPlan, shard_cache_spec

log = logging.getLogger("blockspec.parallel")
STARTUP_TIMEOUT_S = 600.0


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank r's device: the CPU, or the r-th GPU from the engine's own."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", (device.index or 0) + rank)


def worker_main(rank: int, size: int, port: int, settings: dict, conn) -> None:
    """A worker's life: join the group, load its shard, report, then run rank 0's commands."""
    device = rank_device(torch.device(settings["device"]), rank)
    if device.type == "cuda":
        os.environ.update(NCCL_ENV)
    else:
        torch.set_num_threads(settings["threads"])
    try:
        from blockspec.attention.backend import select_backend
        group = connect(rank, size, port, device)
        backend = select_backend(settings["attention_backend"], device)
        shard = load_shard(settings["model"], settings["dtype"], device, backend,
                           ShardPlan(rank, size, settings["expert_parallel"]), group)
    except BaseException:  # noqa: BLE001 - sent to rank 0, which raises it
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ready", None))
    conn.close()
    serve(shard, Channel(group), device)


@torch.inference_mode()
def serve(shard: nn.Module, channel: Channel, device: torch.device) -> None:
    """Run commands until "stop"."""
    refs: dict = {}
    while True:
        command, args = channel.receive(refs)
        if command == "stop":
            return
        if command == "forward":
            shard(*args)
        elif command == "embed":
            shard.embed(*args)
        elif command == "logits":
            shard.logits(*args)
        elif command == "allocate_cache":
            name, num_pages, page_size, dtype = args
            refs[name] = shard_cache_spec(shard).allocate(num_pages, page_size, dtype, device)
        elif command == "free_cache":
            refs.pop(args[0], None)
        elif command == "move":
            cache, src, dst = args
            cache.move(src, dst)
        elif command == "prepare_for_cuda":
            from blockspec.models.fast_path import prepare_for_cuda
            prepare_for_cuda(shard, *args)
        else:
            raise ValueError(f"unknown tensor-parallel command {command!r}")


class _Workers:
    """Ranks 1…N−1: their processes and rank 0's channel to them."""

    def __init__(self, processes: list, channel: Channel | None = None):
        self.processes, self.channel = processes, channel
        self.stopped = False

    def stop(self, timeout_s: float = 30.0) -> None:
        """Tell the workers to stop and wait for them; any still alive after `timeout_s` is
        terminated (and the log says so)."""
        if self.stopped:
            return
        self.stopped = True
        if self.channel is not None:
            try:
                self.channel.send("stop")
            except Exception as e:  # noqa: BLE001 - a dead worker: terminated below
                log.warning("tensor parallel: stop message failed (%s)", e)
        for p in self.processes:
            p.join(timeout_s if self.channel is not None else 0)
            if p.is_alive():
                log.warning("tensor-parallel worker %s did not stop; terminating it", p.name)
                p.terminate()
                p.join(timeout_s)


class ShardedCache:
    """Rank 0's K/V cache of a tensor-parallel target: its own shard (`local`), whose
    compaction (`move`) every rank repeats on its own. Other attributes are the local cache's."""

    def __init__(self, local, name: str, target: "TensorParallelTarget"):
        self.local, self.name, self._target = local, name, target

    def move(self, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
        self._target._broadcast("move", Ref(self.name), src_slots, dst_slots)
        self.local.move(src_slots, dst_slots)

    def __getattr__(self, name):
        return getattr(self.local, name)


class TensorParallelTarget(nn.Module):
    """What the engine holds as its target when `tensor_parallel_size > 1`: rank 0's shard
    (`shard`) plus the workers. `forward`, `embed`, `logits` have the target's signatures and
    results; `config` is the full model's config, `cache_spec` a rank's shard of the cache."""

    def __init__(self, shard: nn.Module, channel: Channel, workers: _Workers):
        super().__init__()
        self.shard = shard
        self.config = shard.config
        self.lm_head = shard.lm_head          # its weight's dtype / device are the serving ones
        self._channel, self._workers = channel, workers
        self._caches = 0
        self._finalizer = weakref.finalize(self, workers.stop)

    @property
    def size(self) -> int:
        return self._channel.group.size

    @property
    def cache_spec(self):
        return shard_cache_spec(self.shard)

    @property
    def backend(self):
        return self.shard.backend

    def _broadcast(self, command: str, *args) -> None:
        if self._workers.stopped:
            raise RuntimeError("the tensor-parallel workers are stopped (the engine was closed)")
        self._channel.send(command, *args)

    def forward(self, input_ids, positions, cache: ShardedCache, batch, capture_layers: tuple[int, ...] = ()):
        self._broadcast("forward", input_ids, positions, Ref(cache.name), batch, tuple(capture_layers))
        return self.shard(input_ids, positions, cache.local, batch, capture_layers)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        self._broadcast("embed", input_ids)
        return self.shard.embed(input_ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        self._broadcast("logits", hidden)
        return self.shard.logits(hidden)

    def allocate_cache(self, num_pages: int, page_size: int, dtype: torch.dtype, device: torch.device) -> ShardedCache:
        """Every rank allocates its shard of the cache (the same pages, its own heads). Several
        caches may live at once (engines sharing one target); `free_cache` drops one."""
        self._caches += 1
        name = f"cache{self._caches}"
        self._broadcast("allocate_cache", name, num_pages, page_size, dtype)
        return ShardedCache(self.cache_spec.allocate(num_pages, page_size, dtype, device), name, self)

    def free_cache(self, cache: ShardedCache) -> None:
        if not self._workers.stopped:
            self._broadcast("free_cache", cache.name)

    def prepare_for_cuda(self, fused_ops: bool) -> None:
        """`models.fast_path.prepare_for_cuda` on every rank at once (its probes are collective)."""
        from blockspec.models.fast_path import prepare_for_cuda
        self._broadcast("prepare_for_cuda", fused_ops)
        prepare_for_cuda(self.shard, fused_ops)

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        self._workers.stop()


def start_tensor_parallel(model: str, dtype: str, device: torch.device, attention_backend: str, backend,
                          size: int, expert_parallel: bool = False) -> TensorParallelTarget:
    """Start ranks 1…size−1, load rank 0's shard here, and wait until every rank is loaded.
    A worker's failure is raised here with its traceback (and every worker is stopped)."""
    settings = dict(model=str(model), dtype=dtype, device=str(device), attention_backend=attention_backend,
                    expert_parallel=expert_parallel, threads=max(1, torch.get_num_threads() // size))
    if device.type == "cuda":
        os.environ.update(NCCL_ENV)
        if torch.cuda.device_count() < (device.index or 0) + size:
            raise ValueError(f"tensor_parallel_size {size} needs {size} GPUs from {device}; "
                             f"{torch.cuda.device_count()} visible")
    port = free_port()
    ctx = mp.get_context("spawn")
    processes, conns = [], []
    workers = _Workers(processes)
    try:
        for rank in range(1, size):
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=worker_main, args=(rank, size, port, settings, child), daemon=True,
                            name=f"blockspec-tp-rank{rank}")
            p.start()
            child.close()
            processes.append(p)
            conns.append(parent)
        group = connect(0, size, port, device)
        shard = load_shard(model, dtype, device, backend, ShardPlan(0, size, expert_parallel), group)
        _wait_ready(processes, conns)
    except BaseException:
        workers.stop()
        raise
    workers.channel = Channel(group)
    log.info("tensor parallel: %d ranks (%s)%s", size, "NCCL" if device.type == "cuda" else "gloo",
             ", experts sharded across ranks" if expert_parallel else "")
    return TensorParallelTarget(shard, workers.channel, workers)


def _wait_ready(processes: list, conns: list) -> None:
    pending = dict(zip(conns, processes))
    waited = 0.0
    while pending:
        ready = multiprocessing.connection.wait(list(pending), timeout=1.0)
        waited += 1.0 if not ready else 0.0
        for conn in ready:
            p = pending.pop(conn)
            try:
                status, detail = conn.recv()
            except EOFError:
                raise RuntimeError(f"tensor-parallel worker {p.name} exited while loading "
                                   f"(exit code {p.exitcode})") from None
            if status == "error":
                raise RuntimeError(f"tensor-parallel worker {p.name} failed to load:\n{detail}")
        for conn, p in list(pending.items()):
            if not p.is_alive() and not conn.poll():
                raise RuntimeError(f"tensor-parallel worker {p.name} exited while loading (exit code {p.exitcode})")
        if waited > STARTUP_TIMEOUT_S:
            raise RuntimeError(f"tensor-parallel workers not loaded after {STARTUP_TIMEOUT_S:.0f} s")
