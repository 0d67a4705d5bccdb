"""The 192-channel residual unit as a Hopper kernel in CUDA C++ (wgmma), its weights streamed.

kernels/unit_window.py's kernel keeps both convs' weights in shared memory for its whole launch;
at 192 channels they are 516 + 74 KB in bf16, more than an SM holds. Here a program (one per SM,
persistent) fills each 128-sample tile's input window (``128 + 6 d`` rows of 192 channels, the
history read from the pool and act1 applied, as the 96-channel kernel does) into shared memory
once, and the weights pass through it in stages of ``KG`` input channels: one thread streams
them from L2 with bulk copies (the TMA unit, no tensor map), ``NSLOTS`` stages ahead of the
products, in the order the image ``pack`` writes holds them (the k=7 conv tap by tap, then the
1x1 conv). Each 128-sample tile reads all of them once, where the Triton unit
(kernels/unit_conv.py) reads them for every 64-row tile and each tap's input rows again; and the
history concat before the unit is gone.

Roles, by warpgroup: ``FILLERS`` threads fill the windows (``cp.async``, then SnakeBeta in place),
up to two tiles ahead; one thread streams the weights; two warpgroups run the products, each
owning 64 of a tile's samples in an m64n192 fp32 accumulator. The tail is as in the 96-channel
kernel (SnakeBeta of the accumulator plus ``b1`` as the 1x1 conv's register operand, its bias
and the residual before the one rounding), in two passes of 96 output channels (register room).

bf16 only, 192 channels, ``d <= MAX_DILATION``. ``LayerChoices.unit_streamed_rows`` sets the
smallest step it runs in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from code2wav.kernels import instant, sm90
from code2wav.kernels.sm90 import SMEM_LIMIT
from code2wav.kernels.snake import is_channels_last
from code2wav.kernels.unit import sm_count
from code2wav.kernels.unit_window import FROM_X, FROM_X_AND_POOL, FROM_XX, KINDS, PARAMS, TAPS, TILE, check_operands, conv_image, unit_params, window_rows

C = 192  # channels: the conv's N, 24 chunks of 8
THREADS = 256  # the two warpgroups that run the products
FILLERS = 96  # threads that fill the windows (three warps); a fourth warp's first thread streams the weights
_BAR_BYTES = 128  # the mbarriers (4 + 2 NSLOTS), the windows kept 128-byte aligned


@dataclass(frozen=True)
class Stages:
    """How the weights stream: ``kg`` input channels a stage (a multiple of 16 dividing C),
    ``slots`` stage buffers of ``kg x C`` bf16 each."""

    kg: int
    slots: int

    @property
    def ring_bytes(self) -> int:
        return self.slots * self.kg * C * 2


# Knob: bench/unit_streamed.py times both (BENCHMARKS.md).
STAGINGS = {64: Stages(64, 3), 32: Stages(32, 6)}
DEFAULT_KG = 64


def smem_bytes(dilation: int, kg: int = DEFAULT_KG) -> int:
    return STAGINGS[kg].ring_bytes + PARAMS * C * 4 + _BAR_BYTES + 2 * window_rows(dilation) * C * 2


# the largest dilation whose two windows fit beside the stage buffers at every staging
MAX_DILATION = max(d for d in range(1, 64) if all(smem_bytes(d, kg) <= SMEM_LIMIT for kg in STAGINGS))


def source(kg: int = DEFAULT_KG) -> str:
    """The kernel's whole source for one staging (kernels/sm90.source)."""
    st = STAGINGS[kg]
    defines = {"C": C, "TAPS": TAPS, "TILE": TILE, "THREADS": THREADS, "FILLERS": FILLERS, "KG": st.kg, "NSLOTS": st.slots,
               "MAX_DILATION": MAX_DILATION, "PARAMS": PARAMS, **KINDS}
    return sm90.source("unit_streamed.cu", defines, sm90.mma_ss(C) + sm90.mma_rs(C // 2), headers=("window.cuh",))


def applies(x: Tensor, rows_min: int, dilation: int) -> bool:
    """Where this unit runs: ``rows_min > 0`` output samples or more (``LayerChoices.unit_streamed_rows``),
    bf16 channels-last activations of 192 channels on an sm90 GPU, a dilation whose window fits."""
    B, Cx, L = x.shape
    return (rows_min > 0 and B * L >= rows_min and Cx == C and x.is_cuda and x.dtype == torch.bfloat16
            and is_channels_last(x) and dilation <= MAX_DILATION and sm90.is_sm90(x.device.index or 0)
            and not instant.active())


def pack(w1: Tensor, w2: Tensor, b1: Tensor, alpha: Tensor, beta: Tensor, b2: Tensor, alpha1: Tensor,
         beta1: Tensor) -> tuple[Tensor, Tensor]:
    """The weights as the stages the kernel streams, in its order (bf16): the k=7 conv
    ``[tap][in chunk][out][8]`` (a stage: ``kg / 8`` chunks of one tap), then the 1x1 conv
    ``[out half][in chunk][out of the half][8]`` (a stage: ``kg / 8`` chunks of one half); one
    image for every staging. And the per-channel parameters (kernels/unit_window.unit_params)."""
    wt = w2[:, :, 0].t()  # [in, out]
    img2 = wt.reshape(C // 8, 8, 2, C // 2).permute(2, 0, 3, 1)  # [half, chunk, n, 8]
    wpack = torch.cat([conv_image(w1).reshape(-1), img2.reshape(-1).to(torch.bfloat16)]).contiguous()
    return wpack, unit_params(b1, alpha, beta, b2, alpha1, beta1)


def unit_streamed(x: Tensor, wpack: Tensor, params: Tensor, dilation: int, xx: Tensor | None = None,
                  pool: Tensor | None = None, slots: Tensor | None = None, n_new: Tensor | None = None,
                  rate: int = 1, kg: int = DEFAULT_KG) -> Tensor:
    """A 192-channel residual unit, ``x + conv1x1(act2(conv7(act1(x) after its history)))``, from
    ``pack``'s weights; ``kg``: the staging (a key of ``STAGINGS``); the other arguments as kernels/unit_window.unit_window's:
    ``xx``, the history concat, if given; else the kernel reads ``pool[slots]`` (zeros without a
    pool) and writes each row's new history, ending at sample ``n_new[b] * rate``, back."""
    check_operands("unit_streamed", C, x, dilation, xx, pool, slots, n_new)
    B, _, L = x.shape
    if kg not in STAGINGS:
        raise ValueError(f"unit_streamed streams stages of {sorted(STAGINGS)} input channels, got kg={kg}")
    if wpack.numel() != (TAPS + 1) * C * C or params.shape != (PARAMS, C):
        raise ValueError(f"unit_streamed's weights are pack()'s for {C} channels")
    if dilation > MAX_DILATION:
        raise ValueError(f"dilation {dilation} needs {smem_bytes(dilation, kg)} bytes of shared memory, over {SMEM_LIMIT}")
    kind = FROM_XX if xx is not None else FROM_X_AND_POOL if pool is not None else FROM_X
    y = torch.empty(B, L, C, device=x.device, dtype=x.dtype)
    ntiles = B * -(-L // TILE)
    if ntiles:
        kern = sm90.load(x.device.index or 0, source(kg), "unit_streamed", smem_bytes(MAX_DILATION, kg))  # one opt-in serves every dilation
        p = pool if pool is not None else x  # never read without a pool
        kern(grid=(min(ntiles, sm_count(x.device)), 1, 1), block=(THREADS + 128, 1, 1), shared_mem=smem_bytes(dilation, kg),
             args=[xx if xx is not None else x, x, wpack, params, y, p, slots if pool is not None else x,
                   n_new if pool is not None else x, kind, xx.stride(0) if xx is not None else 0,
                   xx.shape[-1] if xx is not None else 0, x.stride(0), B, L, dilation, window_rows(dilation),
                   p.stride(0), p.stride(1), rate])
    return y.transpose(1, 2)
