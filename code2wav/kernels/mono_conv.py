"""The decoder's last conv (C channels -> 1, kernel K) as one Triton pass on CUDA.

cuDNN has no good kernel for a single output channel: its implicit-GEMM fallback took a large
share of a bf16 step (BENCHMARKS.md). ``mono_conv`` runs it over a history concat: each program
loads a [time block, all channels] tile per tap (any layout, through strides; channels-last
makes each tile row contiguous), multiplies by that tap's weights and reduces over channels in
fp32.

``mono_conv_history`` reads its input itself instead (``LayerChoices.read_history``): each row's
history from the state pool, then SnakeBeta of the layer's input, rounded to the activation's
dtype as the history concat stores it, each sample loaded and activated once. The seven taps are
one product ``P = X @ W`` (a [rows, taps] tile: ``P[r, k]`` is tap ``k``'s weights times input
row ``r``), and output ``t`` sums ``P[t + k d, k]`` over ``k``, a gather along the tile's rows.
A program's ``BLOCK_R`` input rows give ``BLOCK_R - H`` outputs (its last ``H`` rows are the next
program's first). The program of each row's first tile writes the row's new history back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from code2wav.kernels import pdl, snake
from code2wav.kernels.snake import fast_sin, triton

BLOCK_T = 64  # output samples per program (bench/mono_conv.py sweeps it and the warps)
NUM_WARPS = 4
BLOCK_R = 64  # input rows per program of mono_conv_history (bench/mono_conv.py sweeps it; tests raise it)

if triton is not None:
    import triton.language as tl

    from code2wav.kernels.pdl import wait_previous
    from code2wav.kernels.snake import snake_params, snake_value

    @triton.jit
    def _mono_conv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, C, L_out, sxb, sxc, sxt, swc, swk,
                          K: tl.constexpr, DIL: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr):
        wait_previous(PDL)  # before any memory access (kernels/pdl.py)
        row = tl.program_id(0)
        t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
        c = tl.arange(0, BLOCK_C)
        tmask = t < L_out
        cmask = c < C
        acc = tl.zeros([BLOCK_T], dtype=tl.float32)
        base = x_ptr + row.to(tl.int64) * sxb
        for k in tl.static_range(K):
            w = tl.load(w_ptr + c * swc + k * swk, mask=cmask, other=0.0).to(tl.float32)
            tile = tl.load(base + (t[:, None] + k * DIL) * sxt + c[None, :] * sxc,
                           mask=tmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(tile * w[None, :], axis=1)
        acc += tl.load(b_ptr).to(tl.float32)
        tl.store(y_ptr + row.to(tl.int64) * L_out + t, acc.to(y_ptr.dtype.element_ty), mask=tmask)

    @triton.jit
    def _activated(x_ptr, alpha_ptr, beta_ptr, b, c, s, m, C, sxb, sxc, sxt, HAS_ACT: tl.constexpr, FAST_SIN: tl.constexpr):
        """``act(x)`` at samples ``s`` of row ``b``, channels ``c``, zero outside ``m``, rounded to
        x's dtype (what the history concat would hold there)."""
        v = tl.load(x_ptr + b.to(tl.int64) * sxb + c * sxc + s * sxt, mask=m, other=0.0).to(tl.float32)
        if HAS_ACT:
            a, inv_b = snake_params(alpha_ptr, beta_ptr, c, C)
            v = tl.where(m, snake_value(v, a, inv_b, FAST_SIN), 0.0)
        return v.to(x_ptr.dtype.element_ty)

    @triton.jit
    def _mono_conv_history_kernel(x_ptr, w_ptr, b_ptr, y_ptr, pool_ptr, slots_ptr, n_new_ptr, alpha_ptr, beta_ptr,
                                  C, L, RATE, sxb, sxc, sxt, swc, swk, spn, spc, spt,
                                  K: tl.constexpr, DIL: tl.constexpr, HAS_POOL: tl.constexpr, WRITE: tl.constexpr,
                                  HAS_ACT: tl.constexpr, FAST_SIN: tl.constexpr, IEEE: tl.constexpr, TAPS: tl.constexpr,
                                  BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr):
        wait_previous(PDL)  # before any memory access (kernels/pdl.py)
        H: tl.constexpr = (K - 1) * DIL
        b = tl.program_id(0)
        q0 = tl.program_id(1) * (BLOCK_R - H)
        r = tl.arange(0, BLOCK_R)[:, None]
        q = q0 + r  # positions of [history, act(x)]
        c = tl.arange(0, BLOCK_C)[None, :]
        cm = c < C
        X = _activated(x_ptr, alpha_ptr, beta_ptr, b, c, q - H, cm & (q >= H) & (q < H + L), C, sxb, sxc, sxt, HAS_ACT, FAST_SIN)
        slot = 0
        if HAS_POOL:
            slot = tl.load(slots_ptr + b)
        pool_row = pool_ptr + slot * spn + c * spc  # (without a pool: never read)
        if HAS_POOL:  # the history's rows: a row's first program only (BLOCK_R >= 2 H)
            X = tl.where(q < H, tl.load(pool_row + q * spt, mask=cm & (q < H), other=0.0).to(X.dtype), X)
        k = tl.arange(0, TAPS)[None, :]
        cw = tl.arange(0, BLOCK_C)[:, None]
        W = tl.load(w_ptr + cw * swc + k * swk, mask=(cw < C) & (k < K), other=0.0).to(X.dtype)  # [channels, taps]
        if IEEE:  # float32 stays float32 (no TF32)
            P = tl.dot(X, W, input_precision="ieee")  # [rows, taps]
        else:
            P = tl.dot(X, W)  # fp32 accumulation of bf16 / fp16 products
        G = tl.gather(P, tl.minimum(r + k * DIL, BLOCK_R - 1), axis=0)  # G[r, k] = P[r + k d, k]
        out = tl.sum(G, axis=1) + tl.load(b_ptr).to(tl.float32)  # padded taps have zero weights
        t = q0 + tl.arange(0, BLOCK_R)  # output t reads positions t .. t + H
        tl.store(y_ptr + b.to(tl.int64) * L + t, out.to(y_ptr.dtype.element_ty), mask=(tl.arange(0, BLOCK_R) < BLOCK_R - H) & (t < L))
        if WRITE:
            if tl.program_id(1) == 0:  # the row's new history: positions n_new * RATE + j of [history, act(x)]
                j = tl.arange(0, BLOCK_H)[:, None]
                src = tl.load(n_new_ptr + b) * RATE + j
                hm = cm & (j < H)
                kept = tl.load(pool_row + src * spt, mask=hm & (src < H), other=0.0).to(X.dtype)
                new = _activated(x_ptr, alpha_ptr, beta_ptr, b, c, src - H, hm & (src >= H) & (src < H + L), C,
                                 sxb, sxc, sxt, HAS_ACT, FAST_SIN)
                new = tl.where(src < H, kept, new)
                tl.debug_barrier()  # every load of this row's pool (above too) before a store to it
                tl.store(pool_row + j * spt, new.to(pool_ptr.dtype.element_ty), mask=hm)


def mono_conv(x: Tensor, weight: Tensor, bias: Tensor, dilation: int = 1, block_t: int | None = None,
              num_warps: int | None = None) -> Tensor:
    """``conv1d(x, weight, bias)`` for ``weight`` [1, C, K], no padding: [B, C, L] -> [B, 1, L - (K-1)*d].
    ``block_t`` and ``num_warps`` are for the sweep; by default ``BLOCK_T`` and ``NUM_WARPS``."""
    if not snake.fused(x) or x.shape[1] > 256:
        return F.conv1d(x, weight, bias, dilation=dilation)
    B, C, L = x.shape
    K = weight.shape[-1]
    L_out = L - (K - 1) * dilation
    y = torch.empty(B, 1, L_out, device=x.device, dtype=x.dtype)
    block_t = block_t or BLOCK_T
    _mono_conv_kernel[(B, triton.cdiv(L_out, block_t))](
        x, weight, bias, y, C, L_out, *x.stride(), weight.stride(1), weight.stride(2),
        K=K, DIL=dilation, BLOCK_T=block_t, BLOCK_C=triton.next_power_of_2(C), num_warps=num_warps or NUM_WARPS, **pdl.options(x),
    )
    return y


def reads_history(x: Tensor, pool: Tensor | None) -> bool:
    """Where ``mono_conv_history`` runs: the Triton path (``snake.fused``), at most 256 channels,
    a pool (if any) of the activation's dtype."""
    return snake.fused(x) and x.shape[1] <= 256 and (pool is None or pool.dtype == x.dtype)


def mono_conv_history(x: Tensor, weight: Tensor, bias: Tensor, dilation: int = 1,
                      act: tuple[Tensor, Tensor] | None = None, pool: Tensor | None = None,
                      slots: Tensor | None = None, n_new: Tensor | None = None, rate: int = 1,
                      block_r: int | None = None) -> Tensor:
    """The causal conv of ``weight`` [1, C, K] over ``[history, act(x)]`` (kernels/history.history_cat's
    concatenation: ``pool[slots]``, zeros without a pool, then SnakeBeta ``act`` = (alpha, beta)
    of ``x`` [B, C, L]): [B, 1, L]. With ``n_new``, each row's new history (ending at sample
    ``n_new[b] * rate``) is written back to the pool, as history_cat would. ``block_r`` is for the
    sweep; by default ``BLOCK_R``."""
    B, C, L = x.shape
    K = weight.shape[-1]
    H = (K - 1) * dilation
    block_r = block_r or BLOCK_R
    if block_r < 2 * H:  # so only a row's first program reads the history its pool row holds
        raise ValueError(f"a program's {block_r} rows must be at least twice the history's {H}")
    y = torch.empty(B, 1, L, device=x.device, dtype=x.dtype)
    dummy = x  # never read: the flags below switch those loads off
    alpha, beta = act if act is not None else (dummy, dummy)
    write = pool is not None and n_new is not None
    _mono_conv_history_kernel[(B, triton.cdiv(L, block_r - H))](
        x, weight, bias, y, pool if pool is not None else dummy, slots if pool is not None else dummy,
        n_new if write else dummy, alpha, beta, C, L, rate, *x.stride(), weight.stride(1), weight.stride(2),
        *(pool.stride() if pool is not None else (0, 0, 0)),
        K=K, DIL=dilation, HAS_POOL=pool is not None, WRITE=write, HAS_ACT=act is not None, FAST_SIN=fast_sin(x),
        IEEE=x.dtype == torch.float32, TAPS=max(16, triton.next_power_of_2(K)), BLOCK_H=triton.next_power_of_2(max(H, 1)),
        BLOCK_R=block_r, BLOCK_C=triton.next_power_of_2(C), num_warps=NUM_WARPS, **pdl.options(x),
    )
    return y
