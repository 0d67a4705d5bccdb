"""Instant forms: the layer forms whose first run at a new shape costs nothing to prepare.

The fast forms of a step cost a lot the first time they meet a shape: each Triton kernel
specialisation is loaded (or compiled, on a cold cache), and cuDNN builds a plan for every
convolution (the first run of a new step shape, BENCHMARKS.md "From a cold start"). A service
that starts while its graphs are still being warmed (``EngineConfig.graph_capture =
"background"``) runs its steps eagerly meanwhile, each at a shape it may meet for the first
time; there the instant forms run instead: torch's own formulas in place of every Triton
kernel (the kernels' one gate, ``snake.fused``, says no), and every convolution as products of
shifted views (``CausalConv1d``, ``CausalConvTranspose1d``), so no cuDNN plan is built. Same
maths, slower per step, ready at once.

The switch is per thread: the engine's worker runs instant steps while the warm-up thread
beside it gives the fast forms their first runs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()


def active() -> bool:
    """Whether this thread runs the instant forms now."""
    return getattr(_local, "on", False)


@contextmanager
def forms() -> Iterator[None]:
    """Run the instant forms on this thread inside the block (nests; other threads unaffected)."""
    was = active()
    _local.on = True
    try:
        yield
    finally:
        _local.on = was
