"""One tensor-parallel process group, made without torch.distributed's global default group.

`connect(rank, size, port, device)` rendezvous over a TCP store on 127.0.0.1 and returns a
`Group`: gloo on CPU, NCCL on CUDA (NVLink multicast kept off: `NCCL_ENV`). The group is an
object passed to the layers that need it; nothing is registered globally, so several engines
(TP=2 and TP=4) can live in one process.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

# Set in every rank's environment before NCCL starts (the machines' NVLink multicast is off).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the store binds it right after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Group:
    """rank / size of this process, its device, and the collectives the sharded layers use.
    Every collective is called by every rank in the same order (they block until all arrive)."""

    def __init__(self, rank: int, size: int, device: torch.device, pg, store):
        self.rank, self.size, self.device = rank, size, device
        self._pg, self._store = pg, store

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over the ranks, in place (`t` contiguous); returns `t`."""
        if self.size > 1:
            self._pg.allreduce([t]).wait()
        return t

    def all_gather(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's `t` (same shape) concatenated along `dim`, rank order."""
        if self.size == 1:
            return t
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.size)]
        self._pg.allgather([parts], [t]).wait()
        return torch.cat(parts, dim=dim)

    def broadcast(self, t: torch.Tensor, root: int = 0) -> torch.Tensor:
        """`t` (contiguous, same shape and dtype everywhere) overwritten with root's, in place.
        bool tensors travel as uint8 (gloo has no bool)."""
        if self.size > 1 and t.numel():
            wire = t.view(torch.uint8) if t.dtype == torch.bool else t
            self._pg.broadcast(wire, root).wait()
        return t

    def barrier(self) -> None:
        self.broadcast(torch.zeros(1, device=self.device))


def connect(rank: int, size: int, port: int, device: torch.device, timeout_s: float = 300.0) -> Group:
    """Join the group of `size` ranks whose rank 0 serves the store on `port`. Blocks until all
    ranks have joined (at most `timeout_s`)."""
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, {size}), got {rank}")
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore("127.0.0.1", port, size, rank == 0, timeout=timeout)
    prefix = dist.PrefixStore("blockspec-tp", store)
    if device.type == "cuda":
        os.environ.update(NCCL_ENV)
        torch.cuda.set_device(device)
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = dist.ProcessGroupNCCL(prefix, rank, size, opts)
    else:
        opts = dist.ProcessGroupGloo._Options()
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        opts._timeout = timeout
        pg = dist.ProcessGroupGloo(prefix, rank, size, opts)
    return Group(rank, size, device, pg, store)
