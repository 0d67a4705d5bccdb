"""A causal ConvTranspose upsampler (``k = 2s``) as one Triton GEMM over row pairs, on CUDA.

``CausalConvTranspose1d._as_gemm`` computes output block ``r`` (``s * c_out`` values, ``s``
samples channels-last) as ``rows[r - 1] @ W_prev + rows[r] @ W_now + bias`` with two cuBLAS
products: the first writes the output, the second reads it back and writes it again
(``beta = 1``), and neither product is large enough in K or N (at the last block: K = 192,
N = 288, M = tens of thousands of rows) for cuBLAS's tiles to reach the memory floor. Here one
program owns an ``[BLOCK_M, BLOCK_N]`` tile of the output and runs one K loop over both halves:
the first ``C / BLOCK_K`` steps read the previous rows against ``W_prev``, the rest the rows
themselves against ``W_now`` (the same matrix one row down: no pair matrix is built). The bias
goes into the fp32 accumulator, which is rounded once.

Row 0 (the history's own block) is never written, as in the two-GEMM form; a pair that
straddles two batch rows gives a block the caller drops. It runs at the widths ``TILES`` names:
those where ``bench/convt.py`` found it faster than the two products (at the wide blocks, large
N, cuBLAS's products win); ``LayerChoices.convt_kernel_rows`` sets the smallest step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from code2wav.kernels import pdl, snake
from code2wav.kernels.snake import triton


@dataclass(frozen=True)
class PairTiles:
    """One launch's tiling: output rows and columns per program, the K slice over input channels
    (it must divide them), warps and pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# Per input width (c_in), only where the kernel beat the two products in ``bench/convt.py``'s
# sweep; a width not here keeps them. Knob: re-sweep on new hardware (figures in BENCHMARKS.md).
TILES: dict[int, PairTiles] = {192: PairTiles(128, 128, 64, 8, 3)}


if triton is not None:
    import triton.language as tl

    from code2wav.kernels.pdl import wait_previous

    @triton.jit
    def _pairs_kernel(r_ptr, w_ptr, b_ptr, y_ptr, M, N, srm, swk, swn, sym,
                      C: tl.constexpr, NUM_STAGES: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        wait_previous(PDL)  # before any memory access (kernels/pdl.py)
        KCH: tl.constexpr = C // BLOCK_K
        rm = 1 + tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]  # [BM, 1]: output rows 1..M-1
        mmask = rm < M
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # [1, BN]
        nmask = n < N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for i in tl.range(0, 2 * KCH, num_stages=NUM_STAGES):
            now = i // KCH  # 0: the previous row against W_prev (columns N..2N), 1: this row against W_now
            rk = (i % KCH) * BLOCK_K + tl.arange(0, BLOCK_K)
            a = tl.load(r_ptr + (rm - 1 + now).to(tl.int64) * srm + rk[None, :], mask=mmask, other=0.0)
            w = tl.load(w_ptr + rk[:, None] * swk + (n + (1 - now) * N) * swn, mask=nmask, other=0.0)
            acc = tl.dot(a, w, acc)
        acc += tl.load(b_ptr + n, mask=nmask, other=0.0).to(tl.float32)
        tl.store(y_ptr + rm.to(tl.int64) * sym + n, acc.to(y_ptr.dtype.element_ty), mask=mmask & nmask)


def applies(rows: Tensor, rows_min: int) -> bool:
    """Where the one-GEMM form runs: half dtypes on CUDA (float32 keeps cuBLAS, whose products
    the tests bound; the interpreter's float32 dot is exact), a width with tiles in ``TILES``
    whose K slice divides it, and at least ``rows_min`` input rows
    (``LayerChoices.convt_kernel_rows``; 0: never)."""
    M, C = rows.shape
    return (rows_min > 0 and M >= rows_min and C in TILES and C % TILES[C].block_k == 0 and rows.stride(1) == 1
            and snake.fused(rows) and not (rows.is_cuda and rows.dtype == torch.float32))


def convt_pairs(rows: Tensor, w: Tensor, bias_rows: Tensor, tiles: PairTiles | None = None) -> Tensor:
    """``y[r] = rows[r - 1] @ w[:, N:] + rows[r] @ w[:, :N] + bias_rows`` for ``r >= 1``, with
    ``rows`` ``[M, C]`` (unit column stride), ``w`` ``[C, 2N]`` (any strides: ``W_now`` then
    ``W_prev``, the layer's channels-last weight as a view) and ``bias_rows`` ``[N]``. Returns
    ``y`` ``[M, N]``, row 0 left unwritten (the caller drops it). ``tiles``: for the sweep; by
    default ``TILES[C]``."""
    M, C = rows.shape
    N = bias_rows.shape[0]
    if w.shape != (C, 2 * N):
        raise ValueError(f"w must be [{C}, {2 * N}] (W_now then W_prev), got {list(w.shape)}")
    t = tiles or TILES[C]
    if C % t.block_k:
        raise ValueError(f"a K slice of {t.block_k} does not divide {C} input channels")
    y = torch.empty(M, N, device=rows.device, dtype=rows.dtype)
    grid = (triton.cdiv(max(M - 1, 1), t.block_m), triton.cdiv(N, t.block_n))
    _pairs_kernel[grid](rows, w, bias_rows, y, M, N, rows.stride(0), w.stride(0), w.stride(1), y.stride(0),
                        C=C, NUM_STAGES=t.num_stages, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
                        num_warps=t.num_warps, **pdl.options(rows))
    return y
