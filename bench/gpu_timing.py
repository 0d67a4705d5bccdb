"""Timing one GPU call with CUDA events (for the bench/ scripts): launched one by one, or
replayed from a CUDA graph (so launch gaps are the GPU's, as in a step's graph)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def timed(fn: Callable[[], object], reps: int = 20, warmup: int = 3) -> float:
    """Mean GPU time of ``fn()`` in microseconds, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1e3


def timed_in_graph(fn: Callable[[], object], calls: int = 50, replays: int = 10) -> float:
    """Mean GPU time of ``fn()`` in microseconds, ``calls`` of it captured in one CUDA graph
    (after 3 warm-up calls on a side stream) and the graph replayed ``replays`` times."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * calls)
