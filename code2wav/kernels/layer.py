"""A transformer layer of a few-row streaming step as one persistent kernel (Triton on CUDA).

In a step of a few frames (the one-frame first chunk, a lone stream's chunks) each transformer
layer is seven launches: the q/k/v product, attention (kernels/attention.py), the output
product, the residual add and norm, the gate/up product, the down product, the residual add and
norm. Each moves a few KB of activations and 1-3 MB of weights, and costs its launch, its
weights' first bytes from HBM and its drain, several microseconds, for well under one of work.

Here the layer is one launch of at most one program per SM, in five phases separated by grid
barriers (every program waits until all have finished the phase):

1. the residual add of the previous layer's MLP output and this layer's input norm, then the
   q/k/v product over output-column tiles;
2. attention, one (row, kv head) unit at a time (``attention.attend_unit``);
3. the output product;
4. the residual add of it and the post-attention norm, then the gate/up product;
5. the down product, ``silu(gate) * up`` applied as its input is loaded.

The norms are recomputed by every program from the few rows they read (no phase of their own);
program 0 stores the residual stream. Every program first asks L2 to prefetch its share of the
layer's four weight matrices (``cp.async.bulk.prefetch.L2``), so the products of phases 3-5 read
weights fetched while phases 1-2 ran. The rounding points are those of the launches it replaces
(``Transformer._forward_fused``): products accumulate in fp32 and round once to the activation
dtype, the residual stream is rounded before it is normalised, attention's as in attention.py.

The grid barrier needs every program resident at once: the launch is cooperative (the driver
refuses a grid that cannot be), the grid at most the SM count. The barrier's two counters belong
to the device and reset themselves (the last program out zeroes them), so launches in one stream
follow each other freely. Triton's interpreter runs programs one after another, so there (the
tests) each phase is its own launch of the same code, without barriers or prefetches.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from code2wav.kernels import attention, pdl, snake
from code2wav.kernels.snake import triton

PREFETCH_PIECE = 4096  # bytes per L2 prefetch instruction (16-byte multiples)
COOPERATIVE = True  # launch with the driver's co-residency check (False: a plain launch)

if triton is not None:
    import triton.language as tl

    from code2wav.kernels.attention import _dot, attend_unit
    from code2wav.kernels.pdl import wait_previous

    @triton.jit
    def _prefetch(w_ptr, numel, pid, nprog, LANES: tl.constexpr, PIECE: tl.constexpr, WB: tl.constexpr):
        """This program's share of ``w``'s bytes (``WB`` an element) into L2: pieces ``pid,
        pid + nprog, ...`` of ``PIECE`` bytes, at most ``LANES`` of them (the last one cut at
        the end; lanes past it prefetch it again)."""
        i = pid + nprog * tl.arange(0, LANES)
        start = tl.minimum(i * (PIECE // WB), (numel - 1) // (PIECE // WB) * (PIECE // WB))
        size = tl.minimum(numel - start, PIECE // WB) * WB
        tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n mov.u32 $0, 0;", "=r,l,r",
                                  [w_ptr + start, size.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def _grid_sync(bar_ptr, target):
        """Wait until ``bar`` reaches ``target`` (every program's arrival counted once): each
        thread's writes are fenced, then one thread per program counts it in and spins."""
        tl.inline_asm_elementwise("fence.acq_rel.gpu;\n mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
        tl.debug_barrier()
        tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
        while tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu") < target:
            pass
        tl.debug_barrier()

    @triton.jit
    def _normed(h_ptr, d_ptr, ls_ptr, w_ptr, hs_ptr, M, eps, STORE, HAS_D: tl.constexpr,
                BM: tl.constexpr, C: tl.constexpr):
        """``[BM, C]`` rows of ``rms_norm(h + ls * d) * w`` in ``h``'s dtype (rows past M zero);
        ``h + ls * d`` rounded first and, where ``STORE``, stored to ``hs`` (as add_rms_norm)."""
        m = tl.arange(0, BM)[:, None]
        c = tl.arange(0, C)[None, :]
        rm = (m < M) & (c < C)
        x = tl.load(h_ptr + m * C + c, mask=rm, other=0.0, cache_modifier=".cg")
        if HAS_D:
            d = tl.load(d_ptr + m * C + c, mask=rm, other=0.0, cache_modifier=".cg").to(tl.float32)
            x = (x.to(tl.float32) + tl.load(ls_ptr + c).to(tl.float32) * d).to(h_ptr.dtype.element_ty)
            tl.store(hs_ptr + m * C + c, x, mask=rm & STORE)
        x = x.to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / C + eps)
        return (x * r[:, None] * tl.load(w_ptr + c).to(tl.float32)).to(h_ptr.dtype.element_ty)

    @triton.jit
    def _products(x, w_ptr, y_ptr, M, N, pid, nprog, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, IEEE: tl.constexpr):
        """``y[:M] = x @ w.T`` for ``x`` ``[BM, K]`` in registers, this program's column tiles."""
        m = tl.arange(0, BM)[:, None]
        k = tl.arange(0, K)[None, :]
        n0 = pid * BN  # while loops: the interpreter's range() takes no program-dependent bounds
        while n0 < N:
            n = n0 + tl.arange(0, BN)[:, None]
            w = tl.load(w_ptr + n * K + k, mask=n < N, other=0.0)
            y = _dot(x, tl.trans(w), IEEE)
            cols = n0 + tl.arange(0, BN)[None, :]
            tl.store(y_ptr + m * N + cols, y.to(y_ptr.dtype.element_ty), mask=(m < M) & (cols < N))
            n0 += nprog * BN

    @triton.jit
    def _products_loaded(x_ptr, w_ptr, y_ptr, M, N, pid, nprog, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                         BK: tl.constexpr, GATED: tl.constexpr, IEEE: tl.constexpr):
        """``y[:M] = x @ w.T`` for ``x`` ``[M, K]`` in memory (written by other programs: read
        past L1), ``[M, 2K]`` = ``[gate, up]`` with ``GATED`` (its ``silu(gate) * up`` rounded as
        silu_mul's output is); this program's column tiles."""
        m = tl.arange(0, BM)[:, None]
        SX: tl.constexpr = 2 * K if GATED else K
        n0 = pid * BN
        while n0 < N:
            n = n0 + tl.arange(0, BN)[:, None]
            acc = tl.zeros([BM, BN], dtype=tl.float32)
            for k0 in tl.static_range(0, K, BK):
                k = k0 + tl.arange(0, BK)[None, :]
                x = tl.load(x_ptr + m * SX + k, mask=m < M, other=0.0, cache_modifier=".cg")
                if GATED:
                    g = x.to(tl.float32)
                    up = tl.load(x_ptr + m * SX + K + k, mask=m < M, other=0.0, cache_modifier=".cg").to(tl.float32)
                    x = (g / (1.0 + tl.exp(-g)) * up).to(x_ptr.dtype.element_ty)
                w = tl.load(w_ptr + n * K + k, mask=n < N, other=0.0)
                acc = acc + _dot(x, tl.trans(w), IEEE)
            cols = n0 + tl.arange(0, BN)[None, :]
            tl.store(y_ptr + m * N + cols, acc.to(y_ptr.dtype.element_ty), mask=(m < M) & (cols < N))
            n0 += nprog * BN

    @triton.jit
    def _layer_kernel(
        h_ptr, d_ptr, ls_prev_ptr, w_in_ptr, wqkv_ptr, inv_freq_ptr, pk_ptr, pv_ptr, slots_ptr, n_new_ptr, start_ptr,
        wo_ptr, ls_attn_ptr, w_post_ptr, wgu_ptr, wdown_ptr,
        h_mid_ptr, qkv_ptr, att_ptr, o_ptr, h_out_ptr, gu_ptr, d_out_ptr, bar_ptr,
        M, T, W, WINDOW, H, HKV, D, eps, sm_scale,
        C: tl.constexpr, E: tl.constexpr, A: tl.constexpr, I: tl.constexpr, HAS_D: tl.constexpr, FIRST: tl.constexpr, LAST: tl.constexpr, SYNC: tl.constexpr,
        PREFETCH: tl.constexpr, LANES: tl.constexpr, PIECE: tl.constexpr, WB: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BK_O: tl.constexpr, BK_D: tl.constexpr,
        GROUP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
        IEEE: tl.constexpr, ATT_IEEE: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_previous(PDL)  # before any memory access (kernels/pdl.py)
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        if PREFETCH:
            _prefetch(wqkv_ptr, E * C, pid, nprog, LANES, PIECE, WB)
            _prefetch(wo_ptr, C * A, pid, nprog, LANES, PIECE, WB)
            _prefetch(wgu_ptr, 2 * I * C, pid, nprog, LANES, PIECE, WB)
            _prefetch(wdown_ptr, C * I, pid, nprog, LANES, PIECE, WB)
        if FIRST <= 1 and 1 <= LAST:  # norm, q/k/v
            n = _normed(h_ptr, d_ptr, ls_prev_ptr, w_in_ptr, h_mid_ptr, M, eps, pid == 0, HAS_D, BM, C)
            _products(n, wqkv_ptr, qkv_ptr, M, E, pid, nprog, C, BM, BN, IEEE)
        if SYNC:
            _grid_sync(bar_ptr, nprog)
        if FIRST <= 2 and 2 <= LAST:  # attention, a (row, kv head) at a time
            u = pid
            while u < (M // T) * HKV:
                attend_unit(u // HKV, u % HKV, qkv_ptr, inv_freq_ptr, pk_ptr, pv_ptr, slots_ptr, n_new_ptr, start_ptr,
                            att_ptr, T, W, WINDOW, H, D, T * E, E, sm_scale, HKV, GROUP, BLOCK_T, BLOCK_H, BLOCK_D, ATT_IEEE)
                u += nprog
        if SYNC:
            _grid_sync(bar_ptr, 2 * nprog)
        if FIRST <= 3 and 3 <= LAST:  # output projection
            _products_loaded(att_ptr, wo_ptr, o_ptr, M, C, pid, nprog, A, BM, BN, BK_O, False, IEEE)
        if SYNC:
            _grid_sync(bar_ptr, 3 * nprog)
        if FIRST <= 4 and 4 <= LAST:  # residual + post-attention norm, gate/up
            h_in = h_mid_ptr if HAS_D else h_ptr
            n = _normed(h_in, o_ptr, ls_attn_ptr, w_post_ptr, h_out_ptr, M, eps, pid == 0, True, BM, C)
            _products(n, wgu_ptr, gu_ptr, M, 2 * I, pid, nprog, C, BM, BN, IEEE)
        if SYNC:
            _grid_sync(bar_ptr, 4 * nprog)
        if FIRST <= 5 and 5 <= LAST:  # down projection of silu(gate) * up
            _products_loaded(gu_ptr, wdown_ptr, d_out_ptr, M, C, pid, nprog, I, BM, BN, BK_D, True, IEEE)
        if SYNC:  # the last program out zeroes both counters for the next launch
            if tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu") == nprog - 1:
                tl.atomic_xchg(bar_ptr, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(bar_ptr + 1, 0, sem="relaxed", scope="gpu")


_counters: dict[torch.device, Tensor] = {}


def _barrier(device: torch.device) -> Tensor:
    """The device's two barrier counters (arrivals, exits), zero between launches."""
    if device not in _counters:
        _counters[device] = torch.zeros(2, dtype=torch.int32, device=device)
    return _counters[device]


def applies(x: Tensor, max_rows: int) -> bool:
    """Where :func:`layer` runs for a step's ``x`` [B, T, C]: the Triton gate (``snake.fused``)
    and at most ``max_rows`` rows (``LayerChoices.layer_kernel_rows``; 0: never). The caller
    checks attention's own gate (``attention.applies``)."""
    return 0 < x.shape[0] * x.shape[1] <= max_rows and snake.fused(x)


def _k_step(k: int) -> int:
    """The K slice of a product over ``k`` input columns: the largest power of two <= 64 dividing it."""
    return min(64, k & -k)


def programs(device: torch.device) -> int:
    """Programs a launch runs: one per SM (the co-resident grid the barriers need)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def layer(
    h: Tensor, d: Tensor | None, ls_prev: Tensor | None, w_in: Tensor, eps: float,
    wqkv: Tensor, n_heads: int, n_kv: int, inv_freq: Tensor, pool_k: Tensor, pool_v: Tensor,
    slots: Tensor, n_new: Tensor, start: Tensor, window: int,
    wo: Tensor, ls_attn: Tensor, w_post: Tensor, wgu: Tensor, wdown: Tensor, tune: dict | None = None,
) -> tuple[Tensor, Tensor]:
    """One transformer layer of a streaming step over ``h`` [B, T, C] (the residual stream
    before the previous layer's MLP output ``d`` is added with its layer scale ``ls_prev``;
    ``d = None`` for the first layer). Returns the residual stream after this layer's attention
    and this layer's MLP output (before its layer scale), as ``Transformer._forward_fused``
    computes them with separate launches; the slots' key/value history is updated in place."""
    B, T, C = h.shape
    M = B * T
    D = wqkv.shape[0] // (n_heads + 2 * n_kv)
    I = wdown.shape[1]
    A = n_heads * D
    if C & (C - 1) or min(_k_step(A), _k_step(I), C) < 16:
        raise ValueError(f"layer needs a power-of-two width and products in steps of 16 or more, got C={C}, I={I}, H*D={A}")
    h = h.contiguous()
    new = lambda n: h.new_empty(M, n)  # noqa: E731
    h_mid, qkv, att, o, h_out, gu, d_out = new(C), new(wqkv.shape[0]), new(n_heads * D), new(C), new(C), new(2 * I), new(C)
    P = programs(h.device)
    W = pool_k.shape[2]
    interpreted = not h.is_cuda
    args = (
        h, d if d is not None else h, ls_prev if ls_prev is not None else w_in, w_in, wqkv, inv_freq, pool_k, pool_v,
        slots, n_new, start, wo, ls_attn, w_post, wgu, wdown, h_mid, qkv, att, o, h_out, gu, d_out, _barrier(h.device),
        M, T, W, window, n_heads, n_kv, D, eps, 1.0 / math.sqrt(D),
    )
    biggest = max(wqkv.numel(), wgu.numel(), wo.numel(), wdown.numel()) * wqkv.element_size()
    meta = dict(
        C=C, E=wqkv.shape[0], A=A, I=I, HAS_D=d is not None, PREFETCH=not interpreted, LANES=triton.next_power_of_2(-(-biggest // (PREFETCH_PIECE * P))),
        PIECE=PREFETCH_PIECE, WB=wqkv.element_size(), BM=max(16, triton.next_power_of_2(M)), BN=16, BK_O=_k_step(A), BK_D=_k_step(I),
        GROUP=n_heads // n_kv, BLOCK_T=max(16, triton.next_power_of_2(T)), BLOCK_H=max(16, triton.next_power_of_2(W)),
        BLOCK_D=max(16, triton.next_power_of_2(D)), IEEE=h.dtype == torch.float32, ATT_IEEE=pool_k.dtype == torch.float32,
        num_warps=attention.NUM_WARPS,
    )
    if interpreted:  # one launch a phase: the interpreter runs programs one after another
        for p in range(1, 6):
            _layer_kernel[(P,)](*args, FIRST=p, LAST=p, SYNC=False, **meta, **pdl.options(h))
    else:
        meta = {"FIRST": 1, "LAST": 5, **meta, **(tune or {})}
        _layer_kernel[(P,)](*args, SYNC=True, launch_cooperative_grid=COOPERATIVE, **meta, **pdl.options(h))
    return h_out.view(B, T, C), d_out.view(B, T, C)
