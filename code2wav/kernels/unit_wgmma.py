"""A whole residual unit after its history concat as one Hopper kernel (Gluon): the dilated k=7
conv and ``x + b2 + W2 @ snake(h + b1)``, with both convs' weights held in shared memory.

kernels/unit_conv.py's Triton form streams every weight tile from L2 again for each 64-128
output samples, through a shared-memory ring that the pipeliner guards with a barrier per K step
(Nsight Compute on the H200: warps stalled on barriers, the shared-memory queue and dispatch in
about equal parts, the tensor cores busy under half the time). Here a program is persistent (one
per SM) and copies both weight tensors into shared memory once, as the B operands of the
warpgroup MMAs. Then, tile after tile of ``BM`` output samples, each tap's rows ``t + j * d`` of
the history concat ``xx`` are loaded 16 bytes a thread (the seven taps' overlapping rows from
L1), each warp the rows its MMAs take, and moved into wgmma's register A operand within the warp
(a register operand may start at any row; a shared-memory one, and a Gluon shared-memory view,
may not). Two steps' rows are in flight ahead of the MMAs. The fp32 accumulators go through
SnakeBeta (with the conv's bias) in registers, are rounded once, and are the register A operand
of the 1x1 conv's MMAs; bias and residual join that accumulator before the one rounding to the
output.

Output channels are split into power-of-two parts (``unit_conv.split``: 96 = 64 + 32), input
channels taken ``KC`` at a time. The weights (``8 C^2`` halves) must fit in shared memory: 96
channels (``fits``). Triton's interpreter does not run Gluon: GPU checks cover it
(bench/gpu_check.py), as bench/unit_conv.py times it.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from code2wav.kernels.snake import fast_sin, triton
from code2wav.kernels.unit import sm_count
from code2wav.kernels.unit_conv import split

SMEM_BYTES = 227 * 1024  # sm90's opt-in shared memory per block
KC = 32  # input channels an MMA takes at a time
BM = 128  # output samples a tile: two warpgroups of 64 rows
NUM_WARPS = 8

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait
except ImportError:  # pragma: no cover - an older Triton, or none
    gluon = None


def smem_bytes(C: int, taps: int = 7, itemsize: int = 2) -> int:
    """Shared memory a program holds: both convs' weights."""
    return (taps + 1) * C * C * itemsize


def fits(C: int, taps: int = 7) -> bool:
    """Whether a ``C``-channel unit has this kernel: Gluon present, ``C`` a multiple of ``KC``
    split into power-of-two parts of at least 16, its weights in sm90's shared memory (with
    room for the compiler's scratch)."""
    ca, cb = split(C)
    return (gluon is not None and C % KC == 0 and (cb == 0 or (cb >= 16 and cb & (cb - 1) == 0))
            and smem_bytes(C, taps) + 32 * 1024 <= SMEM_BYTES)


if gluon is not None:
    from code2wav.kernels.snake import snake_value as _snake_value_tl

    _snake_value = gluon.jit(_snake_value_tl.fn)

    @gluon.jit
    def _to_smem(dst, src_ptr, ROWS: gl.constexpr, COLS: gl.constexpr, stride, num_warps: gl.constexpr):
        """``dst`` (``[ROWS, COLS]``) = the ``[ROWS, COLS]`` matrix at ``src_ptr``, row stride ``stride``."""
        tpw_c: gl.constexpr = COLS // 8 if COLS // 8 < 32 else 32
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // tpw_c, tpw_c], [num_warps, 1], [1, 0])
        r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))[:, None]
        c = gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))[None, :]
        dst.store(gl.load(src_ptr + r * stride + c))

    @gluon.jit
    def _tap_rows(xx_ptr, row_base, t, kc: gl.constexpr, XT, C: gl.constexpr, KC: gl.constexpr, layout: gl.constexpr):
        """Rows ``t`` (``[BM]``, ``SliceLayout(1, layout)``) of a batch row's ``xx``, input
        channels ``kc * KC + [0, KC)``, in ``layout``; zero past ``XT``."""
        c = kc * KC + gl.arange(0, KC, layout=gl.SliceLayout(0, layout))
        return gl.load(xx_ptr + row_base + t[:, None] * C + c[None, :], mask=(t < XT)[:, None], other=0.0)

    @gluon.jit
    def _snake_rounded(acc, n, b1_ptr, alpha_ptr, beta_ptr, FAST_SIN: gl.constexpr, out_ty: gl.constexpr):
        """``snake(acc + b1)`` over an accumulator's channels ``n``, rounded to ``out_ty``."""
        h = acc + gl.load(b1_ptr + n).to(gl.float32)[None, :]
        a = gl.exp(gl.load(alpha_ptr + n).to(gl.float32))[None, :]
        inv_b = (1.0 / (gl.exp(gl.load(beta_ptr + n).to(gl.float32)) + 1e-9))[None, :]
        return _snake_value(h, a, inv_b, FAST_SIN).to(out_ty)

    @gluon.jit
    def _store_out(y, n, t, L, b2_ptr, x_ptr, x_base, y_ptr, y_base, C: gl.constexpr):
        """``y + b2 + x`` at samples ``t`` and channels ``n``, rounded once, stored."""
        m = (t < L)[:, None]
        y = y + gl.load(b2_ptr + n).to(gl.float32)[None, :]
        y = y + gl.load(x_ptr + x_base + t[:, None] * C + n[None, :], mask=m, other=0.0).to(gl.float32)
        gl.store(y_ptr + y_base + t[:, None] * C + n[None, :], y.to(y_ptr.dtype.element_ty), mask=m)

    @gluon.jit
    def _unit_wgmma_kernel(xx_ptr, x_ptr, w1_ptr, w2_ptr, y_ptr, b1_ptr, alpha_ptr, beta_ptr, b2_ptr,
                           L, XT, sxxb, sxb, n_tiles, tiles_per_row,
                           C: gl.constexpr, CA: gl.constexpr, CB: gl.constexpr, TAPS: gl.constexpr, DIL: gl.constexpr,
                           KC: gl.constexpr, BM: gl.constexpr, FAST_SIN: gl.constexpr, num_warps: gl.constexpr):
        """``w1`` and ``w2`` channels-last: ``[C_out, TAPS, C_in]`` and ``[C_out, C_in]`` in memory."""
        NK: gl.constexpr = C // KC
        STEPS: gl.constexpr = TAPS * NK
        HAS_B: gl.constexpr = CB > 0
        CBP: gl.constexpr = CB if CB > 0 else 16
        GROUPS: gl.constexpr = 2 if CB > 0 else 1  # MMA commit groups a step issues
        dt: gl.constexpr = w1_ptr.dtype.element_ty
        mma_a: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, CA, 16])
        mma_b: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, CBP, 16])
        op_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_a, k_width=2)
        op_b: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_b, k_width=2)

        # Both convs' weights for all of this program's tiles, stored [N, K] as they lie in
        # memory (channels-last W1 is [C_out, TAPS, C_in], W2 [C_out, C_in]) and handed to the
        # MMAs as [K, N] views.
        w1a = gl.allocate_shared_memory(dt, [STEPS, CA, KC], gl.NVMMASharedLayout.get_default_for([CA, KC], dt))
        w1b = gl.allocate_shared_memory(dt, [STEPS, CBP, KC], gl.NVMMASharedLayout.get_default_for([CBP, KC], dt))
        w2aa = gl.allocate_shared_memory(dt, [CA, CA], gl.NVMMASharedLayout.get_default_for([CA, CA], dt))
        w2ab = gl.allocate_shared_memory(dt, [CA, CBP], gl.NVMMASharedLayout.get_default_for([CA, CBP], dt))
        w2ba = gl.allocate_shared_memory(dt, [CBP, CA], gl.NVMMASharedLayout.get_default_for([CBP, CA], dt))
        w2bb = gl.allocate_shared_memory(dt, [CBP, CBP], gl.NVMMASharedLayout.get_default_for([CBP, CBP], dt))
        for i in gl.static_range(STEPS):  # tap i // NK, input channels (i % NK) * KC + [0, KC)
            src = w1_ptr + (i // NK) * C + (i % NK) * KC
            _to_smem(w1a.index(i), src, CA, KC, TAPS * C, num_warps)
            if HAS_B:
                _to_smem(w1b.index(i), src + CA * TAPS * C, CB, KC, TAPS * C, num_warps)
        _to_smem(w2aa, w2_ptr, CA, CA, C, num_warps)  # [n, k] blocks: outputs a/b x inputs a/b
        if HAS_B:
            _to_smem(w2ab, w2_ptr + CA, CA, CB, C, num_warps)
            _to_smem(w2ba, w2_ptr + CA * C, CB, CA, C, num_warps)
            _to_smem(w2bb, w2_ptr + CA * C + CA, CB, CB, C, num_warps)
        fence_async_shared()  # written through the generic proxy, read by the MMAs' async one
        gl.thread_barrier()

        na = gl.arange(0, CA, layout=gl.SliceLayout(0, mma_a))
        nb = CA + gl.arange(0, CBP, layout=gl.SliceLayout(0, mma_b))
        ra = gl.arange(0, BM, layout=gl.SliceLayout(1, mma_a))
        rb = gl.arange(0, BM, layout=gl.SliceLayout(1, mma_b))
        # A tap's rows are loaded 16 bytes a thread, each warp the 16 rows its MMAs take, and
        # moved into the operand layout within the warp (no block-wide barrier).
        ld: gl.constexpr = gl.BlockedLayout([BM // (8 * num_warps), 8], [32 // (KC // 8), KC // 8], [num_warps, 1], [1, 0])
        rk = gl.arange(0, BM, layout=gl.SliceLayout(1, ld))
        for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            b = (tile // tiles_per_row).to(gl.int64)
            t0 = (tile % tiles_per_row) * BM
            xx_base = b * sxxb
            acc_a = gl.zeros([BM, CA], gl.float32, layout=mma_a)
            acc_b = gl.zeros([BM, CBP], gl.float32, layout=mma_b)
            # Two steps' rows in flight ahead of the MMAs (step s = j * NK + kc reads tap j's
            # rows t + j * DIL, channels kc * KC on; past the last tap: rows loaded and unused).
            a_next = _tap_rows(xx_ptr, xx_base, t0 + rk, 0, XT, C, KC, ld)
            a_after = _tap_rows(xx_ptr, xx_base, t0 + (1 // NK) * DIL + rk, 1 % NK, XT, C, KC, ld)
            # One step's MMAs stay in flight while the next step's are issued: the wait after
            # them lets this step's run on, and holds the previous step's register operand
            # (``a_prev``) until its MMAs are done.
            a_prev = gl.zeros([BM, KC], dt, layout=op_a)
            for j in range(TAPS):  # a loop, not unrolled: registers
                for kc in gl.static_range(NK):
                    a = gl.convert_layout(a_next, op_a)
                    acc_a = warpgroup_mma(a, w1a.index(j * NK + kc).permute((1, 0)), acc_a, is_async=True)
                    if HAS_B:
                        acc_b = warpgroup_mma(gl.convert_layout(a, op_b), w1b.index(j * NK + kc).permute((1, 0)), acc_b, is_async=True)
                    a_next = a_after
                    a_after = _tap_rows(xx_ptr, xx_base, t0 + (j + (kc + 2) // NK) * DIL + rk, (kc + 2) % NK, XT, C, KC, ld)
                    acc_a, acc_b, a_prev = warpgroup_mma_wait(num_outstanding=GROUPS, deps=(acc_a, acc_b, a_prev))
                    a_prev = a
            acc_a, acc_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a, acc_b))

            # The tail: SnakeBeta of the conv (+ its bias) is the A of the 1x1 conv.
            ha = _snake_rounded(acc_a, na, b1_ptr, alpha_ptr, beta_ptr, FAST_SIN, dt)
            ya = warpgroup_mma(gl.convert_layout(ha, op_a), w2aa.permute((1, 0)), gl.zeros([BM, CA], gl.float32, layout=mma_a))
            if HAS_B:
                hb = _snake_rounded(acc_b, nb, b1_ptr, alpha_ptr, beta_ptr, FAST_SIN, dt)
                ya = warpgroup_mma(gl.convert_layout(hb, op_a), w2ab.permute((1, 0)), ya)
                yb = warpgroup_mma(gl.convert_layout(ha, op_b), w2ba.permute((1, 0)), gl.zeros([BM, CBP], gl.float32, layout=mma_b))
                yb = warpgroup_mma(gl.convert_layout(hb, op_b), w2bb.permute((1, 0)), yb)
            x_base = b * sxb
            y_base = b * L * C
            _store_out(ya, na, t0 + ra, L, b2_ptr, x_ptr, x_base, y_ptr, y_base, C)
            if HAS_B:
                _store_out(yb, nb, t0 + rb, L, b2_ptr, x_ptr, x_base, y_ptr, y_base, C)


def applies(x: Tensor, w1: Tensor, rows_min: int) -> bool:
    """Where this kernel takes a unit that kernels/unit_conv.py would (``unit_conv.applies``): a
    step of at least ``rows_min`` output samples (``LayerChoices.unit_wgmma_rows``; 0: never),
    on sm90+, bf16/fp16, a width that ``fits``, channels-last weights."""
    B, C, L = x.shape
    taps = w1.shape[-1]
    return (rows_min > 0 and B * L >= rows_min and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and fits(C, taps)
            and _hopper(x.device) and w1.stride() == (taps * C, 1, C))


@functools.cache
def _hopper(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] >= 9


def unit_wgmma(xx: Tensor, x: Tensor, w1: Tensor, dilation: int, b1: Tensor, alpha: Tensor, beta: Tensor,
               w2: Tensor, b2: Tensor) -> Tensor:
    """kernels/unit_conv.unit_conv's result (same arguments; ``w1`` and ``w2`` channels-last,
    the model's CUDA layout)."""
    B, C, L = x.shape
    taps = w1.shape[-1]
    if w1.stride() != (taps * C, 1, C) or w2.stride()[:2] != (C, 1):
        raise ValueError("unit_wgmma reads the weights channels-last ([C, k, C] rows)")
    if xx.shape[-1] < L + (taps - 1) * dilation:
        raise ValueError(f"xx has {xx.shape[-1]} samples, the conv needs {L + (taps - 1) * dilation}")
    if not fits(C, taps):
        raise ValueError(f"no Hopper unit kernel for {C} channels")
    ca, cb = split(C)
    y = torch.empty(B, L, C, device=x.device, dtype=x.dtype).transpose(1, 2)
    tiles_per_row = triton.cdiv(L, BM)
    n_tiles = B * tiles_per_row
    grid = (min(n_tiles, sm_count(x.device)),)
    _unit_wgmma_kernel[grid](xx, x, w1, w2, y, b1, alpha, beta, b2, L, xx.shape[-1], xx.stride(0), x.stride(0),
                             n_tiles, tiles_per_row, C=C, CA=ca, CB=cb, TAPS=taps, DIL=dilation, KC=KC, BM=BM,
                             FAST_SIN=fast_sin(x), num_warps=NUM_WARPS)
    return y


@functools.cache
def compiled(C: int, dilation: int, dtype: str = "bf16", taps: int = 7):  # pragma: no cover - needs ptxas
    """The kernel compiled for sm90 without a GPU (``triton.compile``), for its shared memory,
    registers and PTX on a machine without one."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    ca, cb = split(C)
    ptrs = {n: f"*{dtype}" for n in ("xx_ptr", "x_ptr", "w1_ptr", "w2_ptr", "y_ptr", "b1_ptr", "alpha_ptr", "beta_ptr", "b2_ptr")}
    sig = {**ptrs, "L": "i32", "XT": "i32", "sxxb": "i64", "sxb": "i64", "n_tiles": "i32", "tiles_per_row": "i32"}
    consts = dict(C=C, CA=ca, CB=cb, TAPS=taps, DIL=dilation, KC=KC, BM=BM, FAST_SIN=True, num_warps=NUM_WARPS)
    sig.update({k: "constexpr" for k in consts})
    src = GluonASTSource(fn=_unit_wgmma_kernel, signature=sig, constexprs=consts, attrs={(i,): [["tt.divisibility", 16]] for i in (*range(10), 11, 12)})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": NUM_WARPS})
