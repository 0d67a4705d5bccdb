"""SnakeBeta (and the conv bias before it) as one memory pass on CUDA (Triton); eager elsewhere.

Eager SnakeBeta reads and writes the activation ~6 times (mul, sin, pow, mul, add) and the
preceding conv's bias add is one more full pass; the activation is 2.76 M elements per frame and
memory-bound, so a single read + write of ``snake(x + bias)`` is the whole win. The residual add
that closes each residual unit gets the same treatment (``x + h + bias``).

Activations ``[B, C, L]`` are either contiguous or channels-last (``[B, L, C]`` in memory, the
layout cuDNN's NHWC kernels read and write without conversions). Every kernel works on 2-D
[time, channel] tiles addressed through strides, so one kernel serves both layouts (Triton
specialises a stride of 1, so the contiguous axis is vectorised either way).
"""

from __future__ import annotations

import torch
from torch import Tensor

from code2wav.kernels import instant, pdl

try:  # Triton ships with CUDA builds of torch; CPU-only installs run the eager formula.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None

BLOCK = 2048  # elements per program (tests raise it: Triton's CPU interpreter pays per program)
NUM_WARPS = 4  # per program of the elementwise kernels here and in history.py


def fused(x: Tensor) -> bool:
    """Whether the Triton path applies: CUDA, not float64, int32-indexable, and this thread not
    running the instant forms (kernels/instant.py). (The one gate for every kernel here; tests
    swap it to run the kernels through Triton's CPU interpreter.)"""
    return triton is not None and x.is_cuda and x.dtype != torch.float64 and x.numel() < 2**31 and not instant.active()


def is_channels_last(x: Tensor) -> bool:
    """``[B, C, L]`` stored as rows of ``C`` channels, one per time step (``[B, L, C]``); rows may
    run past ``L`` (a trimmed view of a longer row-major tensor: the folded convs' outputs). A
    tensor with L == 1 or C == 1 is both layouts."""
    B, C, L = x.shape
    return x.stride()[1:] == (1, C) or (x.is_contiguous() and (L == 1 or C == 1))


def to_layout(x: Tensor, channels_last: bool) -> Tensor:
    """``x`` (same values and shape) stored channels-last or contiguous; no copy if it already is."""
    if not channels_last:
        return x.contiguous()
    return x if is_channels_last(x) else x.transpose(1, 2).contiguous().transpose(1, 2)


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


MAX_TILE_EDGE = (256, 64)  # (time, channels): the contiguous axis's cap per layout; tests raise it


def tile_shape(C: int, L: int, channels_last: bool) -> tuple[int, int]:
    """(BLOCK_L, BLOCK_C) of a program's [time, channel] tile, ~``BLOCK`` elements: wide along
    the axis that is contiguous in memory so loads and stores coalesce."""
    max_l, max_c = MAX_TILE_EDGE
    if channels_last:
        # Tiles that divide C where a power of two >= 16 does: 96 channels as three 32-wide
        # tiles, not two 64-wide ones with half of the second masked (bench/mem_kernels.py
        # times the 96-channel history concat both ways).
        exact = C & -C
        bc = min(exact if exact >= 16 else triton.next_power_of_2(C), max_c)
        return max(BLOCK // bc, 2), bc
    bl = max(min(triton.next_power_of_2(L), max_l), 2)
    return bl, max(BLOCK // bl, 2)


def fast_sin(x: Tensor) -> bool:
    """The hardware's approximate sine (abs error ~1e-6) where the output is bf16/fp16 anyway;
    float32 keeps the precise one (it is the exactness path). Not in Triton's interpreter."""
    return x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)


if triton is not None:
    from code2wav.kernels.pdl import wait_previous

    @triton.jit
    def tile(L, C, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
        """This program's [BLOCK_L, 1] times, [1, BLOCK_C] channels, and the in-bounds mask.
        Grid: (time tiles, channel tiles, rows). Index math is per tile, not per element: with
        per-element div/mod the kernels were instruction-bound at ~1/3 of memory bandwidth."""
        t = tl.program_id(0) * BLOCK_L + tl.arange(0, BLOCK_L)[:, None]
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
        return t, c, (t < L) & (c < C)

    @triton.jit
    def snake_params(alpha_ptr, beta_ptr, c, C):
        """Per-channel ``e^alpha`` and ``1 / (e^beta + 1e-9)`` for a tile's channels."""
        cm = c < C
        a = tl.exp(tl.load(alpha_ptr + c, mask=cm, other=0.0).to(tl.float32))
        inv_b = 1.0 / (tl.exp(tl.load(beta_ptr + c, mask=cm, other=0.0).to(tl.float32)) + 1e-9)
        return a, inv_b

    @triton.jit
    def snake_value(x, a, inv_b, FAST_SIN: tl.constexpr):
        """SnakeBeta of fp32 ``x`` (any bias already added, in fp32)."""
        if FAST_SIN:
            s = tl.inline_asm_elementwise("sin.approx.f32 $0, $1;", "=f,f", [x * a], dtype=tl.float32, is_pure=True, pack=1)
        else:
            s = tl.sin(x * a)
        return x + inv_b * s * s

    @triton.jit
    def _snake_kernel(x_ptr, y_ptr, alpha_ptr, beta_ptr, bias_ptr, C, L, sxb, sxc, sxt, syb, syc, syt,
                      HAS_BIAS: tl.constexpr, FAST_SIN: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr):
        wait_previous(PDL)  # before any memory access (kernels/pdl.py)
        t, c, m = tile(L, C, BLOCK_L, BLOCK_C)
        b = tl.program_id(2)
        x = tl.load(x_ptr + b * sxb + c * sxc + t * sxt, mask=m).to(tl.float32)
        if HAS_BIAS:
            x += tl.load(bias_ptr + c, mask=c < C, other=0.0).to(tl.float32)
        a, inv_b = snake_params(alpha_ptr, beta_ptr, c, C)
        y = snake_value(x, a, inv_b, FAST_SIN)
        tl.store(y_ptr + b * syb + c * syc + t * syt, y.to(y_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _residual_kernel(x_ptr, h_ptr, bias_ptr, y_ptr, C, L, sxb, sxc, sxt, shb, shc, sht, syb, syc, syt,
                         HAS_X: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr):
        wait_previous(PDL)  # before any memory access (kernels/pdl.py)
        t, c, m = tile(L, C, BLOCK_L, BLOCK_C)
        b = tl.program_id(2)
        h = tl.load(h_ptr + b * shb + c * shc + t * sht, mask=m).to(tl.float32)
        h += tl.load(bias_ptr + c, mask=c < C, other=0.0).to(tl.float32)
        if HAS_X:
            h += tl.load(x_ptr + b * sxb + c * sxc + t * sxt, mask=m).to(tl.float32)
        tl.store(y_ptr + b * syb + c * syc + t * syt, h.to(y_ptr.dtype.element_ty), mask=m)


def _grid(B: int, C: int, L: int, tile_l: int, tile_c: int) -> tuple[int, int, int]:
    return (triton.cdiv(L, tile_l), triton.cdiv(C, tile_c), B)


def snake_beta(x: Tensor, alpha: Tensor, beta: Tensor, bias: Tensor | None = None) -> Tensor:
    """``snake(x + bias)`` over [B, C, L] with per-channel alpha, beta (logs) and optional bias:
    ``x + sin(x * e^alpha)^2 / (e^beta + 1e-9)``. Keeps ``x``'s layout."""
    if not fused(x):
        return snake_beta_eager(x, alpha, beta, bias)
    B, C, L = x.shape
    cl = is_channels_last(x)
    y = empty_time(x, L, cl)
    bl, bc = tile_shape(C, L, cl)
    _snake_kernel[_grid(B, C, L, bl, bc)](
        x, y, alpha, beta, bias if bias is not None else alpha, C, L, *x.stride(), *y.stride(),
        HAS_BIAS=bias is not None, FAST_SIN=fast_sin(x), BLOCK_L=bl, BLOCK_C=bc, num_warps=NUM_WARPS, **pdl.options(x),
    )
    return y


def residual_add(x: Tensor, h: Tensor, bias: Tensor) -> Tensor:
    """``x + (h + bias)`` per channel (the sum in fp32). Keeps ``x``'s layout; ``h`` may have
    any strides."""
    if not fused(x):
        return x + (h + bias[:, None])
    B, C, L = x.shape
    cl = is_channels_last(x)
    y = empty_time(x, L, cl)
    bl, bc = tile_shape(C, L, cl)
    _residual_kernel[_grid(B, C, L, bl, bc)](x, h, bias, y, C, L, *x.stride(), *h.stride(), *y.stride(), HAS_X=True, BLOCK_L=bl, BLOCK_C=bc,
                                             num_warps=NUM_WARPS, **pdl.options(x))
    return y


def bias_add(h: Tensor, bias: Tensor) -> Tensor:
    """``h + bias`` per channel into a new dense tensor, channels-last if ``h``'s channels are
    contiguous (``h`` may be a strided view, e.g. a trimmed ConvTranspose output): the trim's
    copy and the bias in one coalesced pass."""
    if not fused(h):
        return h + bias[:, None]
    B, C, L = h.shape
    cl = h.stride(1) == 1 and C > 1
    y = empty_time(h, L, cl)
    bl, bc = tile_shape(C, L, cl)
    _residual_kernel[_grid(B, C, L, bl, bc)](h, h, bias, y, C, L, *h.stride(), *h.stride(), *y.stride(), HAS_X=False, BLOCK_L=bl, BLOCK_C=bc,
                                             num_warps=NUM_WARPS, **pdl.options(h))
    return y
