"""The conv stack's memory-bound kernels (history concat with SnakeBeta, SnakeBeta, residual add)
at each decoder block's shape, against a plain copy of the same bytes, over a sweep of their tile
settings (elements per program, channel-tile cap, warps). Prints us and GB/s per shape and
setting, then the setting with the least total time over the shapes.
argv: [rows x frames per step, default 16x25] [dtype, default bfloat16]."""

from __future__ import annotations

import itertools
import sys

import torch
from gpu_timing import timed  # bench/ is the script's directory, first on sys.path

from code2wav.kernels import snake
from code2wav.kernels.history import history_cat
from code2wav.kernels.snake import residual_add, snake_beta, to_layout

# (channels, samples per frame, dilation) of the residual units' k=7 conv inputs, blocks 1-4
SHAPES = ((768, 32, 9), (384, 160, 9), (192, 640, 9), (96, 1920, 9))


def main() -> int:
    rows, frames = (int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "16x25").split("x"))
    dtype = getattr(torch, sys.argv[2] if len(sys.argv) > 2 else "bfloat16")
    g = torch.Generator(device="cuda").manual_seed(0)
    default = (snake.BLOCK, snake.MAX_TILE_EDGE, snake.NUM_WARPS)
    cases = []
    for C, spf, d in SHAPES:
        L, H = frames * spf, 6 * d
        x = to_layout(torch.randn(rows, C, L, device="cuda", generator=g).to(dtype), True)
        h = to_layout(torch.randn(rows, C, L, device="cuda", generator=g).to(dtype), True)
        pool = torch.randn(rows, C, H, device="cuda", generator=g).to(dtype)
        slots = torch.arange(rows, device="cuda")
        alpha, beta, bias = (torch.randn(C, device="cuda", generator=g) * 0.3 for _ in range(3))
        T = -(-(H + L) // d) * d
        elem = x.element_size()
        cases += [
            (f"cat {C}x{L}", (rows * C * (L + H + T)) * elem,
             lambda x=x, pool=pool, slots=slots, a=alpha, b=beta, H=H, d=d: history_cat(x, H, pool, slots, (a, b), None, d)),
            (f"snake {C}x{L}", 2 * x.numel() * elem, lambda x=x, a=alpha, b=beta, c=bias: snake_beta(x, a, b, c)),
            (f"resid {C}x{L}", 3 * x.numel() * elem, lambda x=x, h=h, c=bias: residual_add(x, h, c)),
        ]
        y = torch.empty_like(x)
        copy_us = timed(lambda: y.copy_(x))
        print(f"{C}x{L}: copy of {2 * x.numel() * elem / 1e6:.0f} MB {copy_us:.1f} us = {2 * x.numel() * elem / copy_us / 1e3:.0f} GB/s", flush=True)
    settings = list(itertools.product((2048, 4096, 8192), (32, 64, 128), (4, 8)))
    totals = {}
    print(f"{'BLOCK':>6}{'c cap':>6}{'warps':>6}  " + "  ".join(f"{name:>22}" for name, _, _ in cases))
    for block, cap, warps in settings:
        snake.BLOCK, snake.MAX_TILE_EDGE, snake.NUM_WARPS = block, (256, cap), warps
        us = [timed(fn) for _, _, fn in cases]
        totals[(block, cap, warps)] = sum(us)
        cells = "  ".join(f"{u:>9.1f}us {b / u / 1e3:>6.0f}GB/s" for u, (_, b, _) in zip(us, cases))
        print(f"{block:>6}{cap:>6}{warps:>6}  {cells}", flush=True)
    snake.BLOCK, snake.MAX_TILE_EDGE, snake.NUM_WARPS = default
    best = min(totals, key=totals.get)
    now = (default[0], default[1][1], default[2])
    print(f"best (BLOCK, channel cap, warps) {best}: {totals[best]:.0f} us over the shapes; default {now}: {totals[now]:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
