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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import Tensor

from code2wav.stream.pool import empty_step, packed_inputs, restore_pairs
from code2wav.stream.schedule import Group

PaddedShape = Callable[[int, int], "tuple[int, int] | None"]


@dataclass
class Staged:
    """A step's host inputs and the numpy views of the same memory to write them with."""

    shape: tuple[int, int]
    codes: Tensor
    slots: Tensor
    n_new: Tensor
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # codes, slots, n_new, restore pairs
    held: list[Any] = field(default_factory=list)  # snapshots its pairs point at, alive until its step has run

    @classmethod
    def new(cls, b: int, t: int, scratch_slot: int, q: int, pin: bool) -> "Staged":
        buf, codes, slots, n_new = packed_inputs(b, t, scratch_slot, pin_memory=pin, q=q)
        return cls((b, t), codes, slots, n_new, (codes.numpy(), slots.numpy(), n_new.numpy(), restore_pairs(buf, b, q, t).numpy()))


class Stager:
    """Stages groups; keeps the buffers of a runner's padded shapes (few) for reuse. With
    ``restores_in_step`` (where the pool has them), a stream's cached state (``Stream.cached``)
    goes in inside its first step, as a restore pair of the step's inputs (one pair a row: every
    restore of a step fits, and none needs a launch of its own on the worker, where each launch
    lets the event loop's thread take the interpreter lock away from the step's host path)."""

    def __init__(self, padded_shape: PaddedShape, scratch_slot: int, num_quantizers: int, pin: bool, restores_in_step: bool = False):
        self.padded_shape, self.scratch_slot, self.q, self.pin = padded_shape, scratch_slot, num_quantizers, pin
        self.restores_in_step = restores_in_step
        self.restored_in_step = 0  # cached states that went in as a step's restore pairs
        self._free: dict[tuple[int, int], list[Staged]] = {}

    def stage(self, group: Group) -> Staged:
        b, t = len(group.rows), max(group.pieces)
        b, t = self.padded_shape(b, t) or (b, t)
        free = self._free.get((b, t))
        reused = bool(free)
        staged = free.pop() if reused else Staged.new(b, t, self.scratch_slot, self.q, self.pin)
        codes, slots, n_new, pairs = staged.arrays
        # A reused buffer goes back to an empty step first, unless this group writes all of it
        # (a lone stream's step at its own bucket's shape, the first packet's usual case).
        if reused and (len(group) < b or min(group.pieces) < t):
            empty_step(codes, slots, n_new, pairs, self.scratch_slot)
        elif reused:
            pairs[...] = 0
        for j, (r, k) in enumerate(zip(group.rows, group.pieces)):
            codes[j, :, :k] = r.frames.numpy()[r.done : r.done + k].T
        slots[: len(group)] = [r.slot for r in group.rows]
        n_new[: len(group)] = group.pieces
        if self.restores_in_step:
            self._restores(group, staged)
        return staged

    def _restores(self, group: Group, staged: Staged) -> None:
        """Each row whose stream still waits for its cached state: a restore pair, packed from
        the front (the snapshot held until the step has run)."""
        pairs = staged.arrays[3]
        for r in group.rows:
            st = r.stream
            if st.cached is not None:
                pairs[len(staged.held)] = st.cached.flat.data_ptr(), st.slot
                staged.held.append(st.cached)
                self.restored_in_step += 1
                st.cached = None

    def landed(self, staged: Staged) -> None:
        """Its step has run: drop the snapshots it held; keep the buffer if it has a runner's
        padded shape."""
        staged.held.clear()
        if self.padded_shape(*staged.shape) == staged.shape:
            self._free.setdefault(staged.shape, []).append(staged)
