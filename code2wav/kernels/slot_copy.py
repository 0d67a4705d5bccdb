"""A slot's whole state written from a snapshot in one launch (CUDA, Triton).

A stream restored from the prefix cache (``StatePool.restore``) gets its slot's row of every
pool buffer and its position from a snapshot, on its first packet's path. ``torch._foreach_copy_``
does the rows in one launch, but each of its blocks takes a 64 Ki-element chunk of one tensor, so a
slot's rows (about a megaelement) run on a few dozen blocks and take several times what their
bytes need; the position, another dtype, is a second launch (BENCHMARKS.md, session 36). Here
every (segment, ``BLOCK`` units of it) is a program; the destinations come from a table of row
addresses built once per pool (its buffers never move); and every segment moves as 16-bit units
whatever its dtype, so the position travels in the same launch, bit for bit. The snapshot is one
flat buffer of those units (``SlotLayout.views`` gives its typed views).

Triton's launcher (``kernel[grid](...)``: binding, specialising and looking up the compiled kernel
in Python) is most of a restore's host time, and a restore sits on a cached voice's first packet.
Once ``warm`` has compiled the kernel and checked its own launcher on a slot that holds nothing,
``write`` calls that launcher directly (``_Direct``):
every argument but ``slot`` and the snapshot is fixed per layout, and the one specialisation left
to check, the snapshot's 16-byte alignment, is checked per call. The pairs kernel (a step's
restores as data in its inputs, ``write_pairs``) is checked the same way before it is used
(``check_pairs``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from code2wav.kernels import instant
from code2wav.kernels.snake import triton

BLOCK = 2048  # 16-bit units a program copies (tests raise it: the interpreter pays per program)
ALIGN = 8  # segments start on 16-byte boundaries of the snapshot, so its typed views are aligned

if triton is not None:
    import triton.language as tl

    @triton.jit(do_not_specialize=["slot"])  # one compiled kernel for every slot (no slot == 1 variant)
    def _write_kernel(table_ptr, src_ptr, offsets_ptr, sizes_ptr, slot, NSEG, BLOCK: tl.constexpr):
        seg = tl.program_id(0)
        start = tl.program_id(1) * BLOCK
        n = tl.load(sizes_ptr + seg)
        if start < n:
            dst = tl.load(table_ptr + slot * NSEG + seg).to(tl.pointer_type(tl.int16))
            i = start + tl.arange(0, BLOCK)
            m = i < n
            tl.store(dst + i, tl.load(src_ptr + tl.load(offsets_ptr + seg) + i, mask=m), mask=m)


    @triton.jit(do_not_specialize=["R"])  # one compiled kernel for every step's row count
    def _pairs_kernel(table_ptr, pairs_ptr, offsets_ptr, sizes_ptr, NSEG, R, BLOCK: tl.constexpr):
        # ``write`` for the (snapshot address, slot) pairs at the head of the R read from device
        # memory, up to the first with address 0 (the stager packs them from the front), so that a
        # captured step carries its rows' restores as data; a step with none costs one load.
        seg = tl.program_id(0)
        start = tl.program_id(1) * BLOCK
        n = tl.load(sizes_ptr + seg)
        if start < n:
            i = start + tl.arange(0, BLOCK)
            m = i < n
            src_at = tl.load(offsets_ptr + seg) + i
            r = tl.full((), 0, tl.int32)
            src = tl.load(pairs_ptr)
            while src != 0:
                slot = tl.load(pairs_ptr + 2 * r + 1)
                dst = tl.load(table_ptr + slot * NSEG + seg).to(tl.pointer_type(tl.int16))
                tl.store(dst + i, tl.load(src.to(tl.pointer_type(tl.int16)) + src_at, mask=m), mask=m)
                r += 1
                src = tl.load(pairs_ptr + 2 * r, mask=r < R, other=0)


def applies(device: torch.device) -> bool:
    """Whether ``SlotLayout.write`` runs as the kernel here (CUDA with Triton; tests swap it)."""
    return triton is not None and device.type == "cuda" and not instant.active()


class SlotLayout:
    """Where each of a slot's segments (its row of every buffer, then anything else of the slot
    in ``rows``' order) sits in a flat snapshot, and every slot's row addresses.

    ``rows[s]``: slot ``s``'s row tensors, contiguous, the same shapes and dtypes for every slot."""

    def __init__(self, rows: list[list[Tensor]]):
        first = rows[0]
        if any(t.numel() * t.element_size() % 2 or not t.is_contiguous() for t in first):
            raise ValueError("every segment must be contiguous and a whole number of 16-bit units")
        self.units = [t.numel() * t.element_size() // 2 for t in first]
        self.shapes = [(t.shape, t.dtype) for t in first]
        self.offsets, at = [], 0
        for n in self.units:
            self.offsets.append(at)
            at += -(-n // ALIGN) * ALIGN
        self.total, self.most, self.nseg = at, max(self.units), len(first)
        self.device = first[0].device
        self._offsets = torch.tensor(self.offsets, dtype=torch.long, device=self.device)
        self._sizes = torch.tensor(self.units, dtype=torch.int32, device=self.device)
        self._table = torch.tensor([[t.data_ptr() for t in r] for r in rows], dtype=torch.long, device=self.device)
        self._rows = rows
        self._direct: _Direct | None = None  # the compiled kernel's own launcher, once ``warm`` checked it
        self.direct_off = "not warmed"  # why ``_direct`` is not in use (None while it is)

    def flat(self) -> Tensor:
        return torch.zeros(self.total, dtype=torch.int16, device=self.device)  # the alignment gaps too

    def views(self, flat: Tensor) -> list[Tensor]:
        """Each segment of a flat snapshot, as its row's shape and dtype."""
        return [flat[off : off + n].view(dtype).view(shape) for off, n, (shape, dtype) in zip(self.offsets, self.units, self.shapes)]

    def write(self, slot: int, flat: Tensor) -> None:
        """Slot ``slot``'s every segment from ``flat``, in one launch (in stream order)."""
        if self._direct is None or not self._direct(slot, flat):
            self._launch(slot, flat)

    def write_pairs(self, pairs: Tensor) -> None:
        """``write`` for each (snapshot address, slot) row of ``pairs`` ([R, 2] int64 on the
        device) up to the first whose address is 0, in one launch whose arguments are fixed: what
        a step's CUDA graph captures, so that the restores of its rows are data in its inputs
        (``StatePool.run``). Each snapshot must be 16-bit aligned and stay alive until the launch
        has run."""
        _pairs_kernel[self._grid()](self._table, pairs, self._offsets, self._sizes, self.nseg, pairs.shape[0], BLOCK=BLOCK)

    def check_pairs(self, slot: int) -> str | None:
        """Compile the pairs kernel (both alignments a step's inputs give its pairs) and check it
        once on ``slot``, which must hold nothing: two snapshots named in turn for ``slot``, then
        an empty pair, then the first snapshot again, must leave the second there bit for bit
        (the kernel went past its first pair and stopped at the empty one). None if it did, else
        what went wrong; ``slot`` holds zeros again after."""
        first, zeros = self._pattern(), self.flat()
        second = first + 1
        why = None
        for at in (0, 1):
            self.write(slot, zeros)
            buf = torch.zeros(at + 8, dtype=torch.long, device=self.device)
            pairs = buf[at : at + 8].view(4, 2)
            pairs[:, 1] = slot
            pairs[0, 0], pairs[1, 0], pairs[3, 0] = first.data_ptr(), second.data_ptr(), first.data_ptr()
            self.write_pairs(pairs)
            if why is None and not self._holds(slot, second):
                why = f"the pairs kernel did not write its pairs bit for bit (pairs {'16' if at == 0 else 'only 8'}-byte aligned)"
        self.write(slot, zeros)
        return why

    def _grid(self) -> tuple[int, int]:
        return self.nseg, triton.cdiv(self.most, BLOCK)

    def _launch(self, slot: int, flat: Tensor):
        """``write`` through Triton's launcher; returns the compiled kernel (None where Triton's
        interpreter runs it)."""
        return _write_kernel[self._grid()](self._table, flat, self._offsets, self._sizes, slot, self.nseg, BLOCK=BLOCK)

    def warm(self, slot: int) -> None:
        """Compile the kernel (a write of zeros into ``slot``, which must hold nothing), then
        check its direct launch once there: kept if it writes a pattern bit for bit, else
        Triton's launcher stays in use. ``slot`` holds zeros again after."""
        zeros = self.flat()
        direct = _Direct.of(self._launch(slot, zeros), self._grid(), self)
        if isinstance(direct, str):
            self.direct_off = direct
            return
        pattern = self._pattern()
        try:
            if not direct(slot, pattern):
                ok, why = False, "a Triton launch hook is set (a profiler's)"
            else:
                ok = self._holds(slot, pattern)
                why = None if ok else "the direct launch did not write the pattern bit for bit"
        except Exception as e:  # a launcher of another signature: Triton's own launch stays
            ok, why = False, f"the direct launch raised {type(e).__name__}: {e}"
        self._direct, self.direct_off = (direct if ok else None), why
        self._launch(slot, zeros)

    def _pattern(self) -> Tensor:
        """A snapshot whose every 16-bit unit differs from its neighbours' (a write's check)."""
        return torch.arange(self.total, dtype=torch.int32, device=self.device).to(torch.int16)

    def _holds(self, slot: int, flat: Tensor) -> bool:
        """Whether ``slot``'s every segment is ``flat``'s, bit for bit."""
        return all(torch.equal(t.view(torch.int16).flatten(), flat[off : off + n]) for t, off, n in zip(self._rows[slot], self.offsets, self.units))


class _Direct:
    """The compiled write kernel launched by its own launcher (``CompiledKernel.run``), as
    ``JITFunction.run`` does once it has found it, without the binding and lookup before it. Only
    where this Triton's launcher has the signature read here and no launch hooks are set (a
    profiler's); ``__call__`` returns False (and launches nothing) where it does not apply."""

    def __init__(self, kernel, grid: tuple[int, int], layout: SlotLayout, knobs):
        self.launch, self.function, self.meta = kernel.run, kernel.function, kernel.packed_metadata
        self.grid, self.layout, self.knobs = grid, layout, knobs
        self.device = layout.device.index  # a CUDA tensor's device always has its index

    @staticmethod
    def of(kernel, grid: tuple[int, int], layout: SlotLayout) -> "_Direct | str":
        """The direct launch of ``kernel``, or why there is none."""
        try:
            from triton import knobs  # Triton >= 3.4: where the launch hooks live
        except ImportError:
            return "triton.knobs is missing (Triton < 3.4)"
        missing = [a for a in ("run", "function", "packed_metadata") if getattr(kernel, a, None) is None]
        if missing:
            return f"the compiled kernel has no {', '.join(missing)}"
        return _Direct(kernel, grid, layout, knobs)

    def __call__(self, slot: int, flat: Tensor) -> bool:
        if flat.data_ptr() % 16 or hooks_set(self.knobs):
            return False  # compiled for an aligned snapshot; a hook wants Triton's launch metadata
        L = self.layout
        stream = torch._C._cuda_getCurrentRawStream(self.device)
        self.launch(*self.grid, 1, stream, self.function, self.meta, None, None, None, L._table, flat, L._offsets, L._sizes, slot, L.nseg, BLOCK)
        return True


def hooks_set(knobs) -> bool:
    """Whether a launch hook is set in Triton's ``knobs``: a callable where Triton keeps one (or
    None), a non-empty chain where it keeps a ``HookChain`` (Triton 3.6: never None, so "is not
    None" is always true there)."""
    runtime = knobs.runtime
    return any(h is not None and bool(getattr(h, "calls", True)) for h in (runtime.launch_enter_hook, runtime.launch_exit_hook))
