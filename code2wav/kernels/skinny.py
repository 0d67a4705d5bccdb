"""Matrix products with a handful of rows (Triton on CUDA): ``y = x @ W^T + bias``.

In a 1-frame step the low-rate stages (transformer, upsamplers; float32) multiply one to four
rows by ~200 MB of float32 weights in ~40 products. Those are weight reads, bound by memory
bandwidth, but cuBLAS's GEMV and split-K kernels read well below it at these shapes. Here
each program reduces a few output columns over the whole K for every row (the rows share each
weight tile loaded), with enough programs to keep the SMs' loads in flight. Products are plain
float32 FMAs (no TF32 rounding of the inputs): at least as exact as the GEMMs they replace.
It wins at one row and loses at a few rows of the widest products (``bench/skinny.py``; figures in
BENCHMARKS.md). ``LayerChoices.skinny`` (``enabled`` here) turns it off per model.

Half weights (float16 low-rate stages, a bf16 conv stack's few-row convs) go through the same
kernel where ``LayerChoices.skinny_half`` says so: loaded as they are, multiplied in float32,
rounded once to the output. ``gated`` takes the transformer MLP's ``[gate, up]`` product as its
input and applies ``silu(gate) * up`` (rounded to the input dtype, as ``silu_mul`` would) while
loading it: the down projection of a one-frame step without a kernel of its own before it."""

from __future__ import annotations

import torch
from torch import Tensor

from code2wav.kernels import pdl, snake
from code2wav.kernels.snake import triton
from code2wav.kernels.transformer import silu_mul

MAX_ROWS = 4  # more rows than this: cuBLAS (the weight tile is then worth a tensor-core GEMM)
MIN_WEIGHT = 1 << 18  # smaller weights (elements) stay with cuBLAS: launch-bound either way
TILE = 4096  # weight elements per program per K step (32 fp32 registers a thread at 4 warps)
PROGRAMS = 256  # aim: about two programs per SM (an H100/H200 has 132 SMs)

if triton is not None:
    import triton.language as tl

    from code2wav.kernels.pdl import wait_previous

    @triton.jit
    def _skinny_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, sxm, sxk, swn, swk, sym, syn,
                       K: tl.constexpr, M: tl.constexpr, ROWS: tl.constexpr, HAS_BIAS: tl.constexpr, ACCUMULATE: tl.constexpr,
                       GATED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        wait_previous(PDL)  # before any memory access (kernels/pdl.py)
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        nm = n < N
        r = tl.arange(0, ROWS)[:, None]  # ROWS: M rounded up to a power of two
        acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        for k0 in tl.range(0, K, BLOCK_K):  # K is a constexpr: each layer has one
            k = k0 + tl.arange(0, BLOCK_K)
            km = k < K
            w = tl.load(w_ptr + n[:, None] * swn + k[None, :] * swk, mask=nm[:, None] & km[None, :], other=0.0).to(tl.float32)
            for m in tl.static_range(M):  # M <= MAX_ROWS, unrolled: every row uses the tile loaded once
                x = tl.load(x_ptr + m * sxm + k * sxk, mask=km, other=0.0).to(tl.float32)
                if GATED:  # x's row is [gate, up]: silu(gate) * up, rounded as silu_mul's output is
                    up = tl.load(x_ptr + m * sxm + (K + k) * sxk, mask=km, other=0.0).to(tl.float32)
                    x = (x / (1.0 + tl.exp(-x)) * up).to(x_ptr.dtype.element_ty).to(tl.float32)
                acc += tl.where(r == m, tl.sum(w * x[None, :], axis=1)[None, :], 0.0)
        if HAS_BIAS:
            acc += tl.load(b_ptr + n, mask=nm, other=0.0).to(tl.float32)[None, :]
        out = y_ptr + r * sym + n[None, :] * syn
        om = (r < M) & nm[None, :]
        if ACCUMULATE:
            acc += tl.load(out, mask=om, other=0.0)
        tl.store(out, acc, mask=om)


DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def applies(x: Tensor, w: Tensor, enabled: bool = True) -> bool:
    """Float32 or half (``x`` and ``w`` alike) where the Triton kernels run (``snake.fused``:
    CUDA), at most ``MAX_ROWS`` rows, a weight worth it; never unless ``enabled`` (the model's
    ``LayerChoices.skinny_for(dtype)``)."""
    return (enabled and snake.fused(x) and x.dtype == w.dtype and x.dtype in DTYPES
            and x.dim() == 2 and x.shape[0] <= MAX_ROWS and w.numel() >= MIN_WEIGHT)


def tiles(n: int, k: int) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_K): output columns per program such that there are about ``PROGRAMS``
    programs (4 to 64 columns), and K steps of ``TILE / BLOCK_N`` (at most K rounded up)."""
    bn = 4
    while bn < 64 and -(-n // (bn * 2)) >= PROGRAMS:
        bn *= 2
    bk = min(TILE // bn, triton.next_power_of_2(k))
    return bn, bk


def matmul_t(x: Tensor, w: Tensor, bias: Tensor | None = None, out: Tensor | None = None, accumulate: bool = False,
             enabled: bool = True, gated: bool = False) -> Tensor:
    """``x @ w.T (+ bias)`` for ``x`` [M, K] and ``w`` [N, K] (any strides), into ``out`` [M, N]
    (``x``'s dtype) if given (``accumulate``: ``out += ...``). Through the kernel where
    ``applies(x, w, enabled)``, else ``torch.addmm`` / ``matmul``. ``gated``: ``x`` is
    ``[M, 2K]`` = ``[gate, up]`` and the product is ``silu_mul(x) @ w.T``, through the kernel
    only (the caller checks ``applies`` on ``x[:, :K]``)."""
    if gated:
        x = x[:, : x.shape[1] // 2]  # the gate half: the kernel reads the up half K columns on
    if not applies(x, w, enabled):
        if gated:
            raise ValueError("a gated product runs through the kernel only: check applies() first")
        if out is None:
            return x @ w.t() if bias is None else torch.addmm(bias, x, w.t())
        if accumulate:
            return out.addmm_(x, w.t()) if bias is None else out.add_(torch.addmm(bias, x, w.t()))
        return torch.matmul(x, w.t(), out=out) if bias is None else torch.addmm(bias, x, w.t(), out=out)
    M, K = x.shape
    N = w.shape[0]
    if out is None:
        out = torch.empty(M, N, device=x.device, dtype=x.dtype)
    bn, bk = tiles(N, K)
    _skinny_kernel[(triton.cdiv(N, bn),)](
        x, w, bias if bias is not None else w, out, N, *x.stride(), *w.stride(), *out.stride(),
        K=K, M=M, ROWS=max(2, triton.next_power_of_2(M)), HAS_BIAS=bias is not None, ACCUMULATE=accumulate, GATED=gated, BLOCK_N=bn, BLOCK_K=bk,
        num_warps=4, **pdl.options(x),
    )
    return out


def linear(x: Tensor, w: Tensor, bias: Tensor | None = None, enabled: bool = True, gated: bool = False) -> Tensor:
    """``F.linear`` over the last dim of ``x`` [..., K], through :func:`matmul_t` when the
    leading dims hold at most ``MAX_ROWS`` rows. ``gated``: ``x`` is [..., 2K] = [gate, up] and
    the input is ``silu_mul(x)``, applied inside the kernel where it runs."""
    if x.numel() <= MAX_ROWS * x.shape[-1]:  # else a large step: no reshape or checks on its way to cuBLAS
        rows = x.reshape(-1, x.shape[-1])  # a view for the rows these layers see
        if applies(rows[:, : w.shape[1]] if gated else rows, w, enabled):
            return matmul_t(rows, w, bias, enabled=enabled, gated=gated).view(*x.shape[:-1], w.shape[0])
    return torch.nn.functional.linear(silu_mul(x) if gated else x, w, bias)
