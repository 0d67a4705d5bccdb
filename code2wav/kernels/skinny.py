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
loading it: the down projection of a one-frame step without a kernel of its own before it.
:func:`normed_linear` likewise takes an RMSNorm (and the layer-scaled residual add before it)
into the product's loads: every program finds the rows' RMS over ``K`` first (``K`` is the
transformer's width, a few hundred), then normalises each tile it multiplies."""

from __future__ import annotations

import torch
from torch import Tensor

from code2wav.kernels import pdl, snake
from code2wav.kernels.snake import triton
from code2wav.kernels.transformer import add_rms_norm, rms_norm, silu_mul

MAX_ROWS = 4  # more rows than this: cuBLAS (the weight tile is then worth a tensor-core GEMM)
MIN_WEIGHT = 1 << 18  # smaller weights (elements) stay with cuBLAS: launch-bound either way
TILE = 4096  # weight elements per program per K step (32 fp32 registers a thread at 4 warps)
PROGRAMS = 256  # aim: about two programs per SM (an H100/H200 has 132 SMs)

if triton is not None:
    import triton.language as tl

    from code2wav.kernels.pdl import wait_previous

    @triton.jit
    def _residual_row(x_ptr, a_ptr, s_ptr, m, k, km, sxm, sxk, sam, sak, NORM: tl.constexpr):
        """Row ``m`` of the product's input before its norm, at columns ``k``: ``x``, or
        ``x + s * a`` rounded to ``x``'s dtype (the residual stream as add_rms_norm stores it)."""
        x = tl.load(x_ptr + m * sxm + k * sxk, mask=km, other=0.0).to(tl.float32)
        if NORM == 2:
            s = tl.load(s_ptr + k, mask=km, other=0.0).to(tl.float32)
            a = tl.load(a_ptr + m * sam + k * sak, mask=km, other=0.0).to(tl.float32)
            x = (x + s * a).to(x_ptr.dtype.element_ty).to(tl.float32)
        return x

    @triton.jit
    def _skinny_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, sxm, sxk, swn, swk, sym, syn,
                       a_ptr, s_ptr, nw_ptr, xo_ptr, sam, sak, som, sok, eps, r_ptr, g_ptr, srm, srn,
                       K: tl.constexpr, M: tl.constexpr, ROWS: tl.constexpr, HAS_BIAS: tl.constexpr, ACCUMULATE: tl.constexpr,
                       GATED: tl.constexpr, NORM: tl.constexpr, GELU: tl.constexpr, RESIDUAL: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        wait_previous(PDL)  # before any memory access (kernels/pdl.py)
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        nm = n < N
        r = tl.arange(0, ROWS)[:, None]  # ROWS: M rounded up to a power of two
        acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        inv = tl.zeros([ROWS, 1], dtype=tl.float32)
        if NORM > 0:  # every program finds each row's RMS over the whole K itself (K is a few hundred)
            for m in tl.static_range(M):
                ss = tl.zeros([BLOCK_K], dtype=tl.float32)
                for k0 in tl.range(0, K, BLOCK_K):
                    k = k0 + tl.arange(0, BLOCK_K)
                    km = k < K
                    x = _residual_row(x_ptr, a_ptr, s_ptr, m, k, km, sxm, sxk, sam, sak, NORM)
                    if NORM == 2:
                        if tl.program_id(0) == 0:  # the new residual stream, stored once
                            tl.store(xo_ptr + m * som + k * sok, x.to(xo_ptr.dtype.element_ty), mask=km)
                    ss += x * x
                inv = tl.where(r == m, 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps), inv)
        for k0 in tl.range(0, K, BLOCK_K):  # K is a constexpr: each layer has one
            k = k0 + tl.arange(0, BLOCK_K)
            km = k < K
            w = tl.load(w_ptr + n[:, None] * swn + k[None, :] * swk, mask=nm[:, None] & km[None, :], other=0.0).to(tl.float32)
            if NORM > 0:
                nw = tl.load(nw_ptr + k, mask=km, other=0.0).to(tl.float32)
            for m in tl.static_range(M):  # M <= MAX_ROWS, unrolled: every row uses the tile loaded once
                if NORM > 0:  # RMSNorm's output, rounded as add_rms_norm stores it
                    x = _residual_row(x_ptr, a_ptr, s_ptr, m, k, km, sxm, sxk, sam, sak, NORM)
                    x = (x * tl.sum(tl.where(r == m, inv, 0.0)) * nw).to(x_ptr.dtype.element_ty).to(tl.float32)
                else:
                    x = tl.load(x_ptr + m * sxm + k * sxk, mask=km, other=0.0).to(tl.float32)
                if GATED:  # x's row is [gate, up]: silu(gate) * up, rounded as silu_mul's output is
                    up = tl.load(x_ptr + m * sxm + (K + k) * sxk, mask=km, other=0.0).to(tl.float32)
                    x = (x / (1.0 + tl.exp(-x)) * up).to(x_ptr.dtype.element_ty).to(tl.float32)
                acc += tl.where(r == m, tl.sum(w * x[None, :], axis=1)[None, :], 0.0)
        if HAS_BIAS:
            acc += tl.load(b_ptr + n, mask=nm, other=0.0).to(tl.float32)[None, :]
        om = (r < M) & nm[None, :]
        if GELU:  # exact (erf) GELU, as F.gelu's default
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
        if RESIDUAL:  # res + g * (x @ W^T + b): the ConvNeXt block's layer scale and residual
            g = tl.load(g_ptr + n, mask=nm, other=0.0).to(tl.float32)[None, :]
            acc = tl.load(r_ptr + r * srm + n[None, :] * srn, mask=om, other=0.0).to(tl.float32) + g * acc
        out = y_ptr + r * sym + n[None, :] * syn
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
             enabled: bool = True, gated: bool = False, gelu: bool = False, residual: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """``x @ w.T (+ bias)`` for ``x`` [M, K] and ``w`` [N, K] (any strides), into ``out`` [M, N]
    (``x``'s dtype) if given (``accumulate``: ``out += ...``). Through the kernel where
    ``applies(x, w, enabled)``, else ``torch.addmm`` / ``matmul``. ``gated``: ``x`` is
    ``[M, 2K]`` = ``[gate, up]`` and the product is ``silu_mul(x) @ w.T``, through the kernel
    only (the caller checks ``applies`` on ``x[:, :K]``). ``gelu`` and ``residual`` ((rows
    [M, N], scale [N]): ``rows + scale * y``) are applied after the product, through the
    kernel only as well (:func:`linear` has their formulas for the rest)."""
    if gated:
        x = x[:, : x.shape[1] // 2]  # the gate half: the kernel reads the up half K columns on
    if not applies(x, w, enabled):
        if gated or gelu or residual is not None:
            raise ValueError("a gated, GELU or residual product runs through the kernel only: check applies() first")
        if out is None:
            return x @ w.t() if bias is None else torch.addmm(bias, x, w.t())
        if accumulate:
            return out.addmm_(x, w.t()) if bias is None else out.add_(torch.addmm(bias, x, w.t()))
        return torch.matmul(x, w.t(), out=out) if bias is None else torch.addmm(bias, x, w.t(), out=out)
    if out is None:
        out = torch.empty(x.shape[0], w.shape[0], device=x.device, dtype=x.dtype)
    _launch(x, w, bias, out, accumulate, gated, gelu=gelu, residual=residual)
    return out


def _launch(x: Tensor, w: Tensor, bias: Tensor | None, out: Tensor, accumulate: bool = False, gated: bool = False,
            norm: tuple[Tensor | None, Tensor | None, Tensor, Tensor | None, float] | None = None,
            gelu: bool = False, residual: tuple[Tensor, Tensor] | None = None) -> None:
    """The kernel over ``x`` [M, K]. ``norm``: (residual, scale, norm weight, new stream, eps)
    before the product; ``gelu``, ``residual`` (rows [M, N], scale [N]) after it."""
    M, K = x.shape
    N = w.shape[0]
    a, s, nw, xo, eps = norm if norm is not None else (None, None, None, None, 0.0)
    mode = 0 if norm is None else 1 if a is None else 2
    a, s, nw, xo = (t if t is not None else x for t in (a, s, nw, xo))
    res, g = residual if residual is not None else (out, out)
    bn, bk = tiles(N, K)
    _skinny_kernel[(triton.cdiv(N, bn),)](
        x, w, bias if bias is not None else w, out, N, *x.stride(), *w.stride(), *out.stride(),
        a, s, nw, xo, *a.stride(), *xo.stride(), eps, res, g, *res.stride(),
        K=K, M=M, ROWS=max(2, triton.next_power_of_2(M)), HAS_BIAS=bias is not None, ACCUMULATE=accumulate, GATED=gated, NORM=mode,
        GELU=gelu, RESIDUAL=residual is not None, BLOCK_N=bn, BLOCK_K=bk, num_warps=4, **pdl.options(x),
    )


def linear(x: Tensor, w: Tensor, bias: Tensor | None = None, enabled: bool = True, gated: bool = False,
           gelu: bool = False, residual: Tensor | None = None, scale: Tensor | None = None) -> Tensor:
    """``F.linear`` over the last dim of ``x`` [..., K], through :func:`matmul_t` when the
    leading dims hold at most ``MAX_ROWS`` rows. ``gated``: ``x`` is [..., 2K] = [gate, up] and
    the input is ``silu_mul(x)``, applied inside the kernel where it runs. After the product
    (with its bias): ``gelu``, exact GELU; ``residual`` [..., N] with ``scale`` [N]:
    ``residual + scale * y``. In the kernel these cost no launch of their own."""
    if x.numel() <= MAX_ROWS * x.shape[-1]:  # else a large step: no reshape or checks on its way to cuBLAS
        rows = x.reshape(-1, x.shape[-1])  # a view for the rows these layers see
        if applies(rows[:, : w.shape[1]] if gated else rows, w, enabled):
            res = None if residual is None else (residual.reshape(rows.shape[0], w.shape[0]), scale)
            return matmul_t(rows, w, bias, enabled=enabled, gated=gated, gelu=gelu, residual=res).view(*x.shape[:-1], w.shape[0])
    y = torch.nn.functional.linear(silu_mul(x) if gated else x, w, bias)
    if gelu:
        y = torch.nn.functional.gelu(y)
    return y if residual is None else torch.addcmul(residual, scale, y)


def normed_linear(h: Tensor, w: Tensor, norm_weight: Tensor, eps: float, residual: Tensor | None = None,
                  scale: Tensor | None = None, bias: Tensor | None = None, enabled: bool = True) -> tuple[Tensor, Tensor]:
    """``linear(rms_norm(h'), w, bias)`` and ``h'``, the residual stream: ``h' = h + scale *
    residual`` (the transformer's layer-scaled residual add), or ``h`` itself without a
    residual. Where :func:`linear` would take the kernel, the norm rides in its loads: every
    program finds the rows' RMS over ``K`` itself and one program stores ``h'``, so the
    RMSNorm (and the add) is no launch of its own; elsewhere ``add_rms_norm`` / ``rms_norm``,
    then :func:`linear`. Rounded as those are: ``h'`` and the norm's output in ``h``'s dtype."""
    rows = h.reshape(-1, h.shape[-1]) if h.numel() <= MAX_ROWS * h.shape[-1] else None
    if rows is None or not applies(rows, w, enabled) or not (residual is None or residual.shape == h.shape):
        if residual is None:
            return linear(rms_norm(h, norm_weight, eps), w, bias, enabled), h
        h, n = add_rms_norm(h, residual, scale, norm_weight, eps)
        return linear(n, w, bias, enabled), h
    out = torch.empty(rows.shape[0], w.shape[0], device=h.device, dtype=h.dtype)
    if residual is None:
        _launch(rows, w, bias, out, norm=(None, None, norm_weight, None, eps))
        return out.view(*h.shape[:-1], w.shape[0]), h
    stream = torch.empty_like(rows)
    _launch(rows, w, bias, out, norm=(residual.reshape(rows.shape), scale, norm_weight, stream, eps))
    return out.view(*h.shape[:-1], w.shape[0]), stream.view(h.shape)
