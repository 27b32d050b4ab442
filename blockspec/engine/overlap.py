"""Overlapped decoding: the host prepares step N+1 and launches it before it reads step N's result.

Without overlap every decode step is: host builds inputs → GPU runs the step → host reads the
result, commits, detokenizes — and the GPU idles through both host parts. With a CUDA graph and
drafting on the device, step N+1 needs only two things from step N that the host does not have
yet: each row's cached length and its last committed token. Both are computed on the device
from step N's outputs (`next_prefix`, `next_root`) and written into step N+1's inputs there, so
the host launches N+1 first and then waits for N's result, which it commits while the GPU works.

What keeps this exact: a step's inputs are the same values the synchronous engine would have
built (only who computes them differs), and every row draws the same uniforms per step. Rows of
step N+1 whose request finished in step N are wasted work: their result is dropped, and the
pages they write were either still theirs or reused only by later GPU work (one stream orders
it). The engine drains the step in flight before anything that changes the batch beyond
removals: admissions and prefills, preemption, a batch past the largest graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from blockspec.batch import pack_decode, unpack_decode
from blockspec.speculative.step import StepResult, packed_result


@dataclass
class InFlightStep:
    """A launched decode step. `host` is `[B, 2 + W]` (accepted, drafted, committed…), valid
    once `ready` has completed; `next_prefix` / `next_root` `[B]` stay on the device."""

    seqs: list
    host: torch.Tensor
    ready: "torch.cuda.Event | None"
    next_prefix: torch.Tensor
    next_root: torch.Tensor

    def result(self) -> StepResult:
        """Wait for the step and read its result (the step's one host synchronisation)."""
        if self.ready is not None:
            self.ready.synchronize()
        return StepResult.from_rows(self.host.tolist())


def launch_decode(graphed, seqs, uniforms: torch.Tensor, page_size: int, device: torch.device,
                  previous: InFlightStep | None) -> InFlightStep:
    """Launch one graphed decode step over `seqs` without waiting for anything. With a step
    `previous` still in flight, every row must have been in it; its prefix and root come from
    that step's device outputs (the host's copy of them is one step behind)."""
    cuda = device.type == "cuda"
    packed = pack_decode(seqs, uniforms, device, non_blocking=cuda)
    if previous is not None:
        where = {id(s): i for i, s in enumerate(previous.seqs)}
        if any(id(s) not in where for s in seqs):
            raise ValueError("an overlapped step may only drop rows of the step in flight, never add one")
        rows = torch.tensor([where[id(s)] for s in seqs], dtype=torch.long)
        rows = rows.pin_memory().to(device, non_blocking=True) if cuda else rows
        packed.ints[0] = previous.next_prefix[rows]
        packed.ints[1] = previous.next_root[rows]
    inputs = unpack_decode(packed, page_size, seqs, all(s.params.greedy for s in seqs))
    result, num_nodes = graphed(inputs, None)
    # Enqueued before any later step can overwrite the graph's output buffers.
    next_prefix = packed.ints[0] + result.accept_len + 1
    next_root = result.committed.gather(1, result.accept_len[:, None])[:, 0]
    rows_out = packed_result(result, num_nodes)
    if not cuda:
        return InFlightStep(list(seqs), rows_out, None, next_prefix, next_root)
    host = torch.empty(rows_out.shape, dtype=rows_out.dtype, pin_memory=True)
    host.copy_(rows_out, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return InFlightStep(list(seqs), host, ready, next_prefix, next_root)
