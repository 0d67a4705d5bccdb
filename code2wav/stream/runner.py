"""The seam between the engine and the device: a runner runs one step's forward.

The engine hands a runner a step's host inputs (codes ``[B, Q, T]``, slots ``[B]``, new frames
per row ``[B]``) and gets the audio ``[B, T * 1920]``; the state moves inside the pool. A runner
also says what shapes it runs best, which the engine's scheduling and staging follow. Two
runners exist: :class:`EagerRunner` here, and ``code2wav.engine.graphs.GraphRunner``, which
replays CUDA graphs and runs eagerly what no graph holds.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor

from code2wav.model.decoder import Decoder
from code2wav.stream.pool import StatePool


class Runner(Protocol):
    model: Decoder
    pool: StatePool
    priority_stream: Any  # a second CUDA stream for small steps (GraphRunner), or None: every step on the current one

    @property
    def max_frames(self) -> int | None:
        """The longest piece one step runs without falling back (None: any)."""

    def max_rows(self, frames: int) -> int | None:
        """The most rows one step holds at ``frames`` frames a row (None: the engine's frame budget)."""

    def padded_shape(self, batch: int, frames: int) -> tuple[int, int] | None:
        """The (rows, frames) a step of this shape runs at (None: as it is). The engine stages a
        step's inputs at this shape, so they go to the device as they are."""

    def __call__(self, codes: Tensor, slots: Tensor, n_new: Tensor) -> Tensor:
        """One step: audio ``[B', T' * samples_per_frame]`` (B' >= B, T' >= T: the caller slices)."""

    def prefill(self, kind: str, x: Tensor, slots: Tensor, n_new: Tensor) -> Tensor:
        """One prefill pass, ``pool.front`` or ``pool.back`` (``kind``), over ``x``."""

    def stream_for(self, shape: tuple[int, int]) -> Any:
        """The stream a step staged at ``shape`` runs on: ``priority_stream`` for the steps it
        takes, else None (the current stream)."""

    def stats(self) -> dict[str, object] | None:
        """Counters of what it replayed (None: nothing to report)."""


class EagerRunner:
    """Every step and prefill pass as plain PyTorch calls on the pool."""

    max_frames: int | None = None
    priority_stream = None

    def __init__(self, model: Decoder, pool: StatePool):
        self.model, self.pool = model, pool

    def max_rows(self, frames: int) -> int | None:
        return None

    def padded_shape(self, batch: int, frames: int) -> tuple[int, int] | None:
        return None

    def __call__(self, codes: Tensor, slots: Tensor, n_new: Tensor) -> Tensor:
        return self.pool.run(self.model, codes, slots, n_new)

    def prefill(self, kind: str, x: Tensor, slots: Tensor, n_new: Tensor) -> Tensor:
        return getattr(self.pool, kind)(self.model, x, slots, n_new)

    def stream_for(self, shape: tuple[int, int]) -> None:
        return None

    def stats(self) -> dict[str, object] | None:
        return None
