"""The one streaming-state idea every layer shares.

A layer that needs the past keeps a fixed-size *history* per stream (conv input samples, the
previous ConvTranspose input, attention keys and values). Histories of all streams live in a
pool: one tensor per layer of shape ``[slots, ...]``. A batched :class:`Step` names which slots
take part and how many new frames each row really carries; a layer reads its rows' histories
(``gather``), prepends them to its new input, computes, and writes back the last ``H`` samples
of the *valid* part (``scatter``), in place. The whole-utterance forward is the same code with
``step=None`` and zero histories, which is exactly the causal zero padding of the original
model; so a cold stream and the plain forward agree by construction.

Padding rows to a common length is safe because every layer is causal: a valid sample never
depends on a later (padded) one, and histories are cut at each row's own valid length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class Step:
    """One batched streaming step over ``B`` rows of a state pool.

    ``pool`` maps a layer's ``state_key`` to its ``[slots, ...]`` history tensor; ``slots[b]`` is
    row ``b``'s slot; ``n_new[b]`` how many of the step's padded frames are real for row ``b``;
    ``start[b]`` how many frames row ``b`` had seen before this step (absolute position).
    """

    pool: dict[str, Tensor]
    slots: Tensor
    n_new: Tensor
    start: Tensor

    def gather(self, key: str) -> Tensor:
        return self.pool[key].index_select(0, self.slots)

    def scatter(self, key: str, value: Tensor) -> None:
        self.pool[key].index_copy_(0, self.slots, value.to(self.pool[key].dtype))


def window(x: Tensor, start: Tensor, length: int, dim: int) -> Tensor:
    """Per-row slice ``x[b, ..., start[b] : start[b] + length, ...]`` along ``dim`` (static shape)."""
    dim = dim % x.dim()
    idx = start.view(-1, *([1] * (x.dim() - 1))) + torch.arange(length, device=x.device).view(
        *([1] * dim), length, *([1] * (x.dim() - dim - 1))
    )
    shape = list(x.shape)
    shape[dim] = length
    return x.gather(dim, idx.expand(shape))


class StreamingLayer(nn.Module):
    """A layer with per-stream history. Subclasses set ``history`` (samples kept, along time)
    and ``rate`` (input samples per codec frame), and describe their state in ``state_shapes``."""

    state_key: str = ""
    history: int = 0
    rate: int = 1

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-stream state tensors this layer keeps, keyed by full pool key."""
        raise NotImplementedError

    def _read_history(self, x: Tensor, step: Step | None, key: str) -> Tensor:
        if step is None:
            return x.new_zeros(*x.shape[:-1], self.history)
        return step.gather(key).to(x.dtype)

    def _write_history(self, xx: Tensor, step: Step | None, key: str) -> None:
        """Keep the last ``history`` samples of the valid part of ``xx`` = [history, new]."""
        if step is not None and self.history:
            step.scatter(key, window(xx, step.n_new * self.rate, self.history, dim=-1))


def assign_state_keys(model: nn.Module) -> None:
    """Name every streaming layer's pool entry after its place in the module tree."""
    for name, mod in model.named_modules():
        if isinstance(mod, StreamingLayer):
            mod.state_key = name


def state_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for mod in model.modules():
        if isinstance(mod, StreamingLayer):
            shapes.update(mod.state_shapes())
    return shapes
