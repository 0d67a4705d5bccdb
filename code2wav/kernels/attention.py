"""A streaming step's attention as one kernel per layer (Triton on CUDA).

In a step of few frames a row, attention is launch-bound: the RoPE tables, ``rope_kv_cat``
(RoPE, the KV history read and written), the step's mask built op by op, SDPA, and the copy of
its ``[B, H, T, D]`` output into the ``[B, T, H * D]`` rows the output projection reads are ~3
launches a layer and ~15 a step, each doing a few KB of work. Here one program per (row, kv
head) does all of it: it holds the row's whole key axis ``[pool history (W rows), new frames
(T)]`` (at most ``max_frames`` new ones, so the keys fit one tile); rotates the new keys and
queries, the angles from the row's start position as ``Rotary`` computes them (fp32 position
times fp32 frequency, precise cosine and sine); masks by position as ``Attention.mask`` does
(causal, within the sliding window, no key before position 0); takes the softmax in fp32; and
writes its heads' outputs straight into the projection's rows. Then it writes the slot's new
history back, as ``rope_kv_cat`` with ``n_new`` does, from registers: the shifted history rows
were loaded with the keys, the new frames' keys and values computed for attention, and a
barrier puts every read of the pool in the program before the first store.

One program owns every pool access of its (slot, kv head), so reads and writes do not race;
with grouped-query attention it loops over the group's query heads. The same rounding points as
the two-kernel path: keys, values and queries in the attention dtype, the probabilities rounded
to it before the value product (as flash kernels do), the output to it and then to ``x``'s
dtype. Steps of more frames (prefills of a reference prefix) keep ``rope_kv_cat`` + SDPA.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from code2wav.kernels import pdl, snake
from code2wav.kernels.snake import triton

if triton is not None:
    import triton.language as tl

    from code2wav.kernels.pdl import wait_previous
    from code2wav.kernels.transformer import rotated

    @triton.jit
    def _dot(a, b, IEEE: tl.constexpr):
        """``a @ b`` in fp32; float32 operands exactly (``IEEE``), not through TF32."""
        if IEEE:
            return tl.dot(a, b, input_precision="ieee")
        return tl.dot(a, b)

    @triton.jit
    def _attend_kernel(
        qkv_ptr, inv_freq_ptr, pk_ptr, pv_ptr, slots_ptr, n_new_ptr, start_ptr, out_ptr,
        T, W, WINDOW, H, HKV, D, sqb, sqt, sm_scale,
        GROUP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
        IEEE: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_previous(PDL)  # before any memory access (kernels/pdl.py)
        b = tl.program_id(0) // HKV
        kvh = tl.program_id(0) % HKV
        att_ty = pk_ptr.dtype.element_ty  # keys and values are kept in the dtype attention runs in
        d = tl.arange(0, BLOCK_D)[None, :]
        dm = d < D
        half = D // 2
        pd = tl.where(d < half, d + half, d - half)
        sign = tl.where(d < half, -1.0, 1.0)
        pool_head = (tl.load(slots_ptr + b).to(tl.int64) * HKV + kvh) * W * D
        start = tl.load(start_ptr + b)

        # The keys in two tiles: the pool's W history rows as they are, and the T new frames'
        # (rotated here; key-axis rows W + t). Scores from both share one softmax. The slot's
        # new history is loaded now too: row j is key-axis row n_new + j, the pool's row
        # n_new + j while that is < W (``shifted``), else new frame j - (W - n_new).
        n_new = tl.load(n_new_ptr + b)
        j = tl.arange(0, BLOCK_H)[:, None]
        hm = (j < W) & dm
        k_old = tl.load(pk_ptr + pool_head + j * D + d, mask=hm, other=0.0)
        v_old = tl.load(pv_ptr + pool_head + j * D + d, mask=hm, other=0.0)
        kept = hm & (n_new + j < W) & (n_new > 0)  # no new frame: the slot's history stays as it is
        k_shifted = tl.load(pk_ptr + pool_head + (n_new + j) * D + d, mask=kept, other=0.0)
        v_shifted = tl.load(pv_ptr + pool_head + (n_new + j) * D + d, mask=kept, other=0.0)
        # RoPE angles of the new frames, as Rotary computes them: the position in fp32 times
        # the fp32 frequency, its precise cosine and sine (rows past T: masked everywhere).
        t = tl.arange(0, BLOCK_T)[:, None]
        tm = (t < T) & dm
        angle = (start + t).to(tl.float32) * tl.load(inv_freq_ptr + tl.where(d < half, d, d - half), mask=dm, other=0.0)
        cos, sin = tl.cos(angle), tl.sin(angle)
        row = qkv_ptr + b * sqb + t * sqt
        k_new = rotated(row + (H + kvh) * D, d, pd, sign, cos, sin, tm).to(att_ty)
        v_new = tl.load(row + (H + HKV + kvh) * D + d, mask=tm, other=0.0).to(att_ty)

        # Positions relative to the row's start: query t; history row j is frame j - W, new key u is frame u.
        old_p = tl.arange(0, BLOCK_H)[None, :] - W
        new_p = tl.arange(0, BLOCK_T)[None, :]
        seen_old = (old_p > t - WINDOW) & (start + old_p >= 0) & (old_p < 0) & (t < T)
        seen_new = (new_p <= t) & (new_p > t - WINDOW) & (t < T)
        for g in tl.static_range(GROUP):
            h = kvh * GROUP + g
            q = rotated(row + h * D, d, pd, sign, cos, sin, tm).to(att_ty)
            s_old = tl.where(seen_old, _dot(q, tl.trans(k_old), IEEE) * sm_scale, float("-inf"))
            s_new = tl.where(seen_new, _dot(q, tl.trans(k_new), IEEE) * sm_scale, float("-inf"))
            top = tl.maximum(tl.max(s_old, axis=1), tl.max(s_new, axis=1))[:, None]
            top = tl.where(top == float("-inf"), 0.0, top)  # rows past T: all masked, p = 0
            p_old, p_new = tl.exp(s_old - top), tl.exp(s_new - top)
            total = (tl.sum(p_old, axis=1) + tl.sum(p_new, axis=1))[:, None]
            o = _dot(p_old.to(att_ty), v_old, IEEE) + _dot(p_new.to(att_ty), v_new, IEEE)
            o = (o / tl.where(total > 0, total, 1.0)).to(att_ty)
            tl.store(out_ptr + (b * T + t) * (H * D) + h * D + d, o.to(out_ptr.dtype.element_ty), mask=tm)

        # The new history, from registers: every read of the pool above is done first.
        tl.debug_barrier()
        tl.store(pk_ptr + pool_head + j * D + d, k_shifted, mask=kept)
        tl.store(pv_ptr + pool_head + j * D + d, v_shifted, mask=kept)
        fresh = (t < n_new) & (t >= n_new - W) & dm  # new frame u goes to row W - n_new + u
        tl.store(pk_ptr + pool_head + (W - n_new + t) * D + d, k_new, mask=fresh)
        tl.store(pv_ptr + pool_head + (W - n_new + t) * D + d, v_new, mask=fresh)


# Knob: warps a program. ptxas for sm90 (bf16 keys, 16 or 32 query rows) gives the kernel ~235
# registers a thread at 4 warps and 118-128 at 8; 8 is what was measured on the H200
# (BENCHMARKS.md), 4 was not.
NUM_WARPS = 8


def applies(x: Tensor, pool_k: Tensor, pool_v: Tensor, attention_dtype: torch.dtype, max_frames: int) -> bool:
    """Where :func:`attend` runs for a step's ``x`` [B, T, ...]: the Triton gate
    (``snake.fused``), at most ``max_frames`` frames a row (``LayerChoices.attention_frames``;
    0: never), and dense pools (StatePool's are; the kernel writes them in place) kept in the
    dtype attention runs in."""
    return (0 < x.shape[1] <= max_frames and snake.fused(x) and pool_k.is_contiguous() and pool_v.is_contiguous()
            and pool_k.dtype == pool_v.dtype == attention_dtype)


def attend(
    qkv: Tensor, n_heads: int, n_kv: int, inv_freq: Tensor, pool_k: Tensor, pool_v: Tensor,
    slots: Tensor, n_new: Tensor, start: Tensor, window: int, out_dtype: torch.dtype,
) -> Tensor:
    """Attention of a streaming step from the fused projection ``qkv`` [B, T, (H + 2 Hkv) D]
    over each row's pool history (``pool_*`` [slots, Hkv, W, D], in the dtype attention runs
    in) and its new frames, with the sliding ``window`` (keys at most ``window - 1`` frames
    back). RoPE is at positions ``start[b] + t`` with ``Rotary``'s fp32 ``inv_freq`` [D / 2],
    the angles computed here. Returns ``[B, T, H * D]`` in ``out_dtype`` (the output
    projection's input) and writes each row's last ``W`` valid keys/values to its slot, as
    ``rope_kv_cat`` with ``n_new``, SDPA and the output copy do together."""
    B, T, E = qkv.shape
    D = E // (n_heads + 2 * n_kv)
    W = pool_k.shape[2]
    if max(qkv.numel(), pool_k.numel(), B * T * n_heads * D) >= 2**31:
        raise ValueError("attend indexes with int32 offsets: tensors of 2**31 elements or more")
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    out = qkv.new_empty(B, T, n_heads * D, dtype=out_dtype)
    block_h = max(16, triton.next_power_of_2(W))
    _attend_kernel[(B * n_kv,)](
        qkv, inv_freq, pool_k, pool_v, slots, n_new, start, out,
        T, W, window, n_heads, n_kv, D, qkv.stride(0), qkv.stride(1), 1.0 / math.sqrt(D),
        GROUP=n_heads // n_kv, BLOCK_T=max(16, triton.next_power_of_2(T)), BLOCK_H=block_h,
        BLOCK_D=max(16, triton.next_power_of_2(D)),
        IEEE=pool_k.dtype == torch.float32, num_warps=NUM_WARPS, **pdl.options(qkv),
    )
    return out
