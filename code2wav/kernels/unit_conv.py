"""A whole residual unit after its history concat as one Triton kernel on CUDA: the dilated k=7
conv, then ``x + b2 + W2 @ snake(h + b1)``.

Done as two launches (cuDNN's conv, then kernels/unit.py's fused tail), the conv's output ``h``
is written to memory in the activation dtype and read back: two of the unit's five passes over
the activation, and one more rounding. Here the conv is an implicit GEMM over the history concat
``xx`` (``[B, C, H + L]`` channels-last, SnakeBeta already applied by kernels/history.py): output
``t`` of a row is the sum over taps ``j`` of row ``t + j * d`` of ``xx`` times tap ``j``'s
weights, so a program's ``A`` tiles for the seven taps are seven row windows of one matrix, read
through L2. The fp32 accumulator then goes through SnakeBeta (with the conv's bias) in registers,
is rounded once to the weights' dtype, and is the ``A`` of the 1x1 conv's GEMM; bias and residual
are added to that accumulator before the one rounding to the output.

``tl.dot`` wants power-of-two widths, and the decoder's widths are not (96, 192, 384). Two forms
(``ConvTiles.form``), picked per width by a sweep: ``"samples"`` puts the samples on the
products' M side and splits ``C`` into ``CA`` (the largest power of two below it) and
``CB = C - CA`` (a power of two too for all of them), two accumulators side by side, so no lane
computes padding; ``"channels"`` transposes the products (output channels x samples), pads ``C``
to a power of two and puts the samples on the wide N side, which the tensor cores run faster at
96 channels despite the padding.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor

from code2wav.kernels import pdl, snake
from code2wav.kernels.snake import fast_sin, is_channels_last, triton
from code2wav.kernels.unit import sm_count


@dataclass(frozen=True)
class ConvTiles:
    """One launch's tiling: output samples per program, the K slice over input channels (it
    divides ``C``; one that is not a power of two, such as a whole tap ``block_k = C``, is taken
    as two power-of-two parts in each K step, ``split(block_k)``), warps, pipeline stages, and the form: ``"samples"`` (samples x channels:
    the samples are the GEMMs' M side, ``C`` split in two power-of-two parts) or
    ``"channels"`` (the transposed products, output channels x samples: the weights are the A
    operand, ``C`` padded to a power of two, and the samples the wide N side)."""

    block_m: int
    block_k: int
    num_warps: int
    num_stages: int
    form: Literal["samples", "channels"] = "samples"
    tma: bool = False  # the input windows through tensor descriptors (bulk copies), not pointer loads
    tma_w: bool = False  # the dilated conv's weights likewise (they must be channels-last, [C, k, C] rows)
    ws: bool = False  # the K loop warp-specialized (Triton's: a producer warp's copies feed the MMA warps)


# Per channel count, from bench/unit_conv.py's sweep (bf16, 16 x 25 frames; figures in
# BENCHMARKS.md). Knob: edit here after a sweep on new hardware. A width not here keeps the two
# launches.
TILES: dict[int, ConvTiles] = {96: ConvTiles(128, 32, 8, 4, "channels"), 192: ConvTiles(64, 64, 4, 3, "samples")}


def split(C: int) -> tuple[int, int]:
    """``(CA, CB)``: ``C = CA + CB``, ``CA`` the largest power of two <= ``C``; the samples form
    takes ``C`` where ``CB`` is 0 or a power of two >= 16 (``computes``)."""
    ca = 1 << (C.bit_length() - 1)
    return ca, C - ca


def _parts_ok(n: int) -> bool:
    """``n``'s second part (``split``) is 0 or a power of two >= 16."""
    second = split(n)[1]
    return second == 0 or (second >= 16 and second & (second - 1) == 0)


def computes(C: int, tiles: ConvTiles) -> bool:
    """Whether ``tiles`` can compute a ``C``-channel unit: the K slice divides ``C`` and splits
    in power-of-two parts (tensor descriptors take a power-of-two slice only), and in the
    samples form ``C`` splits so too."""
    bk = tiles.block_k
    return (C % bk == 0 and _parts_ok(bk) and (tiles.form == "channels" or _parts_ok(C))
            and not ((tiles.tma or tiles.tma_w) and split(bk)[1]))


if triton is not None:
    import triton.language as tl

    from code2wav.kernels.pdl import wait_previous
    from code2wav.kernels.snake import snake_params, snake_value

    @triton.jit
    def _snake_rounded(acc, c, b1_ptr, alpha_ptr, beta_ptr, C, FAST_SIN: tl.constexpr, out_ty: tl.constexpr):
        """``snake(acc + b1)`` of an fp32 accumulator's channels ``c``, rounded to ``out_ty``;
        channels ``c >= C`` (the channels form's padding, whose accumulator is zero) stay zero."""
        h = acc + tl.load(b1_ptr + c, mask=c < C, other=0.0).to(tl.float32)
        a, inv_b = snake_params(alpha_ptr, beta_ptr, c, C)
        return snake_value(h, a, inv_b, FAST_SIN).to(out_ty)

    @triton.jit
    def _unit_rows(xx_ptr, M, L, sxxb, sxb, C: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                   TMA: tl.constexpr, SAMPLES_WIDE: tl.constexpr):
        """A program's output samples: ``rm`` (``b * L + t``, a column ``[BM, 1]``, or a row
        ``[1, BM]`` where ``SAMPLES_WIDE``), their mask, ``b`` and ``t``, and where their rows
        start in ``xx`` and ``x``. Without ``TMA`` program 0's axis runs over all ``B * L``
        samples; with it over one batch row's (axis 1 is ``b``), and ``desc`` is a descriptor
        over ``xx`` as ``[B * (H + L'), C]`` rows whose block ``row0 + j * D`` is the tile's tap ``j``."""
        ar = tl.arange(0, BLOCK_M)[None, :] if SAMPLES_WIDE else tl.arange(0, BLOCK_M)[:, None]
        if TMA:
            b = tl.program_id(1)
            t = tl.program_id(0) * BLOCK_M + ar
            mmask = t < L
            rm = b * L + t
            rows = sxxb // C  # H + L' rows a batch row
            desc = tl.make_tensor_descriptor(xx_ptr, shape=[tl.num_programs(1) * rows, C], strides=[C, 1],
                                             block_shape=[BLOCK_M, BLOCK_K])
            row0 = b * rows + tl.program_id(0) * BLOCK_M
        else:
            rm = tl.program_id(0) * BLOCK_M + ar  # row b*L + t
            mmask = rm < M
            b, t = rm // L, rm % L  # per row, not per element
            desc, row0 = 0, 0
        xx_rows = b.to(tl.int64) * sxxb + t * C  # xx's row t is output t's first tap
        x_rows = b.to(tl.int64) * sxb + t * C
        return rm, mmask, b, t, xx_rows, x_rows, desc, row0

    @triton.jit
    def _weight_desc(w1_ptr, C: tl.constexpr, TAPS: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, TMA_W: tl.constexpr):
        """A descriptor over a channels-last ``W1`` as the matrix ``[C, TAPS * C]`` (row ``n``,
        column ``j * C + k``) in ``[ROWS, BLOCK_K]`` blocks; 0 without ``TMA_W``."""
        if TMA_W:
            desc = tl.make_tensor_descriptor(w1_ptr, shape=[C, TAPS * C], strides=[TAPS * C, 1], block_shape=[ROWS, BLOCK_K])
        else:
            desc = 0
        return desc

    @triton.jit
    def _samples_dots(a, w1_ptr, rk, j, s1n, s1k, s1t, na, nb, acc_a, acc_b, HAS_B: tl.constexpr):
        """The samples form's products of one K part: window tile ``a`` (``[BM, K]``, input
        channels ``rk``, a row ``[1, K]``) times tap ``j``'s weights ``W1[n, rk, j]`` for output
        channels ``na`` (and ``nb`` where ``HAS_B``), into the two accumulators."""
        wk = w1_ptr + tl.trans(rk) * s1k + j * s1t  # [K, 1]
        acc_a = tl.dot(a, tl.load(wk + na * s1n), acc_a)
        if HAS_B:
            acc_b = tl.dot(a, tl.load(wk + nb * s1n), acc_b)
        return acc_a, acc_b

    @triton.jit
    def _unit_conv_kernel(xx_ptr, x_ptr, w1_ptr, w2_ptr, y_ptr, b1_ptr, alpha_ptr, beta_ptr, b2_ptr,
                          M, L, D, sxxb, sxb, s1n, s1k, s1t, s2n, s2k,
                          C: tl.constexpr, CA: tl.constexpr, CB: tl.constexpr, TAPS: tl.constexpr,
                          FAST_SIN: tl.constexpr, NUM_STAGES: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, KA: tl.constexpr, TMA: tl.constexpr, TMA_W: tl.constexpr,
                          WS: tl.constexpr, PDL: tl.constexpr):
        wait_previous(PDL)  # before any memory access (kernels/pdl.py)
        HAS_B: tl.constexpr = CB > 0
        CBP: tl.constexpr = CB if CB > 0 else 16  # a shape for the unused second half
        KCH: tl.constexpr = C // BLOCK_K
        KB: tl.constexpr = BLOCK_K - KA  # a K step's input channels in two power-of-two parts
        rm, mmask, b, t, xx_rows, x_rows, desc, row0 = _unit_rows(xx_ptr, M, L, sxxb, sxb, C, BLOCK_M, BLOCK_K, TMA, False)
        na = tl.arange(0, CA)[None, :]
        nb = CA + tl.arange(0, CBP)[None, :]
        acc_a = tl.zeros([BLOCK_M, CA], dtype=tl.float32)
        acc_b = tl.zeros([BLOCK_M, CBP], dtype=tl.float32)
        wd_a = _weight_desc(w1_ptr, C, TAPS, CA, BLOCK_K, TMA_W)
        wd_b = _weight_desc(w1_ptr, C, TAPS, CBP, BLOCK_K, TMA_W)
        for i in tl.range(0, TAPS * KCH, num_stages=NUM_STAGES, warp_specialize=WS):  # tap j, input channels [k0, k0 + BK)
            j = i // KCH
            rk = (i % KCH) * BLOCK_K + tl.arange(0, KA)[None, :]  # [1, KA]
            if TMA:
                a = desc.load([row0 + j * D, (i % KCH) * BLOCK_K])
            else:
                a = tl.load(xx_ptr + xx_rows + j * D * C + rk, mask=mmask, other=0.0)
            if TMA_W:  # W1 rows n, columns j * C + k
                acc_a = tl.dot(a, tl.trans(wd_a.load([0, j * C + (i % KCH) * BLOCK_K])), acc_a)
                if HAS_B:
                    acc_b = tl.dot(a, tl.trans(wd_b.load([CA, j * C + (i % KCH) * BLOCK_K])), acc_b)
            else:
                acc_a, acc_b = _samples_dots(a, w1_ptr, rk, j, s1n, s1k, s1t, na, nb, acc_a, acc_b, HAS_B)
                if KB > 0:  # the K step's second part
                    rk2 = (i % KCH) * BLOCK_K + KA + tl.arange(0, KB)[None, :]
                    a2 = tl.load(xx_ptr + xx_rows + j * D * C + rk2, mask=mmask, other=0.0)
                    acc_a, acc_b = _samples_dots(a2, w1_ptr, rk2, j, s1n, s1k, s1t, na, nb, acc_a, acc_b, HAS_B)
        # The tail: SnakeBeta of the conv (+ its bias) is the A of the 1x1 conv, W2[n, k] its B.
        ka = tl.arange(0, CA)[:, None]
        kb = CA + tl.arange(0, CBP)[:, None]
        ha = _snake_rounded(acc_a, na, b1_ptr, alpha_ptr, beta_ptr, C, FAST_SIN, w2_ptr.dtype.element_ty)
        ya = tl.dot(ha, tl.load(w2_ptr + na * s2n + ka * s2k))
        if HAS_B:
            hb = _snake_rounded(acc_b, nb, b1_ptr, alpha_ptr, beta_ptr, C, FAST_SIN, w2_ptr.dtype.element_ty)
            ya = tl.dot(hb, tl.load(w2_ptr + na * s2n + kb * s2k), ya)
            yb = tl.dot(ha, tl.load(w2_ptr + nb * s2n + ka * s2k))
            yb = tl.dot(hb, tl.load(w2_ptr + nb * s2n + kb * s2k), yb)
        ya += tl.load(b2_ptr + na).to(tl.float32) + tl.load(x_ptr + x_rows + na, mask=mmask, other=0.0).to(tl.float32)
        y_rows = rm.to(tl.int64) * C
        tl.store(y_ptr + y_rows + na, ya.to(y_ptr.dtype.element_ty), mask=mmask)
        if HAS_B:
            yb += tl.load(b2_ptr + nb).to(tl.float32) + tl.load(x_ptr + x_rows + nb, mask=mmask, other=0.0).to(tl.float32)
            tl.store(y_ptr + y_rows + nb, yb.to(y_ptr.dtype.element_ty), mask=mmask)


    @triton.jit
    def _unit_conv_t_kernel(xx_ptr, x_ptr, w1_ptr, w2_ptr, y_ptr, b1_ptr, alpha_ptr, beta_ptr, b2_ptr,
                            M, L, D, sxxb, sxb, s1n, s1k, s1t, s2n, s2k,
                            C: tl.constexpr, CP: tl.constexpr, TAPS: tl.constexpr,
                            FAST_SIN: tl.constexpr, NUM_STAGES: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, KA: tl.constexpr, TMA: tl.constexpr, TMA_W: tl.constexpr,
                            WS: tl.constexpr, PDL: tl.constexpr):
        """The same unit, transposed: ``acc[n, m]`` over output channels ``n`` (``C`` padded to
        ``CP``; the padding's weights load as zero, so its rows stay zero) and samples ``m``."""
        wait_previous(PDL)  # before any memory access (kernels/pdl.py)
        KCH: tl.constexpr = C // BLOCK_K
        KB: tl.constexpr = BLOCK_K - KA
        rm, mmask, b, t, xx_cols, x_cols, desc, row0 = _unit_rows(xx_ptr, M, L, sxxb, sxb, C, BLOCK_M, BLOCK_K, TMA, True)
        n = tl.arange(0, CP)[:, None]  # [CP, 1]
        nmask = n < C
        acc = tl.zeros([CP, BLOCK_M], dtype=tl.float32)
        wd = _weight_desc(w1_ptr, C, TAPS, CP, BLOCK_K, TMA_W)
        for i in tl.range(0, TAPS * KCH, num_stages=NUM_STAGES, warp_specialize=WS):
            j = i // KCH
            rk = (i % KCH) * BLOCK_K + tl.arange(0, KA)  # input channels
            if TMA_W:  # rows past C read as zero: the descriptor's bounds
                w = wd.load([0, j * C + (i % KCH) * BLOCK_K])
            else:
                w = tl.load(w1_ptr + n * s1n + rk[None, :] * s1k + j * s1t, mask=nmask, other=0.0)  # [CP, BK]
            if TMA:
                a = tl.trans(desc.load([row0 + j * D, (i % KCH) * BLOCK_K]))  # [BK, BM]
            else:
                a = tl.load(xx_ptr + xx_cols + j * D * C + rk[:, None], mask=mmask, other=0.0)  # [BK, BM]
            acc = tl.dot(w, a, acc)
            if KB > 0:  # the K step's second part (pointer loads only: ``computes``)
                rk2 = (i % KCH) * BLOCK_K + KA + tl.arange(0, KB)
                w2_ = tl.load(w1_ptr + n * s1n + rk2[None, :] * s1k + j * s1t, mask=nmask, other=0.0)
                a2 = tl.load(xx_ptr + xx_cols + j * D * C + rk2[:, None], mask=mmask, other=0.0)
                acc = tl.dot(w2_, a2, acc)
        h = _snake_rounded(acc, n, b1_ptr, alpha_ptr, beta_ptr, C, FAST_SIN, w2_ptr.dtype.element_ty)
        k2 = tl.arange(0, CP)[None, :]
        w2 = tl.load(w2_ptr + n * s2n + k2 * s2k, mask=nmask & (k2 < C), other=0.0)  # [CP, CP] = W2[n, k]
        y = tl.dot(w2, h)
        m = nmask & mmask
        y += tl.load(b2_ptr + n, mask=nmask, other=0.0).to(tl.float32)
        y += tl.load(x_ptr + x_cols + n, mask=m, other=0.0).to(tl.float32)
        tl.store(y_ptr + rm.to(tl.int64) * C + n, y.to(y_ptr.dtype.element_ty), mask=m)


def applies(x: Tensor, rows_min: int) -> bool:
    """Where the fused unit runs: bf16/fp16 on CUDA (float32 keeps cuDNN's exact convs),
    channels-last activations (the history concat keeps ``x``'s layout), a width with measured tiles (``TILES``), and a step of at least
    ``rows_min`` output samples (``LayerChoices.unit_conv_rows``; 0: never): in small steps too
    few programs fill the GPU, where cuDNN's conv and the separate tail win. (Tests run it on
    CPU float32 through Triton's interpreter, where its dot is exact.)"""
    B, C, L = x.shape
    return (rows_min > 0 and B * L >= rows_min and C in TILES and computes(C, TILES[C])
            and snake.fused(x) and not (x.is_cuda and x.dtype == torch.float32)
            and is_channels_last(x))


def unit_conv(xx: Tensor, x: Tensor, w1: Tensor, dilation: int, b1: Tensor, alpha: Tensor, beta: Tensor,
              w2: Tensor, b2: Tensor, tiles: ConvTiles | None = None) -> Tensor:
    """A residual unit's output from ``xx`` = ``[history, snake(x)]`` (``[B, C, H + L]``
    channels-last, ``H = (k - 1) * dilation``; a longer, zero-padded ``xx`` is fine) and its
    input ``x`` (``[B, C, L]`` channels-last, the residual): ``x + b2 + conv1x1(snake(conv_k(xx)
    + b1), w2)`` with ``w1`` the dilated conv's ``[C, C, k]`` weight and ``w2`` the 1x1 conv's
    ``[C, C, 1]``; SnakeBeta's ``alpha``/``beta`` are the second activation's. Returns a new
    channels-last tensor. ``tiles`` is for ``bench/unit_conv.py``'s sweep; by default ``TILES[C]``."""
    B, C, L = x.shape
    taps = w1.shape[-1]
    if xx.shape[-1] < L + (taps - 1) * dilation:
        raise ValueError(f"xx has {xx.shape[-1]} samples, the conv needs {L + (taps - 1) * dilation}")
    t = tiles or _readable(TILES[C], xx, w1)
    if t.form not in ("samples", "channels"):
        raise ValueError(f"form must be 'samples' or 'channels', got {t.form!r}")
    if not computes(C, t):
        raise ValueError(f"tiles {t} cannot compute {C} channels (the K slice must divide them and split in two "
                         f"power-of-two parts, the second 0 or >= 16, and be a power of two with tensor descriptors; "
                         f"the samples form needs C so split too)")
    if t.tma and not _dense_rows(xx):
        raise ValueError("tiles with tma=True read xx as dense [B, T, C] rows: give a dense channels-last xx")
    if t.tma_w and not _weight_rows(w1):
        raise ValueError("tiles with tma_w=True read w1 as [C, k, C] rows: give channels-last weights")
    if t.ws and t.num_warps < 8:  # Triton 3.6's Hopper pass aborted the process compiling one at 4
        raise ValueError(f"tiles with ws=True need 8 warps or more, got {t.num_warps}")
    ca, cb = split(C)
    M = B * L
    y = torch.empty(B, L, C, device=x.device, dtype=x.dtype).transpose(1, 2)
    block_m = min(t.block_m, max(16, triton.next_power_of_2(-(-M // sm_count(x.device)))))
    grid = (triton.cdiv(L, block_m), B) if t.tma else (triton.cdiv(M, block_m),)
    if (t.tma or t.tma_w) and x.is_cuda:
        _descriptor_scratch()
    common = (xx, x, w1, w2, y, b1, alpha, beta, b2, M, L, dilation, xx.stride(0), x.stride(0),
              w1.stride(0), w1.stride(1), w1.stride(2), w2.stride(0), w2.stride(1))
    shared = dict(TAPS=taps, FAST_SIN=fast_sin(x), NUM_STAGES=t.num_stages, BLOCK_M=block_m, BLOCK_K=t.block_k, KA=split(t.block_k)[0], TMA=t.tma,
                  TMA_W=t.tma_w, WS=t.ws, num_warps=t.num_warps, **pdl.options(x))
    if t.form == "channels":
        _unit_conv_t_kernel[grid](*common, C=C, CP=triton.next_power_of_2(C), **shared)
    else:
        _unit_conv_kernel[grid](*common, C=C, CA=ca, CB=cb, **shared)
    return y


def _dense_rows(xx: Tensor) -> bool:
    """Whether ``xx`` is dense ``[B, T, C]`` rows in memory, as ``tma`` reads it."""
    return xx.stride(0) == xx.shape[-1] * xx.shape[1]


def _weight_rows(w1: Tensor) -> bool:
    """Whether ``w1`` (``[C, C, k]``) is stored channels-last, ``[C, k, C]`` rows, as ``tma_w`` reads it."""
    C, _, k = w1.shape
    return w1.stride() == (k * C, 1, C)


def _readable(t: ConvTiles, xx: Tensor, w1: Tensor) -> ConvTiles:
    """A width's default tiles, with pointer loads where the tensors are not laid out for the
    descriptors they ask for (a trimmed ``xx``; weights not channels-last)."""
    if not (t.tma or t.tma_w):  # today's tiles: nothing to check on every call
        return t
    return replace(t, tma=t.tma and _dense_rows(xx), tma_w=t.tma_w and _weight_rows(w1))


@functools.cache
def _descriptor_scratch() -> None:
    """Triton builds a kernel's tensor descriptors in global scratch memory that it asks an
    allocator for at launch; torch's caching allocator serves it (a CUDA graph's pool during a
    capture). Set once per process."""
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
