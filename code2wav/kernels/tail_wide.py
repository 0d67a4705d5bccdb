"""A 384-channel residual unit's tail as one Hopper kernel in CUDA C++ (wgmma), compiled by NVRTC.

At 384 channels the k=7 conv stays cuDNN's (it runs near the tensor cores' peak there), and the
tail after it (``y = x + b2 + conv1x1(SnakeBeta(h + b1))``) was three memory passes: SnakeBeta,
cuDNN's 1x1 conv, the residual add; kernels/unit.py's fused Triton tail loses at this width
(SnakeBeta in its loads repeats per output tile, and a tile's K loop cannot reuse an activated
tile it holds). Here a program (persistent, one or two an SM) activates a tile of rows once into
shared memory (the A operand, ``[chunk of 8 channels][row][8]``, no swizzle: kernels/unit_window.py
says why that layout suits wgmma) and multiplies it by the 1x1 conv's weights streamed from L2
through stage buffers (``cp.async``), 192 output channels at a time, in an m64 fp32
accumulator per warpgroup (``TILINGS``: two warpgroups on 64 rows each, or both on 64 rows,
each 96 of the columns), to which the bias and the residual are added before the one rounding
to the output. So the activation is read once, the
output written once, and nothing in between goes to memory.

bf16 only, ``C`` in ``WIDTHS`` (768 channels would need 198 KB for a 128-row A tile alone).
``LayerChoices.tail_wide_rows`` sets the smallest step it runs in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from code2wav.kernels import instant, sm90
from code2wav.kernels.sm90 import SMEM_LIMIT
from code2wav.kernels.snake import is_channels_last
from code2wav.kernels.unit import sm_count

WIDTHS = (384,)
NCH = 192  # output channels a chunk
KCH = 64  # input channels a weight stage
THREADS = 256


@dataclass(frozen=True)
class Tiling:
    """Rows a tile (128: each warpgroup 64 rows of a chunk; 64: each half its columns), weight
    stage buffers, and stages loading ahead of the one multiplied (``<= STAGES - 1``)."""

    rows: int
    stages: int
    lead: int

    @property
    def wn(self) -> int:
        """A warpgroup's share of an output chunk: the wgmma's N."""
        return NCH * self.rows // 128

    @property
    def per_sm(self) -> int:
        """Programs an SM holds (the kernel's launch bound)."""
        return 128 // self.rows

    def defines(self, C: int) -> dict[str, int]:
        return {"C": C, "TM": self.rows, "WN": self.wn, "MIN_BLOCKS": self.per_sm, "STAGES": self.stages, "LEAD": self.lead}


# 128-row tiles stream the weights half as often; 64-row ones fit two programs an SM, so one's
# loads overlap the other's products. Knob: bench/tail_wide.py times both (BENCHMARKS.md).
TILINGS = {128: Tiling(128, 4, 2), 64: Tiling(64, 2, 1)}
DEFAULT_ROWS = 128


def smem_bytes(C: int, rows: int = DEFAULT_ROWS) -> int:
    t = TILINGS[rows]
    a = -(-(C // 8) * (t.rows + 1) * 16 // 128) * 128
    return a + t.stages * KCH * NCH * 2 + 4 * C * 4


def pack(w2: Tensor, b1: Tensor, alpha: Tensor, beta: Tensor, b2: Tensor) -> tuple[Tensor, Tensor]:
    """The 1x1 conv's weight ``[C, C, 1]`` as the kernel's stage images (``[out chunk of NCH][in
    chunk of KCH][8 inputs][NCH outputs][8]`` bf16: each stage contiguous, in the order the kernel
    streams them) and the per-channel parameters ``[4, C]`` fp32: b1, e^alpha,
    1 / (e^beta + 1e-9), b2 (``alpha``/``beta``: the SnakeBeta between the convs, as logs)."""
    C = w2.shape[0]
    wt = w2[:, :, 0].t()  # [in, out]
    img = wt.reshape(C // KCH, KCH // 8, 8, C // NCH, NCH).permute(3, 0, 1, 4, 2)  # [j, i, kc, n, 8]
    wpack = img.to(torch.bfloat16).contiguous().reshape(-1)
    f = lambda t: t.detach().float().reshape(C)  # noqa: E731
    params = torch.stack([f(b1), f(alpha).exp(), 1.0 / (f(beta).exp() + 1e-9), f(b2)]).contiguous()
    return wpack, params


def applies(x: Tensor, h: Tensor, rows_min: int) -> bool:
    """Where the kernel runs: ``rows_min > 0`` rows or more (``LayerChoices.tail_wide_rows``),
    bf16 channels-last ``x`` and ``h`` of one shape at a width in ``WIDTHS``, on an sm90 GPU."""
    B, C, L = x.shape
    return (rows_min > 0 and B * L >= rows_min and C in WIDTHS and x.is_cuda and x.dtype == h.dtype == torch.bfloat16
            and h.shape == x.shape and is_channels_last(x) and is_channels_last(h) and smem_bytes(C) <= SMEM_LIMIT
            and sm90.is_sm90(x.device.index or 0) and not instant.active())


def _check_rows(name: str, t: Tensor, C: int) -> None:
    if t.stride(1) != 1 or (t.shape[-1] > 1 and t.stride(2) != C) or t.data_ptr() % 16 or t.stride(0) % 8:
        raise ValueError(f"tail_wide reads channels-last {name}, its rows 16-byte aligned")


def tail_wide(h: Tensor, x: Tensor, wpack: Tensor, params: Tensor, rows: int = DEFAULT_ROWS) -> Tensor:
    """``x + b2 + conv1x1(SnakeBeta(h + b1))`` over channels-last ``[B, C, L]`` ``h`` (the k=7
    conv's output without its bias) and ``x`` (the unit's input), from ``pack``'s weights; the
    batch strides may exceed ``L * C``. ``rows``: a tile's, a key of ``TILINGS``. Returns a new
    channels-last tensor."""
    B, C, L = x.shape
    if C not in WIDTHS or x.dtype != torch.bfloat16 or h.dtype != torch.bfloat16 or h.shape != x.shape:
        raise ValueError(f"tail_wide takes bf16 h and x of one shape at {WIDTHS} channels, got {tuple(h.shape)} {h.dtype}, "
                         f"{tuple(x.shape)} {x.dtype}")
    _check_rows("h", h, C)
    _check_rows("x", x, C)
    if wpack.numel() != C * C or params.shape != (4, C):
        raise ValueError(f"tail_wide's weights are pack()'s for {C} channels")
    y = torch.empty(B, L, C, device=x.device, dtype=x.dtype)
    R = B * L
    if R:
        t, smem = TILINGS[rows], smem_bytes(C, rows)
        text = sm90.source("tail_wide.cu", t.defines(C), sm90.mma_ss(t.wn))
        kern = sm90.load(x.device.index or 0, text, "tail_wide", smem)
        grid = min(-(-R // t.rows), sm_count(x.device) * t.per_sm)
        kern(grid=(grid, 1, 1), block=(THREADS, 1, 1), shared_mem=smem,
             args=[h, x, wpack, params, y, R, L, h.stride(0), x.stride(0)])
    return y.transpose(1, 2)
