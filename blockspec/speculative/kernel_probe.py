"""The check a CUDA path runs before adopting a speculative kernel (tree search, children draws,
tree verification): the kernel on the device against its reference on the CPU, on a probe the
caller built. A kernel that raises or differs is not used, and the caller logs why."""

from __future__ import annotations

from typing import Callable

import torch


def kernel_mismatch(kernel: Callable, reference: Callable, args: tuple, device: torch.device,
                    outputs: Callable = lambda result: result) -> str:
    """'' when `kernel(*args on device)` equals `reference(*args)` exactly, else the reason.
    `outputs(result)` picks the tensors to compare (a tuple, or one tensor)."""
    try:
        want = outputs(reference(*args))
        got = outputs(kernel(*[a.to(device) if torch.is_tensor(a) else a for a in args]))
        want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
        return "" if all(torch.equal(g.cpu(), w) for g, w in zip(got, want)) else "its result differs from the reference's"
    except Exception as e:  # noqa: BLE001 - the reason is the caller's log line
        return f"{type(e).__name__}: {e}"[:200]
