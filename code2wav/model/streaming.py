"""The one streaming-state idea every layer shares.

A layer that needs the past keeps a fixed-size *history* per stream (conv input samples, the
previous ConvTranspose input, attention keys and values). Histories of all streams live in a
pool: one tensor per layer of shape ``[slots, ...]``. A batched :class:`Step` names which slots
take part and how many new frames each row really carries; a layer reads its rows' histories
(``gather``), prepends them to its new input, computes, and writes back the last ``H`` samples
of the *valid* part (``scatter``), in place. Conv layers do both through ``_with_history``: one
kernel on CUDA that reads and writes. The whole-utterance forward is the same code with
``step=None`` and zero histories, which is exactly the causal zero padding of the original
model; so a cold stream and the plain forward agree by construction.

Padding rows to a common length is safe because every layer is causal: a valid sample never
depends on a later (padded) one, and histories are cut at each row's own valid length.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from code2wav.kernels.history import history_cat


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


class StreamingLayer(nn.Module):
    """A layer with per-stream history. Subclasses set ``history`` (samples kept, along time)
    and ``rate`` (input samples per codec frame), and describe their state in ``state_shapes``."""

    state_key: str = ""
    history: int = 0
    rate: int = 1

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-stream state tensors this layer keeps, keyed by full pool key."""
        raise NotImplementedError

    def _with_history(self, x: Tensor, step: Step | None, act: "nn.Module | None" = None, bias: Tensor | None = None,
                      multiple: int = 1) -> Tensor:
        """``[history, act(x + bias)]`` along time, the history read from this layer's pool entry
        (zeros without a step), zero-padded to a ``multiple`` of the given length; then the last
        ``history`` samples of each row's valid part are written back. ``act`` is a SnakeBeta
        fused into the same pass (see kernels/history.py). A layer without history gets
        ``act(x + bias)`` alone."""
        if not self.history:
            return x if act is None else act(x, bias)
        params = (act.alpha, act.beta) if act is not None else None
        if step is None:
            return history_cat(x, self.history, act=params, bias=bias, multiple=multiple)
        return history_cat(x, self.history, step.pool[self.state_key], step.slots, params, bias, multiple,
                           n_new=step.n_new, rate=self.rate)


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
