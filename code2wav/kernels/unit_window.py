"""The 96-channel residual unit as a Hopper kernel in CUDA C++ (wgmma), compiled at run time by NVRTC.

kernels/unit_conv.py's Triton unit reads each of the seven taps' rows from L2 again (the k=7
conv's A tiles are seven row windows of one matrix, and Triton's shared-memory tiles cannot be
taken at a row offset), and streams the weights again for every tile of samples. Here a program
(one per SM, persistent) keeps both convs' weights in shared memory for the whole launch and
fills each 128-sample tile's input window (``128 + 6 * d`` rows) into shared memory once; the
seven taps are seven wgmma operand descriptors into that one window, ``tap * d`` rows apart.

That works because of the window's layout: without swizzling, a wgmma operand is a grid of "core
matrices" of 8 rows x 16 bytes, each 128 contiguous bytes, and the descriptor's start address
moves in 16-byte steps. Stored as ``[channel chunk of 8][row][8 channels]``, any 8 consecutive
rows of one chunk are such a core matrix, so a descriptor may start at any row. (Row count
``WROWS`` is odd modulo 8 so the window's 16-byte stores spread over the banks.)

Where a window's rows come from (``Src.kind``): by default the kernel reads them itself, the
history concat fused in (``LayerChoices.read_history``): the unit's input ``x`` through
SnakeBeta (``act1``), after the row's history from the state pool (zeros without one), and the
first tile of each row writes that row's new history back to the pool once its window holds the
old one. Otherwise it is copied (``cp.async``) from the history concat ``xx`` that
kernels/history.py made before.

The work is split by warpgroup: a producer warpgroup (``PRODUCER`` threads) fills the windows,
up to two tiles ahead into two buffers, and two warpgroups (``THREADS``) run the products and
the tails, each owning 64 of a tile's samples. Windows change hands by mbarriers (full: filled and
fenced for wgmma; empty: both warpgroups' products from it done), so the filling (loads,
SnakeBeta) overlaps the tensor cores' work instead of taking turns with it.

The tail is as in the Triton unit: the conv's fp32 accumulator plus ``b1`` goes through SnakeBeta
in registers, is rounded once to bf16, and is the register operand of the 1x1 conv's wgmma; its
bias and the residual ``x`` join that accumulator before the one rounding to the output.

bf16 only, 96 channels, ``d <= MAX_DILATION``. Slower forms, measured and dropped (BENCHMARKS.md):
the next tile's products issued before this tile's tail (sessions 28-31); all eight warps
filling the next window, between the taps' products or after them, and the two warpgroups a
half tile apart in turn (session 33).
"""

from __future__ import annotations

import torch
from torch import Tensor

from code2wav.kernels import instant, sm90
from code2wav.kernels.sm90 import SMEM_LIMIT
from code2wav.kernels.snake import is_channels_last
from code2wav.kernels.unit import sm_count

C = 96  # channels: the kernel's N, 12 chunks of 8
TAPS = 7
TILE = 128  # output samples a tile (two warpgroups of 64); >= 6 d, so only a row's first tile reads its history
THREADS = 256  # the two warpgroups that run the convs
PRODUCER = 128  # threads of a warpgroup that fills the windows (``producers`` of them)
MAX_DILATION = 13  # the largest whose two windows fit beside the weights (smem_bytes <= SMEM_LIMIT)
PARAMS = 6  # per-channel fp32 rows: b1, e^alpha2, 1 / (e^beta2 + 1e-9), b2, e^alpha1, 1 / (e^beta1 + 1e-9)
_W1_BYTES = TAPS * C * C * 2
_W2_BYTES = C * C * 2
_PARAM_BYTES = PARAMS * C * 4
_BAR_BYTES = 128  # unit_window_ws's four mbarriers, the windows kept 128-byte aligned
FROM_XX, FROM_X, FROM_X_AND_POOL = 0, 1, 2  # Src.kind: where a window's rows come from
KINDS = {"FROM_XX": FROM_XX, "FROM_X": FROM_X, "FROM_X_AND_POOL": FROM_X_AND_POOL}


def window_rows(dilation: int) -> int:
    """Rows a window buffer holds: ``TILE + 6 d``, rounded up to 1 modulo 8 (bank spread)."""
    rows = TILE + (TAPS - 1) * dilation
    return rows + (1 - rows) % 8


def smem_bytes(dilation: int) -> int:
    return _W1_BYTES + _W2_BYTES + _PARAM_BYTES + _BAR_BYTES + 2 * window_rows(dilation) * C * 2


def source(producers: int) -> str:
    """The kernel's whole source for ``producers`` filling warpgroups (kernels/sm90.source)."""
    defines = {"C": C, "TAPS": TAPS, "TILE": TILE, "THREADS": THREADS, "PRODUCER": PRODUCER * producers, "MAX_DILATION": MAX_DILATION,
               "PARAMS": PARAMS, **KINDS}
    return sm90.source("unit_window.cu", defines, sm90.mma_ss(C) + sm90.mma_rs(C), headers=("window.cuh",))


def applies(x: Tensor, rows_min: int, dilation: int) -> bool:
    """Where this unit runs: ``rows_min > 0`` output samples or more (``LayerChoices.unit_window_rows``),
    bf16 channels-last activations of 96 channels on an sm90 GPU, a dilation whose window fits."""
    B, Cx, L = x.shape
    return (rows_min > 0 and B * L >= rows_min and Cx == C and x.is_cuda and x.dtype == torch.bfloat16
            and is_channels_last(x) and smem_bytes(dilation) <= SMEM_LIMIT and sm90.is_sm90(x.device.index or 0)
            and not instant.active())


def conv_image(w1: Tensor) -> Tensor:
    """The k=7 conv's weight ``[out, in, 7]`` (any strides) as ``[tap][in chunk of 8][out][8]``
    (bf16, contiguous): a tap's chunk is a wgmma B operand of 8-row core matrices, at any width."""
    c_out, c_in, k = w1.shape
    return w1.permute(2, 1, 0).reshape(k, c_in // 8, 8, c_out).permute(0, 1, 3, 2).to(torch.bfloat16).contiguous()


def unit_params(b1: Tensor, alpha: Tensor, beta: Tensor, b2: Tensor, alpha1: Tensor, beta1: Tensor) -> Tensor:
    """A unit's per-channel parameters as the window kernels read them (``[PARAMS, C]`` fp32): b1,
    e^alpha, 1 / (e^beta + 1e-9), b2, then act1's ``e^alpha1``, ``1 / (e^beta1 + 1e-9)``."""
    f = lambda t: t.detach().float().reshape(-1)  # noqa: E731
    snake_rows = lambda a, b: [f(a).exp(), 1.0 / (f(b).exp() + 1e-9)]  # noqa: E731
    return torch.stack([f(b1), *snake_rows(alpha, beta), f(b2), *snake_rows(alpha1, beta1)]).contiguous()


def pack(w1: Tensor, w2: Tensor, b1: Tensor, alpha: Tensor, beta: Tensor, b2: Tensor, alpha1: Tensor,
         beta1: Tensor) -> tuple[Tensor, Tensor]:
    """The weights as the kernel's shared-memory image (``[tap][chunk][n][8]`` then ``[chunk][n][8]``,
    bf16) and the per-channel parameters (``unit_params``). ``alpha``/``beta``: the SnakeBeta
    between the convs (act2); ``alpha1``/``beta1``: the one before the unit's conv (act1)."""
    img2 = w2[:, :, 0].t().reshape(C // 8, 8, C).permute(0, 2, 1)  # [chunk, n, 8]
    wpack = torch.cat([conv_image(w1).reshape(-1), img2.reshape(-1).to(torch.bfloat16)]).contiguous()
    return wpack, unit_params(b1, alpha, beta, b2, alpha1, beta1)


def check_operands(kernel: str, c: int, x: Tensor, dilation: int, xx: Tensor | None, pool: Tensor | None,
                   slots: Tensor | None, n_new: Tensor | None) -> None:
    """What a window kernel of ``c`` channels reads, checked before a launch: bf16 channels-last
    ``x`` (and ``xx``, long enough for the history), 16-byte aligned rows; a pool of the layer's
    history rows ``[slots, c, 6 d]`` (time contiguous, even strides: read in pairs of samples)
    with int64 ``slots`` and ``n_new``, one per row. ``kernel`` names the kernel in the errors."""
    B, Cx, L = x.shape
    H = (TAPS - 1) * dilation
    if Cx != c or x.dtype != torch.bfloat16 or (xx is not None and xx.dtype != torch.bfloat16):
        raise ValueError(f"{kernel} takes bf16 {c}-channel activations, got {Cx} channels of {x.dtype}")
    if x.stride(1) != 1 or (L > 1 and x.stride(2) != c) or x.data_ptr() % 16 or x.stride(0) % 8:
        raise ValueError(f"{kernel} reads channels-last x, its rows 16-byte aligned")
    if xx is not None and (xx.stride()[1:] != (1, c) or xx.data_ptr() % 16 or xx.stride(0) % 8):
        raise ValueError(f"{kernel} reads channels-last xx, its rows 16-byte aligned")
    if xx is not None and xx.shape[-1] < L + H:
        raise ValueError(f"xx has {xx.shape[-1]} samples, the conv needs {L + H}")
    if pool is not None:
        if (pool.dtype != torch.bfloat16 or pool.shape[1:] != (c, H) or pool.stride(2) != 1 or pool.stride(1) % 2
                or pool.stride(0) % 2 or pool.data_ptr() % 4):
            raise ValueError(f"the pool must be bf16 [slots, {c}, {H}] with time contiguous, got {pool.dtype} {tuple(pool.shape)}")
        for name, t in (("slots", slots), ("n_new", n_new)):
            if t is None or t.dtype != torch.long or t.shape != (B,) or t.stride(0) != 1:
                raise ValueError(f"{name} must be a contiguous int64 tensor of {B} rows with the pool")


def unit_window(x: Tensor, wpack: Tensor, params: Tensor, dilation: int, xx: Tensor | None = None,
                pool: Tensor | None = None, slots: Tensor | None = None, n_new: Tensor | None = None,
                rate: int = 1, conv_only: bool = False, producers: int = 1) -> Tensor:
    """A 96-channel residual unit, ``x + conv1x1(act2(conv7(act1(x) after its history)))``, as
    kernels/unit_conv.unit_conv computes it from the history concat, from ``pack``'s weights.

    The k=7 conv's input: ``xx``, the history concat (kernels/history.history_cat), if given;
    otherwise the kernel makes it itself: ``pool[slots]`` (``[slots, C, 6 d]`` bf16, each row's
    history; zeros without a pool) then ``act1(x)``, and writes each row's new history, ending
    at sample ``n_new[b] * rate``, back to the pool (as history_cat would). ``conv_only``: the
    k=7 conv plus ``b1`` alone (tests). ``producers``: the warpgroups that fill the windows
    (``LayerChoices.window_producers``: 1 or 2)."""
    check_operands("unit_window", C, x, dilation, xx, pool, slots, n_new)
    B, _, L = x.shape
    if producers not in (1, 2):
        raise ValueError(f"unit_window fills its windows with 1 or 2 warpgroups, got producers={producers}")
    smem = smem_bytes(dilation)
    if smem > SMEM_LIMIT:
        raise ValueError(f"dilation {dilation} needs {smem} bytes of shared memory, over {SMEM_LIMIT}")
    kind = FROM_XX if xx is not None else FROM_X_AND_POOL if pool is not None else FROM_X
    y = torch.empty(B, L, C, device=x.device, dtype=x.dtype)
    grid = min(B * -(-L // TILE), sm_count(x.device))
    kern = sm90.load(x.device.index or 0, source(producers), "unit_window", smem_bytes(MAX_DILATION))  # one opt-in serves every dilation
    p = pool if pool is not None else x  # never read without a pool
    kern(grid=(grid, 1, 1), block=(THREADS + PRODUCER * producers, 1, 1), shared_mem=smem,
         args=[xx if xx is not None else x, x, wpack, params, y, p, slots if pool is not None else x,
               n_new if pool is not None else x, kind, xx.stride(0) if xx is not None else 0,
               xx.shape[-1] if xx is not None else 0, x.stride(0), B, L, dilation, window_rows(dilation),
               p.stride(0), p.stride(1), rate, int(conv_only)])
    return y.transpose(1, 2)
