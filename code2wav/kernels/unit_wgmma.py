"""A whole residual unit after its history concat as one Hopper kernel (Gluon): the dilated k=7
conv with its input window read from HBM once, then ``x + b2 + W2 @ snake(h + b1)``.

kernels/unit_conv.py's Triton form reads tap ``j``'s rows ``t + j * d`` of the history concat
``xx`` as its own tile, so each input element crosses L2 seven times, and every program streams
the whole weight tensor again. Here a program is persistent (one per SM): it keeps both convs'
weights in shared memory for all its tiles, copies a tile's window (``BM + 6 d`` rows of ``xx``)
into shared memory once with ``cp.async`` (the next tile's copy in flight during this one's
products), and feeds the warpgroup MMAs each tap's rows as a row-offset view of that window,
loaded into registers (wgmma's A operand may come from registers, which is what lets a view
start at any row: shared-memory operands must sit on the 8-row core-matrix grid). The fp32
accumulators go through SnakeBeta (with the conv's bias) in registers, are rounded once, and
are the register A operand of the 1x1 conv's MMAs; bias and residual join that accumulator
before the one rounding to the output.

Widths are split into power-of-two parts (``unit_conv.split``: 96 = 64 + 32) for the output
channels, and the input channels are taken ``KC`` at a time. Shared memory bounds it: the
weights (``7 C^2 + C^2`` halves) must fit beside two windows, so it serves 96 channels
(``fits``); wider units keep kernels/unit_conv.py.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from code2wav.kernels.snake import fast_sin, triton
from code2wav.kernels.unit import sm_count
from code2wav.kernels.unit_conv import split

SMEM_BYTES = 227 * 1024  # sm90's opt-in shared memory per block
KC = 32  # input channels a product takes at a time (a window chunk's width)
BM = 128  # output samples a tile (two warpgroups of 64 rows)
NUM_WARPS = 8


def halo(dilation: int, taps: int = 7) -> int:
    """Rows past a tile's ``BM`` its window needs, rounded up to a power of two (>= 8)."""
    return max(8, 1 << ((taps - 1) * dilation - 1).bit_length())


def smem_bytes(C: int, dilation: int, taps: int = 7, itemsize: int = 2) -> int:
    """Shared memory a program holds: both convs' weights and two windows."""
    return (taps * C * C + C * C + 2 * C * (BM + halo(dilation, taps))) * itemsize


try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait
    from triton.runtime.jit import constexpr_function
except ImportError:  # pragma: no cover - an older Triton, or none
    gluon = None


def fits(C: int, dilation: int, taps: int = 7) -> bool:
    """Whether a ``C``-channel unit has this kernel: Gluon present, ``C`` a multiple of ``KC``
    split into power-of-two parts of at least 16 (``unit_conv.split``), its shared memory under
    sm90's."""
    ca, cb = split(C)
    return (gluon is not None and C % KC == 0 and (cb == 0 or (cb >= 16 and cb & (cb - 1) == 0))
            and smem_bytes(C, dilation, taps) <= SMEM_BYTES)


if gluon is not None:
    from code2wav.kernels.snake import snake_value as _snake_value_tl

    _snake_value = gluon.jit(_snake_value_tl.fn)

    @constexpr_function
    def _rows_layout(width, num_warps):
        """Coalesced ``[rows, width]`` tiles: 8 halves (16 bytes) a thread, a row's threads
        side by side."""
        tpw_c = max(1, min(32, width // 8))
        return gl.BlockedLayout([1, 8], [32 // tpw_c, tpw_c], [num_warps, 1], [1, 0])

    @gluon.jit
    def _to_smem(dst, src_ptr, ROWS: gl.constexpr, COLS: gl.constexpr, stride, num_warps: gl.constexpr):
        """``dst`` (``[ROWS, COLS]``) = the ``[ROWS, COLS]`` matrix at ``src_ptr`` with row stride ``stride``."""
        layout: gl.constexpr = _rows_layout(COLS, num_warps)
        r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))[:, None]
        c = gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))[None, :]
        dst.store(gl.load(src_ptr + r * stride + c))

    @gluon.jit
    def _window_copy(win, xx_ptr, tile, tiles_per_row, XT, sxxb, C: gl.constexpr, NK: gl.constexpr,
                     KC: gl.constexpr, BM: gl.constexpr, HALO: gl.constexpr, num_warps: gl.constexpr):
        """Start copying ``tile``'s window (rows ``t0 .. t0 + BM + HALO`` of its batch row's
        ``xx``, zero past ``XT``) into ``win`` (``[NK, BM + HALO, KC]``), one commit group."""
        layout: gl.constexpr = _rows_layout(KC, num_warps)
        b = tile // tiles_per_row
        t0 = (tile % tiles_per_row) * BM
        base = xx_ptr + b.to(gl.int64) * sxxb
        c = gl.arange(0, KC, layout=gl.SliceLayout(0, layout))[None, :]
        rm = t0 + gl.arange(0, BM, layout=gl.SliceLayout(1, layout))[:, None]
        rh = t0 + BM + gl.arange(0, HALO, layout=gl.SliceLayout(1, layout))[:, None]
        for kc in gl.static_range(NK):
            buf = win.index(kc)
            async_copy.async_copy_global_to_shared(buf.slice(0, BM), base + rm * C + kc * KC + c, mask=(rm < XT) & (c < KC))
            async_copy.async_copy_global_to_shared(buf.slice(BM, HALO), base + rh * C + kc * KC + c, mask=(rh < XT) & (c < KC))
        async_copy.commit_group()

    @gluon.jit
    def _snake_half(acc, n, b1_ptr, alpha_ptr, beta_ptr, FAST_SIN: gl.constexpr, out_ty: gl.constexpr):
        """``snake(acc + b1)`` over an accumulator's channels ``n``, rounded to ``out_ty``."""
        h = acc + gl.load(b1_ptr + n).to(gl.float32)[None, :]
        a = gl.exp(gl.load(alpha_ptr + n).to(gl.float32))[None, :]
        inv_b = (1.0 / (gl.exp(gl.load(beta_ptr + n).to(gl.float32)) + 1e-9))[None, :]
        return _snake_value(h, a, inv_b, FAST_SIN).to(out_ty)

    @gluon.jit
    def _epilogue(y, n, rows, rmask, x_ptr, xrow, y_ptr, yrow, b2_ptr):
        """``y + b2 + x`` at output rows ``rows`` and channels ``n``, rounded once, stored."""
        m = rmask[:, None]
        y = y + gl.load(b2_ptr + n).to(gl.float32)[None, :]
        y = y + gl.load(x_ptr + xrow[:, None] + n[None, :], mask=m, other=0.0).to(gl.float32)
        gl.store(y_ptr + yrow[:, None] + n[None, :], y.to(y_ptr.dtype.element_ty), mask=m)

    @gluon.jit
    def _unit_wgmma_kernel(xx_ptr, x_ptr, w1_ptr, w2_ptr, y_ptr, b1_ptr, alpha_ptr, beta_ptr, b2_ptr,
                           L, XT, sxxb, sxb, n_tiles, tiles_per_row,
                           C: gl.constexpr, CA: gl.constexpr, CB: gl.constexpr, TAPS: gl.constexpr, DIL: gl.constexpr,
                           KC: gl.constexpr, BM: gl.constexpr, HALO: gl.constexpr, FAST_SIN: gl.constexpr,
                           num_warps: gl.constexpr):
        """``w1`` packed ``[TAPS, C_in, C_out]`` and ``w2`` ``[C_in, C_out]`` (``pack``), both dense."""
        NK: gl.constexpr = C // KC
        HAS_B: gl.constexpr = CB > 0
        CBP: gl.constexpr = CB if CB > 0 else 16
        dt: gl.constexpr = w1_ptr.dtype.element_ty
        mma_a: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, CA, 16])
        mma_b: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, CBP, 16])
        op_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_a, k_width=2)
        op_b: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_b, k_width=2)

        # Both convs' weights, for every tile of this program: [K, N] operand tiles.
        w1a = gl.allocate_shared_memory(dt, [TAPS * NK, KC, CA], gl.NVMMASharedLayout.get_default_for([KC, CA], dt))
        w1b = gl.allocate_shared_memory(dt, [TAPS * NK, KC, CBP], gl.NVMMASharedLayout.get_default_for([KC, CBP], dt))
        w2aa = gl.allocate_shared_memory(dt, [CA, CA], gl.NVMMASharedLayout.get_default_for([CA, CA], dt))
        w2ab = gl.allocate_shared_memory(dt, [CA, CBP], gl.NVMMASharedLayout.get_default_for([CA, CBP], dt))
        w2ba = gl.allocate_shared_memory(dt, [CBP, CA], gl.NVMMASharedLayout.get_default_for([CBP, CA], dt))
        w2bb = gl.allocate_shared_memory(dt, [CBP, CBP], gl.NVMMASharedLayout.get_default_for([CBP, CBP], dt))
        for i in gl.static_range(TAPS * NK):  # tap i // NK, input channels (i % NK) * KC + [0, KC)
            src = w1_ptr + (i // NK) * C * C + (i % NK) * KC * C
            _to_smem(w1a.index(i), src, KC, CA, C, num_warps)
            if HAS_B:
                _to_smem(w1b.index(i), src + CA, KC, CB, C, num_warps)
        _to_smem(w2aa, w2_ptr, CA, CA, C, num_warps)
        if HAS_B:
            _to_smem(w2ab, w2_ptr + CA, CA, CB, C, num_warps)
            _to_smem(w2ba, w2_ptr + CA * C, CB, CA, C, num_warps)
            _to_smem(w2bb, w2_ptr + CA * C + CA, CB, CB, C, num_warps)
        fence_async_shared()  # written through the generic proxy, read by the MMAs' async one

        # Two windows: the next tile's copy runs during this one's products.
        win_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        wins = gl.allocate_shared_memory(dt, [2 * NK, BM + HALO, KC], win_layout)

        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        na = gl.arange(0, CA, layout=gl.SliceLayout(0, mma_a))
        nb = CA + gl.arange(0, CBP, layout=gl.SliceLayout(0, mma_b))
        ra = gl.arange(0, BM, layout=gl.SliceLayout(1, mma_a))
        rb = gl.arange(0, BM, layout=gl.SliceLayout(1, mma_b))
        _window_copy(wins.slice(0, NK), xx_ptr, pid, tiles_per_row, XT, sxxb, C, NK, KC, BM, HALO, num_warps)
        it = 0
        for tile in range(pid, n_tiles, nprog):
            cur = it % 2
            nxt = tile + nprog
            if nxt < n_tiles:
                _window_copy(wins.slice((1 - cur) * NK, NK), xx_ptr, nxt, tiles_per_row, XT, sxxb, C, NK, KC, BM, HALO, num_warps)
                async_copy.wait_group(1)
            else:
                async_copy.wait_group(0)
            gl.thread_barrier()  # every thread's copies of this window have landed
            win = wins.slice(cur * NK, NK)

            acc_a = gl.zeros([BM, CA], gl.float32, layout=mma_a)
            acc_b = gl.zeros([BM, CBP], gl.float32, layout=mma_b)
            for i in gl.static_range(TAPS * NK):  # tap j = i // NK reads rows j * DIL on
                a = win.index(i % NK).slice((i // NK) * DIL, BM).load(op_a)
                acc_a = warpgroup_mma(a, w1a.index(i), acc_a, is_async=True)
                if HAS_B:
                    acc_b = warpgroup_mma(gl.convert_layout(a, op_b), w1b.index(i), acc_b, is_async=True)
                acc_a, acc_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a, acc_b))
            gl.thread_barrier()  # every warp is done with this window before it is refilled

            # The tail: SnakeBeta of the conv (+ its bias) is the A of the 1x1 conv.
            ha = _snake_half(acc_a, na, b1_ptr, alpha_ptr, beta_ptr, FAST_SIN, dt)
            ya = warpgroup_mma(gl.convert_layout(ha, op_a), w2aa, gl.zeros([BM, CA], gl.float32, layout=mma_a))
            if HAS_B:
                hb = _snake_half(acc_b, nb, b1_ptr, alpha_ptr, beta_ptr, FAST_SIN, dt)
                ya = warpgroup_mma(gl.convert_layout(hb, op_a), w2ba, ya)
                yb = warpgroup_mma(gl.convert_layout(ha, op_b), w2ab, gl.zeros([BM, CBP], gl.float32, layout=mma_b))
                yb = warpgroup_mma(gl.convert_layout(hb, op_b), w2bb, yb)

            b = tile // tiles_per_row
            t0 = (tile % tiles_per_row) * BM
            _epilogue(ya, na, t0 + ra, t0 + ra < L, x_ptr, b.to(gl.int64) * sxb + (t0 + ra) * C, y_ptr,
                      (b.to(gl.int64) * L + t0 + ra) * C, b2_ptr)
            if HAS_B:
                _epilogue(yb, nb, t0 + rb, t0 + rb < L, x_ptr, b.to(gl.int64) * sxb + (t0 + rb) * C, y_ptr,
                          (b.to(gl.int64) * L + t0 + rb) * C, b2_ptr)
            it += 1


def pack(w1: Tensor, w2: Tensor) -> tuple[Tensor, Tensor]:
    """The kernel's weight layouts: ``w1`` ``[C, C, k]`` as ``[k, C_in, C_out]``, ``w2``
    ``[C, C, 1]`` as ``[C_in, C_out]``, dense."""
    return w1.permute(2, 1, 0).contiguous(), w2[:, :, 0].t().contiguous()


def unit_wgmma(xx: Tensor, x: Tensor, w1p: Tensor, w2p: Tensor, dilation: int, b1: Tensor, alpha: Tensor, beta: Tensor,
               b2: Tensor) -> Tensor:
    """kernels/unit_conv.unit_conv's result (same arguments, the weights ``pack``ed)."""
    B, C, L = x.shape
    taps = w1p.shape[0]
    if xx.shape[-1] < L + (taps - 1) * dilation:
        raise ValueError(f"xx has {xx.shape[-1]} samples, the conv needs {L + (taps - 1) * dilation}")
    if not fits(C, dilation, taps):
        raise ValueError(f"no Hopper unit kernel for {C} channels at dilation {dilation}")
    ca, cb = split(C)
    y = torch.empty(B, L, C, device=x.device, dtype=x.dtype).transpose(1, 2)
    tiles_per_row = triton.cdiv(L, BM)
    n_tiles = B * tiles_per_row
    grid = (min(n_tiles, sm_count(x.device)),)
    _unit_wgmma_kernel[grid](xx, x, w1p, w2p, y, b1, alpha, beta, b2, L, xx.shape[-1], xx.stride(0), x.stride(0),
                             n_tiles, tiles_per_row, C=C, CA=ca, CB=cb, TAPS=taps, DIL=dilation, KC=KC, BM=BM,
                             HALO=halo(dilation, taps), FAST_SIN=fast_sin(x), num_warps=NUM_WARPS)
    return y


@functools.cache
def compiled(C: int, dilation: int, dtype: str = "bf16", taps: int = 7):  # pragma: no cover - needs ptxas
    """The kernel compiled for sm90 without a GPU (``triton.compile``): its shared memory,
    registers and spills, for checks on a machine without one."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    ca, cb = split(C)
    ptrs = {n: f"*{dtype}" for n in ("xx_ptr", "x_ptr", "w1_ptr", "w2_ptr", "y_ptr", "b1_ptr", "alpha_ptr", "beta_ptr", "b2_ptr")}
    sig = {**ptrs, "L": "i32", "XT": "i32", "sxxb": "i64", "sxb": "i64", "n_tiles": "i32", "tiles_per_row": "i32"}
    consts = dict(C=C, CA=ca, CB=cb, TAPS=taps, DIL=dilation, KC=KC, BM=BM, HALO=halo(dilation, taps), FAST_SIN=True,
                  num_warps=NUM_WARPS)
    sig.update({k: "constexpr" for k in consts})
    src = GluonASTSource(fn=_unit_wgmma_kernel, signature=sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": NUM_WARPS})
