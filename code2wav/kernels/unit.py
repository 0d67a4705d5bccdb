"""The tail of a residual unit as one Triton GEMM on CUDA: ``x + b2 + W2 @ snake(h + b1)``.

A residual unit is snake -> dilated conv k=7 -> snake -> 1x1 conv -> + x. Done as separate ops,
everything after the k=7 conv is three kernels (SnakeBeta, cuDNN's 1x1 conv, the residual add):
seven reads and writes of the activation, and the 1x1 conv's output rounded once more. At 96-192 channels the 1x1
conv is memory-bound, so here it is one tiled GEMM over the rows of the channels-last ``[B*L, C]``
matrix: SnakeBeta (with the k=7 conv's bias) is applied to each A tile as it is loaded, and the
bias and residual are added to the fp32 accumulator before the one rounding to the output dtype.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from code2wav.kernels import snake
from code2wav.kernels.snake import fast_sin, is_channels_last, triton

# Tiles from bench/unit_tail.py's sweep (bf16, 16 x 25 frames): 4 warps, 4 stages; rows per
# program so the fp32 accumulator stays at 16k elements (128 rows x 128 channels for 96
# channels, 64 x 256 for 192; 128 x 256 was several times slower, likely spilling registers).
ACC_ELEMENTS = 128 * 128
NUM_WARPS, NUM_STAGES = 4, 4
MIN_K = 16  # the GEMM's input-channel slice: 32, or 16 for channel counts it does not divide
MAX_C = 256  # all output channels in one tile, so SnakeBeta runs once per input element; wider
#              units (384, 768 channels: 1/5 of the elements) keep the separate ops

if triton is not None:
    import triton.language as tl

    from code2wav.kernels.snake import snake_params, snake_value

    @triton.jit
    def _unit_tail_kernel(h_ptr, x_ptr, w_ptr, y_ptr, b1_ptr, alpha_ptr, beta_ptr, b2_ptr, M, L, shb, sxb, swn, swk,
                          C: tl.constexpr, FAST_SIN: tl.constexpr, NUM_STAGES: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]  # [BM, 1]: row b*L + t
        rn = tl.arange(0, BLOCK_N)[None, :]  # [1, BN]: every output channel (BLOCK_N = C rounded up)
        mmask = rm < M
        nmask = rn < C
        rows = rm.to(tl.int64) * C
        b, t = rm // L, rm % L  # per row, not per element
        h_rows = b.to(tl.int64) * shb + t * C  # h and x may have batch strides past L * C
        x_rows = b.to(tl.int64) * sxb + t * C
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in tl.range(0, C, BLOCK_K, num_stages=NUM_STAGES):  # BLOCK_K divides C: no K mask
            rk = k0 + tl.arange(0, BLOCK_K)[None, :]  # [1, BK]
            a = tl.load(h_ptr + h_rows + rk, mask=mmask, other=0.0).to(tl.float32)
            a += tl.load(b1_ptr + rk).to(tl.float32)
            sa, inv_b = snake_params(alpha_ptr, beta_ptr, rk, C)
            a = snake_value(a, sa, inv_b, FAST_SIN).to(w_ptr.dtype.element_ty)  # the 1x1 conv's input dtype
            wk = tl.trans(rk)  # [BK, 1]
            w = tl.load(w_ptr + rn * swn + wk * swk, mask=nmask, other=0.0)  # [BK, BN] = W2[n, k]
            acc = tl.dot(a, w, acc)
        acc += tl.load(b2_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
        m = mmask & nmask
        acc += tl.load(x_ptr + x_rows + rn, mask=m, other=0.0).to(tl.float32)
        tl.store(y_ptr + rows + rn, acc.to(y_ptr.dtype.element_ty), mask=m)


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def rows_per_program(rows: int, block_n: int, sms: int, fill_sms: bool = True) -> int:
    """A program's rows: 128, fewer where the fp32 accumulator would pass ``ACC_ELEMENTS``, and,
    with ``fill_sms`` (``LayerChoices.unit_fill_sms``), fewer (down to 16, ``tl.dot``'s least)
    while that leaves SMs idle: small steps (a 1-frame step's few hundred rows) would otherwise
    make a handful of programs, each one long K loop on one SM."""
    fill = max(16, 1 << (max(1, -(-rows // sms)) - 1).bit_length()) if fill_sms else 128
    return min(128, ACC_ELEMENTS // block_n, fill)


def applies(x: Tensor, h: Tensor) -> bool:
    """Where the fused tail runs: bf16/fp16 on CUDA (float32 keeps cuDNN's exact convs; an IEEE
    float32 Triton GEMM is slow), channels-last activations (the CUDA default: the unit's input
    and the k=7 conv's output are then ``[L, C]`` matrices per row), up to ``MAX_C`` channels.
    (Tests run it on CPU float32 through Triton's interpreter, where its dot is exact.)"""
    C = x.shape[1]
    return (snake.fused(x) and not (x.is_cuda and x.dtype == torch.float32) and x.shape == h.shape
            and is_channels_last(x) and is_channels_last(h) and C % MIN_K == 0 and C <= MAX_C)


def unit_tail(h: Tensor, x: Tensor, w2: Tensor, b1: Tensor, alpha: Tensor, beta: Tensor, b2: Tensor,
              block_m: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
              fill_sms: bool = True) -> Tensor:
    """``x + b2 + conv1x1(snake(h + b1), w2)`` over channels-last ``[B, C, L]`` (see ``applies``;
    the batch strides may exceed ``L * C``);
    ``w2`` is the 1x1 conv's ``[C, C, 1]`` weight. Returns a new channels-last tensor. The tile
    arguments are for ``bench/unit_tail.py``'s sweep; the defaults are what it measured best."""
    B, C, L = x.shape
    M = B * L
    y = torch.empty(B, L, C, device=x.device, dtype=x.dtype).transpose(1, 2)
    block_n = triton.next_power_of_2(C)
    block_m = block_m or rows_per_program(M, block_n, _sm_count(x.device), fill_sms)
    _unit_tail_kernel[(triton.cdiv(M, block_m),)](
        h, x, w2, y, b1, alpha, beta, b2, M, L, h.stride(0), x.stride(0), w2.stride(0), w2.stride(1),
        C=C, FAST_SIN=fast_sin(x), NUM_STAGES=num_stages or NUM_STAGES,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=32 if C % 32 == 0 else MIN_K,
        num_warps=num_warps or NUM_WARPS,
    )
    return y
