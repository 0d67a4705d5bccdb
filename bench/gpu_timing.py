"""Timing one GPU call with CUDA events (for the bench/ scripts)."""

from __future__ import annotations

from typing import Callable

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
