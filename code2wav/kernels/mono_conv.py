"""The decoder's last conv (C channels -> 1, kernel K) as one Triton pass on CUDA.

cuDNN has no good kernel for a single output channel: its implicit-GEMM fallback took a large
share of a bf16 step (BENCHMARKS.md). Here each program loads a [time block, all channels] tile per
tap (any layout, through strides; channels-last makes each tile row contiguous), multiplies by
that tap's weights and reduces over channels in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from code2wav.kernels import pdl, snake
from code2wav.kernels.snake import triton

BLOCK_T = 64  # output samples per program (bench/mono_conv.py sweeps it and the warps)
NUM_WARPS = 4

if triton is not None:
    import triton.language as tl

    from code2wav.kernels.pdl import wait_previous

    @triton.jit
    def _mono_conv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, C, L_out, sxb, sxc, sxt, swc, swk,
                          K: tl.constexpr, DIL: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr):
        wait_previous(PDL)  # before any memory access (kernels/pdl.py)
        row = tl.program_id(0)
        t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
        c = tl.arange(0, BLOCK_C)
        tmask = t < L_out
        cmask = c < C
        acc = tl.zeros([BLOCK_T], dtype=tl.float32)
        base = x_ptr + row.to(tl.int64) * sxb
        for k in tl.static_range(K):
            w = tl.load(w_ptr + c * swc + k * swk, mask=cmask, other=0.0).to(tl.float32)
            tile = tl.load(base + (t[:, None] + k * DIL) * sxt + c[None, :] * sxc,
                           mask=tmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(tile * w[None, :], axis=1)
        acc += tl.load(b_ptr).to(tl.float32)
        tl.store(y_ptr + row.to(tl.int64) * L_out + t, acc.to(y_ptr.dtype.element_ty), mask=tmask)


def mono_conv(x: Tensor, weight: Tensor, bias: Tensor, dilation: int = 1, block_t: int | None = None,
              num_warps: int | None = None) -> Tensor:
    """``conv1d(x, weight, bias)`` for ``weight`` [1, C, K], no padding: [B, C, L] -> [B, 1, L - (K-1)*d].
    ``block_t`` and ``num_warps`` are for the sweep; by default ``BLOCK_T`` and ``NUM_WARPS``."""
    if not snake.fused(x) or x.shape[1] > 256:
        return F.conv1d(x, weight, bias, dilation=dilation)
    B, C, L = x.shape
    K = weight.shape[-1]
    L_out = L - (K - 1) * dilation
    y = torch.empty(B, 1, L_out, device=x.device, dtype=x.dtype)
    block_t = block_t or BLOCK_T
    _mono_conv_kernel[(B, triton.cdiv(L_out, block_t))](
        x, weight, bias, y, C, L_out, *x.stride(), weight.stride(1), weight.stride(2),
        K=K, DIL=dilation, BLOCK_T=block_t, BLOCK_C=triton.next_power_of_2(C), num_warps=num_warps or NUM_WARPS, **pdl.options(x),
    )
    return y
