"""Preallocated per-stream decoder state: one tensor per stateful layer, one row per slot."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from code2wav.kernels import slot_copy
from code2wav.model.decoder import Decoder
from code2wav.model.streaming import Step

log = logging.getLogger(__name__)


def packed_inputs(b: int, t: int, scratch_slot: int, device: torch.device | str | None = None,
                  pin_memory: bool = False, q: int = 16) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One int64 buffer holding a (b, t) step's codes [b, q, t], slots [b] and n_new [b], then b
    restore pairs (``restore_pairs``: one a row, so that every cached state of a step goes in
    inside it), and the first three views of it, set to an empty step (zero codes, scratch slots,
    no new frames, no restores). A step's inputs then go up in one copy, not three (or six small
    ops before a replay)."""
    buf = torch.empty(b * q * t + 4 * b, dtype=torch.long, device=device, pin_memory=pin_memory)
    codes, slots, n_new = packed_views(buf, b, q, t)
    pairs = restore_pairs(buf, b, q, t)
    # On the host through numpy: a torch op costs microseconds of dispatch on the step's host path.
    empty_step(*((codes, slots, n_new, pairs) if buf.is_cuda else (codes.numpy(), slots.numpy(), n_new.numpy(), pairs.numpy())), scratch_slot)
    return buf, codes, slots, n_new


def packed_views(buf: Tensor, b: int, q: int, t: int) -> tuple[Tensor, Tensor, Tensor]:
    """The codes [b, q, t], slots [b] and n_new [b] views of a ``packed_inputs`` buffer."""
    n = b * q * t
    return buf[:n].view(b, q, t), buf[n : n + b], buf[n + b : n + 2 * b]


def restore_pairs(buf: Tensor, b: int, q: int, t: int) -> Tensor:
    """The ``[b, 2]`` (snapshot address, slot) view of a ``packed_inputs`` buffer: slots the step
    writes from a snapshot before its forward, packed from the front (address 0: no more)."""
    return buf[b * q * t + 2 * b :].view(b, 2)


def empty_step(codes, slots, n_new, pairs, scratch_slot: int) -> None:
    """Set a step's inputs (tensors or numpy arrays) to no work: zero codes, every row on the
    scratch slot with no new frames, no restores."""
    codes[...], slots[...], n_new[...], pairs[...] = 0, scratch_slot, 0, 0


def packed_base(codes: Tensor, slots: Tensor, n_new: Tensor) -> Tensor | None:
    """The buffer ``codes, slots, n_new`` view if they are laid out as ``packed_inputs`` makes
    them (so they can go up in one copy), else None."""
    base = codes._base
    if base is None or slots._base is not base or n_new._base is not base or not base.is_contiguous():
        return None
    b, n = codes.shape[0], codes.numel()
    at, size = base.data_ptr(), base.element_size()
    laid_out = (
        base.numel() == n + 4 * b and codes.is_contiguous() and codes.data_ptr() == at
        and slots.shape == n_new.shape == (b,) and slots.data_ptr() == at + n * size and n_new.data_ptr() == at + (n + b) * size
    )
    return base if laid_out else None


@dataclass
class Snapshot:
    """A copy of one slot's state (``StatePool.snapshot``): ``rows`` are its row of every
    buffer and its position (key ``"position"``), views of one ``flat`` buffer."""

    flat: Tensor
    rows: dict[str, Tensor]

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()


class PoolFull(RuntimeError):
    """Every slot is taken; the caller must retry later (never an eviction, never an OOM)."""

    code = "pool_full"


class StatePool:
    """``max_streams`` fixed-size slots of decoder state on one device.

    A slot holds every layer's history and the stream's absolute frame position. Slots are
    handed out and returned, never moved: a batched step gathers and scatters rows by index,
    so the tensors keep their addresses (what CUDA graphs need). One extra *scratch* row, never
    handed out, absorbs the writes of padding rows when a step is padded to a graph's batch size."""

    def __init__(self, model: Decoder, max_streams: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        if max_streams < 1:
            raise ValueError("max_streams must be >= 1")
        p = next(model.parameters())
        device = torch.device(device) if device is not None else p.device
        dtype = dtype or model.dtype  # the conv stack's: a half-precision model's low-rate stages
        #                               compute in float32 but keep their state in it too
        self.max_streams = max_streams
        self.device = device
        rows = max_streams + 1
        self.scratch_slot = max_streams
        self.buffers: dict[str, Tensor] = {
            key: torch.zeros(rows, *shape, device=device, dtype=dtype) for key, shape in model.state_shapes().items()
        }
        self.position = torch.zeros(rows, dtype=torch.long, device=device)
        self._free = list(range(max_streams - 1, -1, -1))
        self._stale: set[int] = set()  # given back, not yet zeroed (see reset_stale)
        # Per slot, its row of every buffer, per dtype (a foreach over mixed dtypes falls back
        # to one launch per tensor); built once, so zeroing a slot builds no views.
        self._rows = [([b[s : s + 1] for b in self.buffers.values()], self.position[s : s + 1]) for s in range(rows)]
        self._layout: slot_copy.SlotLayout | None = None  # built at the first snapshot (prefix cache only)
        self.restores_in_step = False  # see enable_restores_in_step
        self.in_step_off: str | None = None  # why enable_restores_in_step left them off
        self.restored_alone = 0  # snapshots written by ``restore`` (a launch of their own), not by a step's restore pairs

    @property
    def bytes_per_stream(self) -> int:
        return sum(b[0].numel() * b.element_size() for b in self.buffers.values()) + self.position.element_size()

    @property
    def nbytes(self) -> int:
        """Bytes allocated for the whole pool (every slot plus the scratch row)."""
        return self.bytes_per_stream * (self.max_streams + 1)

    @property
    def in_use(self) -> int:
        return self.max_streams - len(self._free)

    def acquire(self) -> int:
        if not self._free:
            raise PoolFull(f"all {self.max_streams} stream slots are in use")
        return self._free.pop()

    def release(self, slot: int) -> None:
        if not 0 <= slot < self.max_streams or slot in self._free:
            raise ValueError(f"slot {slot} is not in use")
        self._free.append(slot)
        self._stale.add(slot)

    @property
    def has_stale(self) -> bool:
        """Whether slots given back wait to be zeroed (``reset_stale`` has work)."""
        return bool(self._stale)

    @property
    def stale(self) -> frozenset[int]:
        """The slots ``reset_stale`` would zero now."""
        return frozenset(self._stale)

    def reset_stale(self) -> None:
        """Cold-start state for every slot given back since the last call: zero conv history is
        the forward's zero padding; KV rows are masked by position, zeroed anyway so nothing
        stale survives. ``release`` only marks the slot, so that ending and opening streams are
        host bookkeeping; whoever runs passes calls this before any new owner's first pass, on
        the thread (and CUDA stream) that runs them, which orders the zeroing after every
        earlier pass over the previous owner. Usually that is long before the slot is handed
        out again, off the next stream's first packet."""
        slots, self._stale = self._stale, set()
        if slots:
            torch._foreach_zero_([row for s in slots for row in self._rows[s][0]])
            torch._foreach_zero_([self._rows[s][1] for s in slots])

    @property
    def layout(self) -> slot_copy.SlotLayout:
        """A snapshot's segments (every buffer's row, then the position) and every slot's row
        addresses (kernels/slot_copy.py). Built on first use; on CUDA the write kernel runs
        once then, on the scratch row (which holds nothing), so that it is compiled (and its
        direct launch checked) there and not on a cached stream's first packet."""
        if self._layout is None:
            self._layout = slot_copy.SlotLayout([[*r, p] for r, p in self._rows])
            if slot_copy.applies(self.device):
                self._layout.warm(self.scratch_slot)
        return self._layout

    def snapshot(self, slot: int) -> Snapshot:
        """A copy of ``slot``'s state: its row of every buffer and its position."""
        flat = self.layout.flat()
        views = self.layout.views(flat)
        rows, position = self._rows[slot]
        torch._foreach_copy_(views[:-1], rows, non_blocking=True)  # one dtype per foreach list (restore_rows)
        views[-1].copy_(position, non_blocking=True)
        return Snapshot(flat, dict(zip([*self.buffers, "position"], views)))

    def restore(self, slot: int, state: Snapshot) -> None:
        """Write a ``snapshot`` into ``slot`` (in stream order on the pool's device): on CUDA one
        launch (kernels/slot_copy.py), else ``restore_rows``. Counted in ``restored_alone``."""
        self.restored_alone += 1
        if slot_copy.applies(self.device):
            self.layout.write(slot, state.flat)
        else:
            self.restore_rows(slot, state)

    def restore_rows(self, slot: int, state: Snapshot) -> None:
        """``restore`` by torch's foreach copy: one launch for the rows, not one per buffer; the
        position (int64) apart, because the fused foreach copy wants one dtype across each list
        (a second dtype sends every tensor down a copy of its own)."""
        rows, position = self._rows[slot]
        torch._foreach_copy_(list(rows), [state.rows[key] for key in self.buffers], non_blocking=True)
        position.copy_(state.rows["position"], non_blocking=True)

    def _inputs(self, x: Tensor, slots: Tensor, n_new: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self._packed(x, slots, n_new)[:3]

    def _packed(self, x: Tensor, slots: Tensor, n_new: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """The inputs on the device, and their restore pairs where they are a ``packed_inputs``
        buffer (else None). A no-op for device tensors (so a pass stays pure device work with
        static shapes: what a CUDA graph captures); asynchronous from pinned memory, in one copy
        where they are views of one staged buffer."""
        staged = packed_base(x, slots, n_new)
        if staged is not None:
            up = staged.to(self.device, non_blocking=True)
            return *packed_views(up, *x.shape), restore_pairs(up, *x.shape)
        return x.to(self.device, non_blocking=True), slots.to(self.device, non_blocking=True), n_new.to(self.device, non_blocking=True), None

    def enable_restores_in_step(self) -> bool:
        """From now on each step first writes the slots its inputs' restore pairs name from their
        snapshots (``StatePool.run``; the engine's stager fills the pairs): a cached prefix's
        state then goes in inside its first step, with no launch of its own on the first
        packet's path. CUDA with Triton only (``slot_copy.applies``); compiles the kernel now and
        checks it on the scratch row. Returns whether it is on: not where that check failed
        (``in_step_off`` says why; a restore then goes by its own launch, ``restore``)."""
        if not slot_copy.applies(self.device):
            raise ValueError("restores inside a step need CUDA with Triton")
        self.in_step_off = self.layout.check_pairs(self.scratch_slot)
        if self.in_step_off is not None:
            log.warning("restores inside a step are off: %s; a cached prefix's state goes in by a launch of its own", self.in_step_off)
        self.restores_in_step = self.in_step_off is None
        return self.restores_in_step

    @torch.no_grad()
    def run(self, model: Decoder, codes: Tensor, slots: Tensor, n_new: Tensor) -> Tensor:
        """One streaming step of ``model`` over rows ``slots``; advances their positions. With
        ``restores_in_step``, first the restores of its inputs' pairs (``restore_pairs``)."""
        codes, slots, n_new, pairs = self._packed(codes, slots, n_new)
        if pairs is not None and self.restores_in_step:
            self.layout.write_pairs(pairs)
        step = Step(self.buffers, slots, n_new, self.position.index_select(0, slots))
        wav = model(codes, step)
        self.position.index_add_(0, slots, n_new)
        return wav[:, 0]

    @torch.no_grad()
    def front(self, model: Decoder, codes: Tensor, slots: Tensor, n_new: Tensor) -> Tensor:
        """The transformer half of a step alone (a reference prefix's prefill); advances positions.
        Returns the hidden frames [B, latent_dim, T]."""
        codes, slots, n_new = self._inputs(codes, slots, n_new)
        hidden = model.front(codes, self.step(slots, n_new))
        self.advance(slots, n_new)
        return hidden

    @torch.no_grad()
    def back(self, model: Decoder, hidden: Tensor, slots: Tensor, n_new: Tensor) -> Tensor:
        """The conv half of a step alone over hidden frames (positions are not used there)."""
        hidden, slots, n_new = self._inputs(hidden, slots, n_new)
        return model.back(hidden, self.step(slots, n_new))[:, 0]

    def step(self, slots: Tensor, n_new: Tensor) -> Step:
        """A step over ``slots`` for partial passes (``front`` or ``back`` alone)."""
        return Step(self.buffers, slots, n_new, self.position.index_select(0, slots))

    def advance(self, slots: Tensor, n_new: Tensor) -> None:
        self.position.index_add_(0, slots, n_new)
