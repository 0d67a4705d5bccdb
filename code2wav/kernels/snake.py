"""SnakeBeta (and the conv bias before it) as one memory pass on CUDA (Triton); eager elsewhere.

Eager SnakeBeta reads and writes the activation ~6 times (mul, sin, pow, mul, add) and the
preceding conv's bias add is one more full pass; the activation is 2.76 M elements per frame and
memory-bound, so a single read + write of ``snake(x + bias)`` is the whole win. The residual add
that closes each residual unit gets the same treatment (``x + h + bias``).

Activations ``[B, C, L]`` are either contiguous or channels-last (``[B, L, C]`` in memory, the
layout cuDNN's NHWC kernels read and write without conversions). The kernels walk memory in
order and derive each element's channel from the layout, so both run at full bandwidth.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:  # Triton ships with CUDA builds of torch; CPU-only installs run the eager formula.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None

BLOCK = 1024  # elements per program (tests raise it: Triton's CPU interpreter pays per program)


def fused(x: Tensor) -> bool:
    """Whether the Triton path applies: CUDA, not float64, int32-indexable. (The one gate for
    every kernel here; tests swap it to run the kernels through Triton's CPU interpreter.)"""
    return triton is not None and x.is_cuda and x.dtype != torch.float64 and x.numel() < 2**31


def is_channels_last(x: Tensor) -> bool:
    """``[B, C, L]`` stored as ``[B, L, C]`` (dense). A tensor with L == 1 or C == 1 is both."""
    B, C, L = x.shape
    return x.stride() == (L * C, 1, C) or (x.is_contiguous() and (L == 1 or C == 1))


def to_layout(x: Tensor, channels_last: bool) -> Tensor:
    """``x`` (same values and shape) stored channels-last or contiguous; no copy if it already is."""
    if not channels_last:
        return x.contiguous()
    return x if is_channels_last(x) else x.transpose(1, 2).contiguous().transpose(1, 2)


def dense(x: Tensor) -> tuple[Tensor, bool]:
    """``x`` in one of the two dense layouts, and whether it is channels-last."""
    if is_channels_last(x):
        return x, True
    return x.contiguous(), False


def empty_time(x: Tensor, length: int, channels_last: bool) -> Tensor:
    """An uninitialised ``[B, C, length]`` in the given layout, like ``x`` otherwise."""
    B, C, _ = x.shape
    if channels_last:
        return torch.empty(B, length, C, device=x.device, dtype=x.dtype).transpose(1, 2)
    return torch.empty(B, C, length, device=x.device, dtype=x.dtype)


def snake_beta_eager(x: Tensor, alpha: Tensor, beta: Tensor, bias: Tensor | None = None) -> Tensor:
    if bias is not None:
        x = x + bias[:, None]
    a = alpha.exp()[:, None]
    inv_b = 1.0 / (beta.exp()[:, None] + 1e-9)
    return x + inv_b * torch.sin(x * a).pow(2)


if triton is not None:

    @triton.jit
    def _channel(offs, C, L, CL: tl.constexpr):
        if CL:
            return offs % C
        return (offs // L) % C

    @triton.jit
    def snake_value(x, c, mask, alpha_ptr, beta_ptr, bias_ptr, HAS_BIAS: tl.constexpr, DTYPE: tl.constexpr):
        """snake(x + bias[c]) in fp32 from fp32 ``x``; the bias sum is rounded to DTYPE first,
        as the unfused conv-then-activation would."""
        a = tl.exp(tl.load(alpha_ptr + c, mask=mask, other=0.0).to(tl.float32))
        inv_b = 1.0 / (tl.exp(tl.load(beta_ptr + c, mask=mask, other=0.0).to(tl.float32)) + 1e-9)
        if HAS_BIAS:
            x = (x + tl.load(bias_ptr + c, mask=mask, other=0.0).to(tl.float32)).to(DTYPE).to(tl.float32)
        s = tl.sin(x * a)
        return x + inv_b * s * s

    @triton.jit
    def _snake_kernel(x_ptr, y_ptr, alpha_ptr, beta_ptr, bias_ptr, N, C, L, CL: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < N
        c = _channel(offs, C, L, CL)
        x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
        y = snake_value(x, c, mask, alpha_ptr, beta_ptr, bias_ptr, HAS_BIAS, y_ptr.dtype.element_ty)
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _residual_kernel(x_ptr, h_ptr, bias_ptr, y_ptr, N, C, L, CL: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < N
        c = _channel(offs, C, L, CL)
        b = tl.load(bias_ptr + c, mask=mask, other=0.0).to(tl.float32)
        h = (tl.load(h_ptr + offs, mask=mask).to(tl.float32) + b).to(h_ptr.dtype.element_ty).to(tl.float32)
        x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
        tl.store(y_ptr + offs, (x + h).to(y_ptr.dtype.element_ty), mask=mask)


def snake_beta(x: Tensor, alpha: Tensor, beta: Tensor, bias: Tensor | None = None) -> Tensor:
    """``snake(x + bias)`` over [B, C, L] with per-channel alpha, beta (logs) and optional bias:
    ``x + sin(x * e^alpha)^2 / (e^beta + 1e-9)``. Keeps ``x``'s layout."""
    if not fused(x):
        return snake_beta_eager(x, alpha, beta, bias)
    x, cl = dense(x)
    y = torch.empty_like(x)
    N = x.numel()
    _snake_kernel[(triton.cdiv(N, BLOCK),)](
        x, y, alpha, beta, bias if bias is not None else alpha, N, x.shape[1], x.shape[2], CL=cl, HAS_BIAS=bias is not None, BLOCK=BLOCK
    )
    return y


def residual_add(x: Tensor, h: Tensor, bias: Tensor) -> Tensor:
    """``x + (h + bias)`` per channel, rounded like the unfused ops. Keeps ``x``'s layout."""
    if not fused(x):
        return x + (h + bias[:, None])
    x, cl = dense(x)
    h = to_layout(h, cl)  # the kernel walks both in x's memory order
    y = torch.empty_like(x)
    N = x.numel()
    _residual_kernel[(triton.cdiv(N, BLOCK),)](x, h, bias, y, N, x.shape[1], x.shape[2], CL=cl, BLOCK=BLOCK)
    return y
