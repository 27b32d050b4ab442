"""Timing helpers shared by the CUDA micro-benchmarks in bench/ (scripts import it by name)."""

from __future__ import annotations

import statistics

import torch


def cuda_time_ms(fn, warmup: int, iters: int) -> float:
    """Median of `iters` calls timed with CUDA events, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def capture_graph(fn, reps: int = 1, warmup: int = 3):
    """(graph, output of the last call) of `reps` calls of `fn` captured in one CUDA graph, after
    `warmup` calls on a side stream (compilation, cuBLAS heuristics)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    out = None
    with torch.cuda.graph(graph):
        for _ in range(reps):
            out = fn()
    return graph, out
