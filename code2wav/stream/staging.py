"""A step's inputs on the host, written once at the shape the runner runs.

The inputs of a step (codes ``[B, Q, T]``, slots ``[B]``, new frames ``[B]``) are views of one
int64 buffer (``pool.packed_inputs``), pinned on CUDA so they go up in one asynchronous copy,
and written through numpy views (a torch op per row costs more host time than the copy). At a
runner's padded shape (a graph bucket) padding rows are scratch rows with no new frames, padding
frames are zero codes the causal step never lets into a real sample, and the buffer is reused
once its step has landed: allocating pinned memory per step cost more host time on a first
packet's path than writing the inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from torch import Tensor

from code2wav.stream.pool import empty_step, packed_inputs
from code2wav.stream.schedule import Group

PaddedShape = Callable[[int, int], "tuple[int, int] | None"]


@dataclass
class Staged:
    """A step's host inputs and the numpy views of the same memory to write them with."""

    shape: tuple[int, int]
    codes: Tensor
    slots: Tensor
    n_new: Tensor
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray]

    @classmethod
    def new(cls, b: int, t: int, scratch_slot: int, q: int, pin: bool) -> "Staged":
        _, codes, slots, n_new = packed_inputs(b, t, scratch_slot, pin_memory=pin, q=q)
        return cls((b, t), codes, slots, n_new, (codes.numpy(), slots.numpy(), n_new.numpy()))


class Stager:
    """Stages groups; keeps the buffers of a runner's padded shapes (few) for reuse."""

    def __init__(self, padded_shape: PaddedShape, scratch_slot: int, num_quantizers: int, pin: bool):
        self.padded_shape, self.scratch_slot, self.q, self.pin = padded_shape, scratch_slot, num_quantizers, pin
        self._free: dict[tuple[int, int], list[Staged]] = {}

    def stage(self, group: Group) -> Staged:
        b, t = len(group.rows), max(group.pieces)
        b, t = self.padded_shape(b, t) or (b, t)
        free = self._free.get((b, t))
        reused = bool(free)
        staged = free.pop() if reused else Staged.new(b, t, self.scratch_slot, self.q, self.pin)
        codes, slots, n_new = staged.arrays
        # A reused buffer goes back to an empty step first, unless this group writes all of it
        # (a lone stream's step at its own bucket's shape, the first packet's usual case).
        if reused and (len(group) < b or min(group.pieces) < t):
            empty_step(codes, slots, n_new, self.scratch_slot)
        for j, (r, k) in enumerate(zip(group.rows, group.pieces)):
            codes[j, :, :k] = r.frames.numpy()[r.done : r.done + k].T
        slots[: len(group)] = [r.slot for r in group.rows]
        n_new[: len(group)] = group.pieces
        return staged

    def landed(self, staged: Staged) -> None:
        """Its step's copy up is done: keep the buffer if it has a runner's padded shape."""
        if self.padded_shape(*staged.shape) == staged.shape:
            self._free.setdefault(staged.shape, []).append(staged)
