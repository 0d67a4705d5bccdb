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
from code2wav.kernels.snake import empty_time, fast_sin, is_channels_last, snake_beta_eager, tile_shape, to_layout, triton

if triton is not None:
    import triton.language as tl

    from code2wav.kernels.snake import snake_params, snake_value, tile

    @triton.jit
    def _history_cat_kernel(
        out_ptr, x_ptr, pool_ptr, slots_ptr, alpha_ptr, beta_ptr, bias_ptr,
        C, H, T, T_OUT, sob, soc, sot, sxb, sxc, sxt, spn, spc, spt,
        HAS_POOL: tl.constexpr, HAS_ACT: tl.constexpr, HAS_BIAS: tl.constexpr, FAST_SIN: tl.constexpr,
        BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        t, c, m = tile(T_OUT, C, BLOCK_L, BLOCK_C)  # t: output time, history first, zeros past T
        b = tl.program_id(2)
        xm = m & (t >= H) & (t < T)
        x = tl.load(x_ptr + b * sxb + c * sxc + (t - H) * sxt, mask=xm, other=0.0).to(tl.float32)
        if HAS_BIAS:
            x += tl.load(bias_ptr + c, mask=c < C, other=0.0).to(tl.float32)
        if HAS_ACT:
            a, inv_b = snake_params(alpha_ptr, beta_ptr, c, C)
            x = snake_value(x, a, inv_b, FAST_SIN)
        if HAS_POOL:
            slot = tl.load(slots_ptr + b)
            h = tl.load(pool_ptr + slot * spn + c * spc + t * spt, mask=m & (t < H), other=0.0).to(tl.float32)
        else:
            h = tl.zeros([BLOCK_L, BLOCK_C], dtype=tl.float32)
        x = tl.where(t < T, x, 0.0)  # the bias and SnakeBeta of a masked zero need not be zero
        tl.store(out_ptr + b * sob + c * soc + t * sot, tl.where(t < H, h, x).to(out_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _history_write_kernel(
        pool_ptr, slots_ptr, n_new_ptr, xx_ptr, C, H, sxb, sxc, sxt, spn, spc, spt, RATE,
        BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        j, c, m = tile(H, C, BLOCK_L, BLOCK_C)
        b = tl.program_id(2)
        start = tl.load(n_new_ptr + b) * RATE
        slot = tl.load(slots_ptr + b)
        v = tl.load(xx_ptr + b * sxb + c * sxc + (start + j) * sxt, mask=m)
        tl.store(pool_ptr + slot * spn + c * spc + j * spt, v.to(pool_ptr.dtype.element_ty), mask=m)


def history_cat(x: Tensor, history: int, pool: Tensor | None = None, slots: Tensor | None = None,
                act: tuple[Tensor, Tensor] | None = None, bias: Tensor | None = None, multiple: int = 1) -> Tensor:
    """``cat([pool[slots] (zeros without a pool), act(x + bias)], -1)`` for ``x`` [B, C, L] and
    ``pool`` [slots, C, history], then zeros up to a length that is a ``multiple`` of the given
    one. ``act`` is SnakeBeta's (alpha, beta); without it ``bias`` must be None. The result has
    ``x``'s layout."""
    B, C, L = x.shape
    T = history + L
    T_out = -(-T // multiple) * multiple
    cl = is_channels_last(x)  # the result's layout; x itself is read through its strides
    if not snake.fused(x) or B * C * T_out >= 2**31:
        hist = x.new_zeros(*x.shape[:-1], history) if pool is None else pool.index_select(0, slots).to(x.dtype)
        if act is not None:
            x = snake_beta_eager(x, act[0], act[1], bias)
        tail = [x.new_zeros(B, C, T_out - T)] if T_out > T else []
        return to_layout(torch.cat([hist, x, *tail], dim=-1), cl)  # cat's is contiguous
    out = empty_time(x, T_out, cl)
    dummy = x  # never read: the flags below switch those loads off
    alpha, beta = act if act is not None else (dummy, dummy)
    bl, bc = tile_shape(C, T_out, cl)
    _history_cat_kernel[(triton.cdiv(T_out, bl), triton.cdiv(C, bc), B)](
        out, x, pool if pool is not None else dummy, slots if slots is not None else dummy, alpha, beta,
        bias if bias is not None else dummy, C, history, T, T_out, *out.stride(), *x.stride(),
        *(pool.stride() if pool is not None else (0, 0, 0)),
        HAS_POOL=pool is not None, HAS_ACT=act is not None, HAS_BIAS=bias is not None, FAST_SIN=fast_sin(x),
        BLOCK_L=bl, BLOCK_C=bc, num_warps=snake.NUM_WARPS,
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
    B, C, _ = xx.shape
    bl, bc = tile_shape(C, history, is_channels_last(xx))
    _history_write_kernel[(triton.cdiv(history, bl), triton.cdiv(C, bc), B)](
        pool, slots, n_new, xx, C, history, *xx.stride(), *pool.stride(), rate, BLOCK_L=bl, BLOCK_C=bc, num_warps=snake.NUM_WARPS
    )
