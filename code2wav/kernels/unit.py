"""The tail of a residual unit as one Triton GEMM on CUDA: ``x + b2 + W2 @ snake(h + b1)``.

A residual unit is snake -> dilated conv k=7 -> snake -> 1x1 conv -> + x. Done as separate ops,
everything after the k=7 conv is three kernels (SnakeBeta, cuDNN's 1x1 conv, the residual add):
seven reads and writes of the activation, and the 1x1 conv's output rounded once more. The 1x1
conv is memory-bound at every block's width, so here it is one tiled GEMM over the rows of the
channels-last ``[B*L, C]`` matrix: SnakeBeta (with the k=7 conv's bias) is applied to each A tile
as it is loaded, and the bias and residual are added to the fp32 accumulator before the one
rounding to the output dtype. A program covers ``block_n`` output channels (all of them in the
tiles measured best); where that is fewer than ``C``, the programs of one row tile sit next to
each other in launch order, so the rows they all read come from L2, and each recomputes
SnakeBeta on them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from code2wav.kernels import pdl, snake
from code2wav.kernels.snake import fast_sin, is_channels_last, triton

ACC_ELEMENTS = 128 * 128  # the fp32 accumulator's elements at most (128 x 256 spilled registers)
MIN_K = 16  # the GEMM's input-channel slice: 32, or 16 for channel counts it does not divide
MAX_N = 256  # output channels per program at most
MAX_C = 256  # the units it serves: the 384- and 768-channel ones (1/5 of the elements) keep the
#              separate ops, which replayed as fast or faster at every step shape (BENCHMARKS.md)


@dataclass(frozen=True)
class Tiles:
    """One launch's tiling: rows per program (an upper bound, see ``rows_per_program``), output
    channels per program, the K slice (it divides ``C``), warps and pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    early_x: bool = False  # load the residual before the K loop (in flight during the GEMM)


def generic_tiles(C: int) -> Tiles:
    """Tiles for a channel count the sweep did not measure: every output channel in one program
    up to ``MAX_N`` (SnakeBeta once per element), 128 at a time beyond."""
    n = triton.next_power_of_2(C) if triton is not None else C
    block_n = n if n <= MAX_N else 128
    return Tiles(min(128, ACC_ELEMENTS // block_n), block_n, 32 if C % 32 == 0 else MIN_K, 4, 4)


# Per channel count, from bench/unit_tail.py's sweep (bf16, 16 x 25 frames; figures in
# BENCHMARKS.md). Knob: edit here after a sweep on new hardware.
TILES: dict[int, Tiles] = {96: Tiles(64, 128, 32, 4, 4, early_x=True), 192: Tiles(64, 256, 32, 4, 4)}


def tiles_for(C: int) -> Tiles:
    return TILES.get(C) or generic_tiles(C)


if triton is not None:
    import triton.language as tl

    from code2wav.kernels.pdl import wait_previous
    from code2wav.kernels.snake import snake_params, snake_value

    @triton.jit
    def _unit_tail_kernel(h_ptr, x_ptr, w_ptr, y_ptr, b1_ptr, alpha_ptr, beta_ptr, b2_ptr, M, L, shb, sxb, swn, swk,
                          C: tl.constexpr, HAS_ACT: tl.constexpr, FAST_SIN: tl.constexpr, NUM_STAGES: tl.constexpr, N_TILES: tl.constexpr,
                          EARLY_X: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        wait_previous(PDL)  # before any memory access (kernels/pdl.py)
        pid = tl.program_id(0)  # the channel tile varies fastest: neighbours read the same rows
        rm = (pid // N_TILES) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]  # [BM, 1]: row b*L + t
        rn = (pid % N_TILES) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # [1, BN]: output channels
        mmask = rm < M
        nmask = rn < C
        m = mmask & nmask
        b, t = rm // L, rm % L  # per row, not per element
        h_rows = b.to(tl.int64) * shb + t * C  # h and x may have batch strides past L * C
        x_rows = b.to(tl.int64) * sxb + t * C
        if EARLY_X:  # in flight during the GEMM
            res = tl.load(x_ptr + x_rows + rn, mask=m, other=0.0)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in tl.range(0, C, BLOCK_K, num_stages=NUM_STAGES):  # BLOCK_K divides C: no K mask
            rk = k0 + tl.arange(0, BLOCK_K)[None, :]  # [1, BK]
            if HAS_ACT:
                a = tl.load(h_ptr + h_rows + rk, mask=mmask, other=0.0).to(tl.float32)
                a += tl.load(b1_ptr + rk).to(tl.float32)
                sa, inv_b = snake_params(alpha_ptr, beta_ptr, rk, C)
                a = snake_value(a, sa, inv_b, FAST_SIN).to(w_ptr.dtype.element_ty)  # the 1x1 conv's input dtype
            else:  # h is SnakeBeta's output already: the tile goes to the product as loaded
                a = tl.load(h_ptr + h_rows + rk, mask=mmask, other=0.0)
            w = tl.load(w_ptr + rn * swn + tl.trans(rk) * swk, mask=nmask, other=0.0)  # [BK, BN] = W2[n, k]
            acc = tl.dot(a, w, acc)
        if not EARLY_X:
            res = tl.load(x_ptr + x_rows + rn, mask=m, other=0.0)
        acc += tl.load(b2_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
        acc += res.to(tl.float32)
        tl.store(y_ptr + rm.to(tl.int64) * C + rn, acc.to(y_ptr.dtype.element_ty), mask=m)


@functools.cache
def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def rows_per_program(rows: int, block_n: int, sms: int, fill_sms: bool = True, n_tiles: int = 1,
                     block_m: int = 128) -> int:
    """A program's rows: ``block_m``, fewer where the fp32 accumulator would pass
    ``ACC_ELEMENTS``, and, with ``fill_sms`` (``LayerChoices.unit_fill_sms``), fewer (down to 16,
    ``tl.dot``'s least) while that leaves SMs idle: small steps (a 1-frame step's few hundred
    rows) would otherwise make a handful of programs, each one long K loop on one SM. Each row
    tile makes ``n_tiles`` programs (one per channel tile)."""
    per_sm = max(1, -(-rows * n_tiles // sms))
    fill = max(16, 1 << (per_sm - 1).bit_length()) if fill_sms else block_m
    return min(block_m, ACC_ELEMENTS // block_n, fill)


def applies(x: Tensor, h: Tensor) -> bool:
    """Where the fused tail runs: bf16/fp16 on CUDA (float32 keeps cuDNN's exact convs; an IEEE
    float32 Triton GEMM is slow), channels-last activations (the CUDA default: the unit's input
    and the k=7 conv's output are then ``[L, C]`` matrices per row), channels a multiple of
    ``MIN_K`` up to ``MAX_C``. (Tests run it on CPU float32 through Triton's interpreter, where
    its dot is exact.)"""
    return _fits(x, h) and x.shape[1] <= MAX_C


def applies_activated(x: Tensor, h: Tensor) -> bool:
    """Where ``unit_tail`` runs on an activated ``h`` (``LayerChoices.wide_tail``): as ``applies``,
    at the widths above ``MAX_C`` (there the separate SnakeBeta pass stays: SnakeBeta in the
    product's loads was slower)."""
    return _fits(x, h) and x.shape[1] > MAX_C


def _fits(x: Tensor, h: Tensor) -> bool:
    """What both forms of the tail need: bf16/fp16 on CUDA (or the interpreter), matching
    channels-last operands, channels a multiple of ``MIN_K``."""
    return (snake.fused(x) and not (x.is_cuda and x.dtype == torch.float32) and x.shape == h.shape
            and is_channels_last(x) and is_channels_last(h) and x.shape[1] % MIN_K == 0)


def unit_tail(h: Tensor, x: Tensor, w2: Tensor, b1: Tensor | None, alpha: Tensor | None, beta: Tensor | None,
              b2: Tensor, tiles: Tiles | None = None, fill_sms: bool = True) -> Tensor:
    """``x + b2 + conv1x1(snake(h + b1), w2)`` over channels-last ``[B, C, L]`` (see ``applies``;
    the batch strides may exceed ``L * C``); with ``alpha`` None, ``h`` is SnakeBeta's output
    already (and ``b1`` None): ``x + b2 + conv1x1(h, w2)``.
    ``w2`` is the 1x1 conv's ``[C, C, 1]`` weight. Returns a new channels-last tensor. ``tiles``
    is for ``bench/unit_tail.py``'s sweep; by default ``tiles_for(C)``."""
    if (alpha is None) != (beta is None) or (alpha is None and b1 is not None):
        raise ValueError("unit_tail takes alpha, beta and b1 for its SnakeBeta, or none of them")
    B, C, L = x.shape
    M = B * L
    t = tiles or tiles_for(C)
    if C % t.block_k:
        raise ValueError(f"the K slice {t.block_k} must divide {C} channels")
    y = torch.empty(B, L, C, device=x.device, dtype=x.dtype).transpose(1, 2)
    n_tiles = triton.cdiv(C, t.block_n)
    block_m = rows_per_program(M, t.block_n, sm_count(x.device), fill_sms, n_tiles, t.block_m)
    act = alpha is not None
    _unit_tail_kernel[(triton.cdiv(M, block_m) * n_tiles,)](
        h, x, w2, y, b1 if act else b2, alpha if act else b2, beta if act else b2, b2, M, L, h.stride(0), x.stride(0),
        w2.stride(0), w2.stride(1), C=C, HAS_ACT=act, FAST_SIN=fast_sin(x), NUM_STAGES=t.num_stages, N_TILES=n_tiles, EARLY_X=t.early_x,
        BLOCK_M=block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, num_warps=t.num_warps, **pdl.options(x),
    )
    return y
