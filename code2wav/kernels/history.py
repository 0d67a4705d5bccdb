"""A causal conv's per-stream history, read and written in one pass each (Triton on CUDA).

Before a conv with ``H`` samples of left context, a streaming step needs
``xx = cat([pool[slots], act(x)], time)`` and afterwards ``pool[slots] = xx[b, :, s_b : s_b + H]``
with ``s_b = n_new[b] * rate`` (the last ``H`` samples of row ``b``'s valid part). Eagerly that is
an index_select, the activation, a cat, an index computation, a gather and an index_copy: six
launches and two extra passes over the activation per layer, which is what made the one-frame
step launch-bound. Here the read (pool gather + optional SnakeBeta with the previous conv's bias +
concat) is one kernel and the write one more. The write reads ``xx``, never the pool, so the two
never race; they run in stream order.
"""

from __future__ import annotations

import torch
from torch import Tensor

from code2wav.kernels import snake
from code2wav.kernels.snake import dense, empty_time, is_channels_last, snake_beta_eager, triton

if triton is not None:
    import triton.language as tl

    from code2wav.kernels.snake import snake_value

    @triton.jit
    def _history_cat_kernel(
        out_ptr, x_ptr, pool_ptr, slots_ptr, alpha_ptr, beta_ptr, bias_ptr,
        N, C, H, T, sxb, sxc, sxt,
        CL: tl.constexpr, HAS_POOL: tl.constexpr, HAS_ACT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
    ):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < N
        if CL:  # out is [B, T, C] in memory
            c = offs % C
            t = (offs // C) % T
        else:  # [B, C, T]
            t = offs % T
            c = (offs // T) % C
        b = offs // (C * T)
        in_hist = t < H
        xm = mask & (t >= H)
        x = tl.load(x_ptr + b * sxb + c * sxc + (t - H) * sxt, mask=xm, other=0.0).to(tl.float32)
        if HAS_ACT:
            x = snake_value(x, c, xm, alpha_ptr, beta_ptr, bias_ptr, HAS_BIAS, out_ptr.dtype.element_ty)
        if HAS_POOL:
            hm = mask & in_hist
            slot = tl.load(slots_ptr + b, mask=hm, other=0)
            h = tl.load(pool_ptr + slot * (C * H) + c * H + t, mask=hm, other=0.0).to(tl.float32)
        else:
            h = tl.zeros([BLOCK], dtype=tl.float32)
        tl.store(out_ptr + offs, tl.where(in_hist, h, x).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _history_write_kernel(
        pool_ptr, slots_ptr, n_new_ptr, xx_ptr, N, C, H, sxb, sxc, sxt, RATE,
        CL: tl.constexpr, BLOCK: tl.constexpr,
    ):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < N
        if CL:  # walk xx's memory order
            c = offs % C
            j = (offs // C) % H
        else:
            j = offs % H
            c = (offs // H) % C
        b = offs // (C * H)
        start = tl.load(n_new_ptr + b, mask=mask, other=0) * RATE
        v = tl.load(xx_ptr + b * sxb + c * sxc + (start + j) * sxt, mask=mask)
        slot = tl.load(slots_ptr + b, mask=mask, other=0)
        tl.store(pool_ptr + slot * (C * H) + c * H + j, v, mask=mask)


def history_cat(x: Tensor, history: int, pool: Tensor | None = None, slots: Tensor | None = None,
                act: tuple[Tensor, Tensor] | None = None, bias: Tensor | None = None) -> Tensor:
    """``cat([pool[slots] (zeros without a pool), act(x + bias)], -1)`` for ``x`` [B, C, L] and
    ``pool`` [slots, C, history]. ``act`` is SnakeBeta's (alpha, beta); without it ``bias`` must be
    None. The result has ``x``'s layout."""
    if not snake.fused(x) or x.numel() + x.shape[0] * x.shape[1] * history >= 2**31:
        hist = x.new_zeros(*x.shape[:-1], history) if pool is None else pool.index_select(0, slots).to(x.dtype)
        if act is not None:
            x = snake_beta_eager(x, act[0], act[1], bias)
        return torch.cat([hist, x], dim=-1)
    B, C, L = x.shape
    T = history + L
    cl = is_channels_last(x)  # x itself is read through its strides, whatever they are
    out = empty_time(x, T, cl)
    N = out.numel()
    dummy = x  # never read: the flags below switch those loads off
    alpha, beta = act if act is not None else (dummy, dummy)
    _history_cat_kernel[(triton.cdiv(N, snake.BLOCK),)](
        out, x, pool if pool is not None else dummy, slots if slots is not None else dummy, alpha, beta,
        bias if bias is not None else dummy, N, C, history, T, *x.stride(),
        CL=cl, HAS_POOL=pool is not None, HAS_ACT=act is not None, HAS_BIAS=bias is not None, BLOCK=snake.BLOCK,
    )
    return out


def window(x: Tensor, start: Tensor, length: int, dim: int) -> Tensor:
    """Per-row slice ``x[b, ..., start[b] : start[b] + length, ...]`` along ``dim`` (static shape)."""
    dim = dim % x.dim()
    idx = start.view(-1, *([1] * (x.dim() - 1))) + torch.arange(length, device=x.device).view(
        *([1] * dim), length, *([1] * (x.dim() - dim - 1))
    )
    shape = list(x.shape)
    shape[dim] = length
    return x.gather(dim, idx.expand(shape))


def history_write(pool: Tensor, slots: Tensor, xx: Tensor, n_new: Tensor, rate: int, history: int) -> None:
    """``pool[slots[b]] = xx[b, :, n_new[b]*rate : n_new[b]*rate + history]``, in place."""
    if not snake.fused(xx):
        pool.index_copy_(0, slots, window(xx, n_new * rate, history, dim=-1).to(pool.dtype))
        return
    xx, cl = dense(xx)
    B, C, _ = xx.shape
    N = B * C * history
    _history_write_kernel[(triton.cdiv(N, snake.BLOCK),)](
        pool, slots, n_new, xx, N, C, history, *xx.stride(), rate, CL=cl, BLOCK=snake.BLOCK
    )
