"""A causal conv's per-stream history, read and written in one pass (Triton on CUDA).

Before a conv with ``H`` samples of left context, a streaming step needs
``xx = cat([pool[slots], act(x)], time)`` and afterwards ``pool[slots] = xx[b, :, s_b : s_b + H]``
with ``s_b = n_new[b] * rate`` (the last ``H`` samples of row ``b``'s valid part). Eagerly that is
an index_select, the activation, a cat, an index computation, a gather and an index_copy: six
launches and two extra passes over the activation per layer, which is what made the one-frame
step launch-bound. Here it is one kernel: the pool gather, the optional SnakeBeta with the
previous conv's bias, the concat and the write-back.

The kernel reads the pool (old history) and writes it (new history), so it must not race with
itself. For each row and each of a few channel subsets, one *history program* does every pool
access of that row's slot for those channels, in chunks of increasing position ``j`` (usually
one): chunk ``[j0, j1)`` reads positions ``>= j0`` only (``t`` for the output, ``s_b + j >= j``
for the new history), and earlier chunks stored below ``j0``; inside a chunk a barrier puts all
loads before the stores. The other programs cover the new samples and never touch the pool.
Rows share a slot only as padding rows on the scratch slot with ``n_new = 0``, which write back
what they read.
"""

from __future__ import annotations

import torch
from torch import Tensor

from code2wav.kernels import pdl, snake
from code2wav.kernels.snake import empty_time, fast_sin, is_channels_last, snake_beta_eager, tile_shape, to_layout, triton

if triton is not None:
    import triton.language as tl

    from code2wav.kernels.pdl import wait_previous
    from code2wav.kernels.snake import snake_params, snake_value

    @triton.jit
    def _new_samples(x_ptr, alpha_ptr, beta_ptr, bias_ptr, b, c, s, m, C, H, T, sxb, sxc, sxt,
                     HAS_ACT: tl.constexpr, HAS_BIAS: tl.constexpr, FAST_SIN: tl.constexpr):
        """``act(x + bias)`` at positions ``s >= H`` of the concatenation (``x``'s sample
        ``s - H``), fp32; zero from ``T`` on (the ``multiple`` padding)."""
        xm = m & (s >= H) & (s < T)
        x = tl.load(x_ptr + b * sxb + c * sxc + (s - H) * sxt, mask=xm, other=0.0).to(tl.float32)
        if HAS_BIAS:
            x += tl.load(bias_ptr + c, mask=c < C, other=0.0).to(tl.float32)
        if HAS_ACT:
            a, inv_b = snake_params(alpha_ptr, beta_ptr, c, C)
            x = snake_value(x, a, inv_b, FAST_SIN)
        return tl.where(s < T, x, 0.0)  # the bias and SnakeBeta of a masked zero need not be zero

    @triton.jit
    def _new_tile(out_row, x_ptr, alpha_ptr, beta_ptr, bias_ptr, b, c, t, cm, C, H, T, T_OUT, sot, sxb, sxc, sxt,
                  HAS_ACT: tl.constexpr, HAS_BIAS: tl.constexpr, FAST_SIN: tl.constexpr):
        """Output positions ``t``: ``act(x + bias)``, zeros before ``H`` (no pool) and past ``T``."""
        m = (t < T_OUT) & cm
        x = _new_samples(x_ptr, alpha_ptr, beta_ptr, bias_ptr, b, c, t, m, C, H, T, sxb, sxc, sxt, HAS_ACT, HAS_BIAS, FAST_SIN)
        tl.store(out_row + t * sot, tl.where(t < H, 0.0, x).to(out_row.dtype.element_ty), mask=m)

    @triton.jit
    def _history_cat_kernel(
        out_ptr, x_ptr, pool_ptr, slots_ptr, n_new_ptr, alpha_ptr, beta_ptr, bias_ptr,
        C, H, T, T_OUT, RATE, sob, soc, sot, sxb, sxc, sxt, spn, spc, spt,
        HAS_POOL: tl.constexpr, WRITE: tl.constexpr, HAS_ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
        FAST_SIN: tl.constexpr, SPLIT: tl.constexpr, HIST_C: tl.constexpr, CHUNKS: tl.constexpr, BLOCK_H: tl.constexpr,
        BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_previous(PDL)  # before any memory access (kernels/pdl.py)
        # Grid (time tiles, channel tiles, rows). With a pool, time tiles 0 .. SPLIT - 1 are the
        # history programs, each owning HIST_C channels of the channel tile (output [0, H) and
        # every pool access of them, see the module docstring), and the next ones cover
        # [H, T_OUT); without a pool, tiles cover [0, T_OUT) with a zero history.
        b = tl.program_id(2)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
        if HAS_POOL:
            if tl.program_id(0) < SPLIT:
                hc = tl.program_id(1) * BLOCK_C + tl.program_id(0) * HIST_C + tl.arange(0, HIST_C)[None, :]
                pool_row = pool_ptr + tl.load(slots_ptr + b) * spn + hc * spc
                out_row = out_ptr + b * sob + hc * soc
                start = 0
                if WRITE:
                    start = tl.load(n_new_ptr + b) * RATE
                for i in tl.static_range(CHUNKS):  # increasing j: no chunk reads a position an earlier one wrote
                    j = i * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]
                    m = (j < H) & (hc < C)
                    old = tl.load(pool_row + j * spt, mask=m, other=0.0).to(tl.float32)
                    if WRITE:
                        src = start + j  # where the new history's sample j sits in the output
                        kept = tl.load(pool_row + src * spt, mask=m & (src < H), other=0.0).to(tl.float32)
                        new = _new_samples(x_ptr, alpha_ptr, beta_ptr, bias_ptr, b, hc, src, m, C, H, T, sxb, sxc, sxt,
                                           HAS_ACT, HAS_BIAS, FAST_SIN)
                        # Rounded to the output's dtype first: the value the output holds at src.
                        new = tl.where(src < H, kept, new).to(out_ptr.dtype.element_ty)
                        tl.debug_barrier()  # all of this chunk's pool loads before any store to it
                        tl.store(pool_row + j * spt, new.to(pool_ptr.dtype.element_ty), mask=m)
                    tl.store(out_row + j * sot, old.to(out_ptr.dtype.element_ty), mask=m)
            else:
                t = H + (tl.program_id(0) - SPLIT) * BLOCK_L + tl.arange(0, BLOCK_L)[:, None]
                _new_tile(out_ptr + b * sob + c * soc, x_ptr, alpha_ptr, beta_ptr, bias_ptr, b, c, t, c < C,
                          C, H, T, T_OUT, sot, sxb, sxc, sxt, HAS_ACT, HAS_BIAS, FAST_SIN)
        else:
            t = tl.program_id(0) * BLOCK_L + tl.arange(0, BLOCK_L)[:, None]
            _new_tile(out_ptr + b * sob + c * soc, x_ptr, alpha_ptr, beta_ptr, bias_ptr, b, c, t, c < C,
                      C, H, T, T_OUT, sot, sxb, sxc, sxt, HAS_ACT, HAS_BIAS, FAST_SIN)


HISTORY_TILE = 512  # elements of a history program's tile; tests shrink it


def _history_programs(history: int, channels: int) -> tuple[int, int, int]:
    """How a channel tile's history is split: (programs, channels each, rows per chunk). Each
    program takes all ``history`` rows of its channels in tiles of at most ``HISTORY_TILE``
    elements. One program per channel tile, in row chunks, was slower than the separate read
    and write kernels: its serial chunks are long at the widest histories and its registers cut
    the occupancy of every other tile; this split beat both over the blocks' history shapes in
    1 x 1, 16 x 1 and 16 x 25-frame steps (the figures: BENCHMARKS.md, session 9).
    ``CHUNKS`` is a constexpr: the chunk loop unrolls (and Triton's interpreter takes no range
    over a runtime bound)."""
    rows = triton.next_power_of_2(max(history, 1))
    split = 1
    while rows * channels // split > HISTORY_TILE and split < channels:
        split *= 2
    hist_c = channels // split
    return split, hist_c, min(rows, max(HISTORY_TILE // hist_c, 1))


def history_cat(x: Tensor, history: int, pool: Tensor | None = None, slots: Tensor | None = None,
                act: tuple[Tensor, Tensor] | None = None, bias: Tensor | None = None, multiple: int = 1,
                n_new: Tensor | None = None, rate: int = 1) -> Tensor:
    """``cat([pool[slots] (zeros without a pool), act(x + bias)], -1)`` for ``x`` [B, C, L] and
    ``pool`` [slots, C, history], then zeros up to a length that is a ``multiple`` of the given
    one. ``act`` is SnakeBeta's (alpha, beta); without it ``bias`` must be None. The result has
    ``x``'s layout. With a pool and ``n_new`` (frames of ``rate`` samples), also writes each row's
    new history back in the same pass, as :func:`history_write` of the result would."""
    B, C, L = x.shape
    T = history + L
    T_out = -(-T // multiple) * multiple
    cl = is_channels_last(x)  # the result's layout; x itself is read through its strides
    write = pool is not None and n_new is not None
    if not snake.fused(x) or B * C * T_out >= 2**31:
        hist = x.new_zeros(*x.shape[:-1], history) if pool is None else pool.index_select(0, slots).to(x.dtype)
        if act is not None:
            x = snake_beta_eager(x, act[0], act[1], bias)
        tail = [x.new_zeros(B, C, T_out - T)] if T_out > T else []
        xx = to_layout(torch.cat([hist, x, *tail], dim=-1), cl)  # cat's is contiguous
        if write:
            history_write(pool, slots, xx, n_new, rate, history)
        return xx
    out = empty_time(x, T_out, cl)
    dummy = x  # never read: the flags below switch those loads off
    alpha, beta = act if act is not None else (dummy, dummy)
    bl, bc = tile_shape(C, T_out, cl)
    split, hist_c, bh = _history_programs(history, min(bc, triton.next_power_of_2(C)))
    tiles = split + triton.cdiv(T_out - history, bl) if pool is not None else triton.cdiv(T_out, bl)
    _history_cat_kernel[(tiles, triton.cdiv(C, bc), B)](
        out, x, pool if pool is not None else dummy, slots if slots is not None else dummy,
        n_new if write else dummy, alpha, beta, bias if bias is not None else dummy,
        C, history, T, T_out, rate, *out.stride(), *x.stride(), *(pool.stride() if pool is not None else (0, 0, 0)),
        HAS_POOL=pool is not None, WRITE=write, HAS_ACT=act is not None, HAS_BIAS=bias is not None,
        FAST_SIN=fast_sin(x), SPLIT=split, HIST_C=hist_c, CHUNKS=triton.cdiv(history, bh), BLOCK_H=bh,
        BLOCK_L=bl, BLOCK_C=bc, num_warps=snake.NUM_WARPS, **pdl.options(x),
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
    """``pool[slots[b]] = xx[b, :, n_new[b]*rate : n_new[b]*rate + history]``, in place: the eager
    write (the fused one is :func:`history_cat` with ``n_new``), and its reference."""
    pool.index_copy_(0, slots, window(xx, n_new * rate, history, dim=-1).to(pool.dtype))
