"""The transformer layer's glue between GEMMs as one kernel each (Triton on CUDA).

A one-frame step moves a few KB per op, so every eager op is a launch that costs more than its
work: RMSNorm is ~7 launches, RoPE ~8 per tensor, the KV window's gather/cat/slice/index_copy
~12, layer scale + residual 2 more, ``silu * up`` 2. Here each group is one pass:

* ``add_rms_norm``: ``x + scale * h`` and the next RMSNorm of it (``rms_norm`` without ``h``);
* ``rope_kv_cat``: RoPE on q and k straight from the fused qkv GEMM's output, the keys and
  values prepended with the pool's history rows (``cat([pool[slots], new], time)``), and each
  row's last ``W`` valid keys/values written back to its slot (``kv_write`` is the eager form).
  Reading and writing the pool in one launch is race-free because one program per (row, kv
  head) does all of that slot's pool accesses, in an order where none reads what it wrote
  (see the kernel, and kernels/history.py, which does the same for the convs);
* ``silu_mul``: ``silu(gate) * up`` from the fused gate/up GEMM's output.

Intermediates stay in fp32 inside a kernel (the eager path rounds after every op), so fp32
results match the eager formulas to rounding and bf16 ones closely. Each function falls back to
its eager formula, today's math, where ``snake.fused`` says no (CPU, float64, too large for
int32 offsets).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from code2wav.kernels import pdl, snake
from code2wav.kernels.history import window
from code2wav.kernels.snake import triton


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Norms, softmax and RoPE run in fp32 at least (fp64 stays fp64)."""
    return torch.promote_types(dtype, torch.float32)


# -- eager formulas (the float64 / CPU path, and each kernel's reference) ------------------------


def rms_norm_eager(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    h = x.to(acc_dtype(x.dtype))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotate_eager(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE on ``x`` [B, heads, T, D] with ``cos``/``sin`` [B, T, D] (fp32 angles)."""
    acc = acc_dtype(x.dtype)
    h = x.to(acc)
    x1, x2 = h.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (h * cos[:, None].to(acc) + rotated * sin[:, None].to(acc)).to(x.dtype)


def _split_heads(qkv: Tensor, n_heads: int, n_kv: int) -> tuple[Tensor, Tensor, Tensor]:
    """[B, T, (H + 2 Hkv) D] -> q [B, H, T, D], k, v [B, Hkv, T, D] (views)."""
    B, T, E = qkv.shape
    D = E // (n_heads + 2 * n_kv)
    q, k, v = qkv.split([n_heads * D, n_kv * D, n_kv * D], dim=-1)
    return (
        q.view(B, T, n_heads, D).transpose(1, 2),
        k.view(B, T, n_kv, D).transpose(1, 2),
        v.view(B, T, n_kv, D).transpose(1, 2),
    )


# -- kernels ---------------------------------------------------------------------------------------

if triton is not None:
    import triton.language as tl

    from code2wav.kernels.pdl import wait_previous

    @triton.jit
    def _add_rms_norm_kernel(
        x_ptr, h_ptr, scale_ptr, w_ptr, xo_ptr, n_ptr, D, eps,
        HAS_RES: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_previous(PDL)  # before any memory access (kernels/pdl.py)
        row = tl.program_id(0)  # one row of D channels per program: the norm is a row reduction
        d = tl.arange(0, BLOCK_D)
        m = d < D
        x = tl.load(x_ptr + row * D + d, mask=m, other=0.0).to(tl.float32)
        if HAS_RES:
            s = tl.load(scale_ptr + d, mask=m, other=0.0).to(tl.float32)
            h = tl.load(h_ptr + row * D + d, mask=m, other=0.0).to(tl.float32)
            xo = (x + s * h).to(xo_ptr.dtype.element_ty)
            tl.store(xo_ptr + row * D + d, xo, mask=m)
            x = xo.to(tl.float32)  # normalise the residual stream as stored, as eager does
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
        w = tl.load(w_ptr + d, mask=m, other=0.0).to(tl.float32)
        tl.store(n_ptr + row * D + d, (x * r * w).to(n_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def rotated(row_ptr, d, pd, sign, cos, sin, m):
        """RoPE of one head's row: x * cos + rotate_half(x) * sin, rotate_half(x)[d] = sign[d] * x[pd[d]]."""
        x = tl.load(row_ptr + d, mask=m, other=0.0).to(tl.float32)
        xp = tl.load(row_ptr + pd, mask=m, other=0.0).to(tl.float32)
        return x * cos + sign * xp * sin

    @triton.jit
    def _new_kv_rows(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, b, h, s, d, pd, sign, dm,
                     T, W, H, HKV, D, sqb, sqt, scb, sct, STORE: tl.constexpr):
        """Rows ``s`` of the key axis [0, W + T) from the new frames ``t = s - W``: stores rotated
        q (every head) and, for kv heads, rotated k and plain v at ``s`` when ``STORE``; rows
        ``s < W`` are left zero. Returns the fp32 k, v (the pool write's new rows)."""
        new = (s >= W) & (s < W + T) & dm
        t = tl.where(s >= W, s - W, 0)
        cos = tl.load(cos_ptr + b * scb + t * sct + d, mask=new, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + b * scb + t * sct + d, mask=new, other=0.0).to(tl.float32)
        row = qkv_ptr + b * sqb + t * sqt
        kvm = new & (h < HKV)
        k = rotated(row + (H + h) * D, d, pd, sign, cos, sin, kvm)
        v = tl.load(row + (H + HKV + h) * D + d, mask=kvm, other=0.0).to(tl.float32)
        if STORE:
            q = rotated(row + h * D, d, pd, sign, cos, sin, new)
            tl.store(q_ptr + ((b * T + t) * H + h) * D + d, q.to(q_ptr.dtype.element_ty), mask=new)
            out = ((b * HKV + h) * (W + T) + s) * D + d
            om = (s < W + T) & dm & (h < HKV)
            tl.store(k_ptr + out, k.to(k_ptr.dtype.element_ty), mask=om)
            tl.store(v_ptr + out, v.to(v_ptr.dtype.element_ty), mask=om)
        return k, v

    @triton.jit
    def _rope_kv_cat_kernel(
        qkv_ptr, cos_ptr, sin_ptr, pk_ptr, pv_ptr, slots_ptr, n_new_ptr, q_ptr, k_ptr, v_ptr,
        T, W, H, HKV, D, sqb, sqt, scb, sct,
        HAS_POOL: tl.constexpr, WRITE: tl.constexpr, CHUNKS: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_previous(PDL)  # before any memory access (kernels/pdl.py)
        # Program (b * H + h, tile) over the key axis [0, W + T): history rows s < W come from
        # the pool (kv heads only); new rows s >= W are frame t = s - W, where head h writes
        # rotated q and, if h < HKV, rotated k and plain v. With a pool, tile 0 is the history
        # program: rows [0, W) and every pool access of (b, h), as in kernels/history.py (chunks
        # of increasing row j: a chunk reads rows >= its first, earlier ones wrote below it; a
        # barrier orders a chunk's loads before its stores); tiles 1.. take rows [W, W + T).
        bh = tl.program_id(0)
        b = bh // H
        h = bh % H
        r = tl.arange(0, ROWS)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        dm = d < D
        half = D // 2
        pd = tl.where(d < half, d + half, d - half)
        sign = tl.where(d < half, -1.0, 1.0)
        if HAS_POOL:
            if tl.program_id(1) == 0:
                if h < HKV:
                    pool_head = (tl.load(slots_ptr + b) * HKV + h) * W * D
                    out_head = (b * HKV + h) * (W + T) * D
                    start = 0
                    if WRITE:
                        start = tl.load(n_new_ptr + b)  # row b's window ends at its last valid frame
                    for i in tl.static_range(CHUNKS):  # increasing j: no chunk reads a row an earlier one wrote
                        j = i * ROWS + r
                        m = (j < W) & dm
                        old_k = tl.load(pk_ptr + pool_head + j * D + d, mask=m, other=0.0).to(tl.float32)
                        old_v = tl.load(pv_ptr + pool_head + j * D + d, mask=m, other=0.0).to(tl.float32)
                        if WRITE:
                            src = start + j  # where the new history's row j sits in the key axis
                            hm = m & (src < W)
                            kept_k = tl.load(pk_ptr + pool_head + src * D + d, mask=hm, other=0.0).to(tl.float32)
                            kept_v = tl.load(pv_ptr + pool_head + src * D + d, mask=hm, other=0.0).to(tl.float32)
                            k, v = _new_kv_rows(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, b, h, src, d, pd, sign, m,
                                                T, W, H, HKV, D, sqb, sqt, scb, sct, STORE=False)
                            # Rounded to the keys' dtype first: the value the keys hold at src.
                            k = tl.where(src < W, kept_k, k).to(k_ptr.dtype.element_ty)
                            v = tl.where(src < W, kept_v, v).to(v_ptr.dtype.element_ty)
                            tl.debug_barrier()  # all of this chunk's pool loads before any store to it
                            tl.store(pk_ptr + pool_head + j * D + d, k.to(pk_ptr.dtype.element_ty), mask=m)
                            tl.store(pv_ptr + pool_head + j * D + d, v.to(pv_ptr.dtype.element_ty), mask=m)
                        tl.store(k_ptr + out_head + j * D + d, old_k.to(k_ptr.dtype.element_ty), mask=m)
                        tl.store(v_ptr + out_head + j * D + d, old_v.to(v_ptr.dtype.element_ty), mask=m)
            else:
                s = W + (tl.program_id(1) - 1) * ROWS + r
                _new_kv_rows(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, b, h, s, d, pd, sign, dm,
                             T, W, H, HKV, D, sqb, sqt, scb, sct, STORE=True)
        else:
            s = tl.program_id(1) * ROWS + r
            _new_kv_rows(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, b, h, s, d, pd, sign, dm,
                         T, W, H, HKV, D, sqb, sqt, scb, sct, STORE=True)

    @triton.jit
    def _silu_mul_kernel(gu_ptr, y_ptr, N, I, BLOCK: tl.constexpr, PDL: tl.constexpr):
        wait_previous(PDL)  # before any memory access (kernels/pdl.py)
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < N
        row = offs // I
        c = offs % I
        g = tl.load(gu_ptr + row * 2 * I + c, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + row * 2 * I + I + c, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + offs, (g / (1.0 + tl.exp(-g)) * u).to(y_ptr.dtype.element_ty), mask=mask)


def _rows(length: int, block_d: int) -> int:
    """Key rows per program: about ``snake.BLOCK`` elements, no more rows than there are."""
    return max(1, min(triton.next_power_of_2(max(length, 1)), snake.BLOCK // block_d))


# -- entry points ------------------------------------------------------------------------------------


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dim (fp32 statistics), times ``weight``."""
    if not snake.fused(x):
        return rms_norm_eager(x, weight, eps)
    x = x.contiguous()
    n = torch.empty_like(x)
    D = x.shape[-1]
    _add_rms_norm_kernel[(x.numel() // D,)](
        x, x, weight, weight, x, n, D, eps, HAS_RES=False, BLOCK_D=triton.next_power_of_2(D), **pdl.options(x)
    )
    return n


def add_rms_norm(x: Tensor, h: Tensor, scale: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The residual add with layer scale and the RMSNorm after it: ``x' = x + scale * h`` and
    ``rms_norm(x', weight)``; returns both."""
    if not snake.fused(x):
        x = x + scale * h
        return x, rms_norm_eager(x, weight, eps)
    x, h = x.contiguous(), h.contiguous()
    xo, n = torch.empty_like(x), torch.empty_like(x)
    D = x.shape[-1]
    _add_rms_norm_kernel[(x.numel() // D,)](
        x, h, scale, weight, xo, n, D, eps, HAS_RES=True, BLOCK_D=triton.next_power_of_2(D), **pdl.options(x)
    )
    return xo, n


def rope_kv_cat(
    qkv: Tensor, n_heads: int, n_kv: int, cos: Tensor, sin: Tensor,
    pool_k: Tensor | None = None, pool_v: Tensor | None = None, slots: Tensor | None = None,
    out_dtype: torch.dtype | None = None, n_new: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """From the fused projection ``qkv`` [B, T, (H + 2 Hkv) D] (q, k, v heads in that order) and
    RoPE tables ``cos``/``sin`` [B, T, D]: rotated q [B, H, T, D], and keys (rotated) and values
    [B, Hkv, W + T, D] with the pool's ``W`` history rows of each row's slot first (``pool_*``
    [slots, Hkv, W, D]; no history without a pool). q is a view of [B, T, H, D] memory, keys and
    values are contiguous: what SDPA takes without copies. All three in ``out_dtype`` (default
    ``qkv``'s). With a pool and ``n_new``, also writes each row's new history back in the same
    pass, as :func:`kv_write` of the result would."""
    B, T, E = qkv.shape
    D = E // (n_heads + 2 * n_kv)
    W = pool_k.shape[2] if pool_k is not None else 0
    write = pool_k is not None and n_new is not None
    if not snake.fused(qkv) or B * n_kv * (W + T) * D >= 2**31:
        q, k, v = _split_heads(qkv, n_heads, n_kv)
        q, k = rotate_eager(q, cos, sin), rotate_eager(k, cos, sin)
        if pool_k is not None:
            k = torch.cat([pool_k.index_select(0, slots).to(k.dtype), k], dim=2)
            v = torch.cat([pool_v.index_select(0, slots).to(v.dtype), v], dim=2)
        out_dtype = out_dtype or qkv.dtype
        q, k, v = q.to(out_dtype), k.to(out_dtype), v.to(out_dtype)
        if write:
            kv_write(pool_k, pool_v, slots, k, v, n_new)
        return q, k, v
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    has_pool = pool_k is not None
    # The kernel writes the pools in place, so only dense ones (StatePool's are); others are
    # read from dense copies and written eagerly after.
    in_place = write and pool_k.is_contiguous() and pool_v.is_contiguous()
    if has_pool:
        pk, pv = pool_k.contiguous(), pool_v.contiguous()
    q = qkv.new_empty(B, T, n_heads, D, dtype=out_dtype)
    k = qkv.new_empty(B, n_kv, W + T, D, dtype=out_dtype)
    v = torch.empty_like(k)
    block_d = triton.next_power_of_2(D)
    rows = _rows(W + T, block_d)
    tiles = 1 + triton.cdiv(T, rows) if has_pool else triton.cdiv(W + T, rows)
    dummy = qkv  # never read: HAS_POOL / WRITE switch those loads off
    _rope_kv_cat_kernel[(B * n_heads, tiles)](
        qkv, cos, sin, pk if has_pool else dummy, pv if has_pool else dummy,
        slots if has_pool else dummy, n_new if in_place else dummy, q, k, v,
        T, W, n_heads, n_kv, D, qkv.stride(0), qkv.stride(1), cos.stride(0), cos.stride(1),
        HAS_POOL=has_pool, WRITE=in_place, CHUNKS=triton.cdiv(W, rows), ROWS=rows, BLOCK_D=block_d, **pdl.options(qkv),
    )
    if write and not in_place:
        kv_write(pool_k, pool_v, slots, k, v, n_new)
    return q.transpose(1, 2), k, v


def kv_write(pool_k: Tensor, pool_v: Tensor, slots: Tensor, k: Tensor, v: Tensor, n_new: Tensor) -> None:
    """``pool_*[slots[b]] = *[b, :, n_new[b] : n_new[b] + W]`` for ``k``/``v`` [B, Hkv, W + T, D]
    from :func:`rope_kv_cat`: each row's last ``W`` keys/values up to its last valid frame, in
    place. The eager write (the fused one is :func:`rope_kv_cat` with ``n_new``), and its reference."""
    W = pool_k.shape[2]
    pool_k.index_copy_(0, slots, window(k, n_new, W, dim=2).to(pool_k.dtype))
    pool_v.index_copy_(0, slots, window(v, n_new, W, dim=2).to(pool_v.dtype))


def silu_mul(gu: Tensor) -> Tensor:
    """``silu(gate) * up`` for ``gu`` [..., 2 I] = [gate, up] (the fused gate/up GEMM's output)."""
    if not snake.fused(gu):
        gate, up = gu.chunk(2, dim=-1)
        return F.silu(gate) * up
    gu = gu.contiguous()
    I = gu.shape[-1] // 2
    y = gu.new_empty(*gu.shape[:-1], I)
    N = y.numel()
    _silu_mul_kernel[(triton.cdiv(N, snake.BLOCK),)](gu, y, N, I, BLOCK=snake.BLOCK, **pdl.options(gu))
    return y
