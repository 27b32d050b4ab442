"""Prefill warm-up on CUDA: compile the Triton kernels of every prefill shape class at startup.

Triton compiles a kernel per set of constexprs and integer specialisations (== 1, multiples of
16), and several of ours derive constexprs from the shape (the attention tile from the chunk
length, RMSNorm's reduction plan from the row count). Left alone, the first prompt of each new
length class pays a compile of 0.3–2 s (measured on an H200 for the bundled pair:
bench/results/gpu_fastpath2/host_profile_run1.txt), so a server's first requests stall. One
prefill per width in {1, 2, 3} ∪ {2^k, 2^k + 1} up to the prefill budget, each with page tables
of two widths, covers those classes at batch 1; it runs on page 0 (the padding page, never a
sequence's), so it leaves no state behind.
"""

from __future__ import annotations

import itertools
import logging
import time

import torch

from blockspec.batch import StepInputs
from blockspec.engine.prefill_graphs import prefill_and_sample
from blockspec.sampling import SamplingParams, SamplingTensors

log = logging.getLogger("blockspec.engine")


def warm_up_widths(max_tokens: int) -> list[int]:
    """Chunk widths whose prefills compile every shape class up to `max_tokens`."""
    widths = {1, 2, 3}
    k = 1
    while k <= max_tokens:
        widths |= {k, k + 1}
        k *= 2
    return sorted(w for w in widths if w <= max_tokens)


@torch.inference_mode()
def warm_up_prefill(runner, proposer, page_size: int, max_tokens: int) -> list[int]:
    """One prefill (target, drafter context, greedy and sampled draws) per warm-up width, all
    writes in page 0. Returns the widths."""
    device = runner.device
    widths = warm_up_widths(max_tokens)
    start = time.perf_counter()
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_p=0.9)]
    # Page tables of two widths per chunk: Triton specialises the page table's width and row
    # stride (== 1, multiples of 16, other), and a prompt's table may hold one page more than its
    # tokens need (the reserved lookahead). Seen on an H200: with one width, a plain chat's first
    # prefill still compiled a kernel (1 s).
    for n in widths:
        fitting = -(-n // page_size)
        for pages, p in itertools.product((fitting, fitting + 1), params):
            inputs = StepInputs(torch.zeros(1, pages, dtype=torch.long, device=device),
                                torch.zeros(1, dtype=torch.long, device=device),
                                torch.full((1,), n, dtype=torch.long, device=device),
                                torch.zeros(1, n, dtype=torch.long, device=device),
                                SamplingTensors.from_params([p], device),
                                torch.zeros(1, 1, dtype=torch.float64, device=device), page_size, [])
            prefill_and_sample(runner, proposer, inputs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    log.info("prefill warm-up: widths %s in %.1f s", widths, time.perf_counter() - start)
    return widths
