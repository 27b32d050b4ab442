"""Overlapped decoding: the host prepares step N+1 and launches it before it reads step N's result.

Without overlap every decode step is: host builds inputs → GPU runs the step → host reads the
result, commits, detokenizes — and the GPU idles through both host parts. With a CUDA graph and
drafting on the device, step N+1 needs only two things from step N that the host does not have
yet: each row's cached length and its last committed token. Step N's graph writes both to the
graphs' carry buffer and step N+1's graph reads them from there (its inputs name each row's row
in step N), so the host launches N+1 — one pinned host→device copy, the replay, one
device→host copy — and then waits for N's result, which it commits while the GPU works.

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

from blockspec.speculative.step import StepResult


@dataclass
class InFlightStep:
    """A launched decode step. `host` is `[B, 2 + 2W]` (accepted, drafted, committed, path), valid
    once `ready` has completed; `replay` numbers the graph replay it was (its carry is fresh
    only until the next one)."""

    seqs: list
    host: torch.Tensor
    ready: "torch.cuda.Event | None"
    replay: int
    width: int = 1           # the verify width it was launched at (engine/spec_policy.py)

    def result(self) -> StepResult:
        """Wait for the step and read its result (the step's one host synchronisation)."""
        if self.ready is not None:
            self.ready.synchronize()
        return StepResult.from_rows(self.host.tolist())


def launch_decode(graphed, seqs, uniforms: torch.Tensor, previous: InFlightStep | None) -> InFlightStep:
    """Launch one graphed decode step over `seqs` without waiting for anything. With a step
    `previous` still in flight, every row must have been in it; its prefix and root come from
    that step's carry on the device (the host's copy of them is one step behind)."""
    rows = None
    if previous is not None:
        if previous.replay != graphed.replays:
            raise ValueError("the step in flight is not the last one replayed: its carry was overwritten")
        where = {id(s): i for i, s in enumerate(previous.seqs)}
        if any(id(s) not in where for s in seqs):
            raise ValueError("an overlapped step may only drop rows of the step in flight, never add one")
        rows = [where[id(s)] for s in seqs]
    result = graphed.launch(seqs, uniforms, rows)
    if graphed.device.type != "cuda":
        return InFlightStep(list(seqs), result.clone(), None, graphed.replays)
    host = torch.empty(result.shape, dtype=result.dtype, pin_memory=True)
    host.copy_(result, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return InFlightStep(list(seqs), host, ready, graphed.replays)
