"""Programmatic dependent launch (PDL): each kernel here may be launched while the one before it
in the stream is still finishing.

A step is ~200 kernels, most of them small at one frame, so if the GPU's gap between one
kernel's end and the next one's start (its launch, its programs' placement, their prologue) were
a large part of a small step's replay, overlapping them would pay. On sm90 and later a launch
with the programmatic-serialization attribute (Triton's ``launch_pdl``) lets the next kernel be
placed as soon as every program of the current one has signalled (``gdc_launch_dependents``); it
then waits in ``gdc_wait`` until the current kernel has finished and its writes are visible. CUDA
graphs keep these edges. Measured on the H200 it did not pay (BENCHMARKS.md, session 20: the
replays were no faster at one frame, slightly slower at 16-20 x 25), so ``LayerChoices.pdl`` is
off; the knob stays for the A/B on other GPUs.

The contract, kept by :func:`wait_previous` as every such kernel's first statement: a kernel
launched this way touches no memory before its ``gdc_wait``. Kernels without the attribute
(cuBLAS, cuDNN, torch's own) wait for their predecessor in full, as always, so the order of
every read and write in a step is the one without PDL.

The switch is per thread and set around a model's forward (``Decoder.front``/``back``, from
``LayerChoices.pdl``), so the graphs captured there and the eager steps agree; kernels called
outside a forward (the bench scripts' single kernels) launch plainly.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

try:  # as in kernels/snake.py: CPU-only installs have no Triton
    import triton
except ImportError:  # pragma: no cover - depends on the install
    triton = None

_local = threading.local()


@contextmanager
def launches(enabled: bool) -> Iterator[None]:
    """Launch this thread's kernels with PDL inside the block where the device has it (nests)."""
    was = getattr(_local, "on", False)
    _local.on = enabled
    try:
        yield
    finally:
        _local.on = was


@functools.cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def options(x: Tensor) -> dict[str, Any]:
    """Launch keywords for a kernel that takes a ``PDL`` constexpr: on where this thread asked
    for it (:func:`launches`) and ``x`` is on an sm90+ GPU (never in Triton's interpreter)."""
    on = getattr(_local, "on", False) and x.is_cuda and _capable(x.device.index)  # a CUDA tensor's device has its index
    return {"PDL": on, "launch_pdl": on}


if triton is not None:
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    @triton.jit
    def wait_previous(PDL: tl.constexpr):
        """A PDL kernel's first statement: wait until the previous kernel has finished (its
        writes visible), then let the next one be placed. A no-op without PDL."""
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
