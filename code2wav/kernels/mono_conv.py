"""The decoder's last conv (C channels -> 1, kernel K) as one Triton pass on CUDA.

cuDNN has no good kernel for a single output channel: its implicit-GEMM fallback took ~20 % of a
16 x 25-frame bf16 step on an H200. Here each program reads its input block once per tap (the
taps hit cache) and accumulates in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from code2wav.kernels.snake import triton

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _mono_conv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, C, L_in, L_out, K: tl.constexpr, DIL: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = t < L_out
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for c in range(0, C):
            base = x_ptr + (row * C + c).to(tl.int64) * L_in
            for k in tl.static_range(K):
                w = tl.load(w_ptr + c * K + k).to(tl.float32)
                acc += w * tl.load(base + t + k * DIL, mask=mask, other=0.0).to(tl.float32)
        acc += tl.load(b_ptr).to(tl.float32)
        tl.store(y_ptr + row.to(tl.int64) * L_out + t, acc.to(y_ptr.dtype.element_ty), mask=mask)


def mono_conv(x: Tensor, weight: Tensor, bias: Tensor, dilation: int = 1) -> Tensor:
    """``conv1d(x, weight, bias)`` for ``weight`` [1, C, K], no padding: [B, C, L] -> [B, 1, L - (K-1)*d]."""
    if triton is None or not x.is_cuda or x.dtype == torch.float64:
        return F.conv1d(x, weight, bias, dilation=dilation)
    x = x.contiguous()
    B, C, L = x.shape
    K = weight.shape[-1]
    L_out = L - (K - 1) * dilation
    y = torch.empty(B, 1, L_out, device=x.device, dtype=x.dtype)
    block = 1024
    _mono_conv_kernel[(B, triton.cdiv(L_out, block))](x, weight.contiguous(), bias, y, C, L, L_out, K=K, DIL=dilation, BLOCK=block)
    return y
