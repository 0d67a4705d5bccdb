"""The 384- and 768-channel units' tail after SnakeBeta (``LayerChoices.wide_tail``) on the GPU:
cuDNN's 1x1 conv and the residual add kernel against kernels/unit.py's GEMM on the activated
input (``unit_tail`` with no SnakeBeta), over bench/unit_tail.py's sweep of its tiles, and the
largest difference between the two. argv: [rows x frames per step, default 16x25] [dtype,
default bfloat16].
"""

from __future__ import annotations

import sys

import torch
from gpu_timing import timed  # bench/ is the script's directory, first on sys.path
from unit_tail import print_ranked, timed_sweep

from code2wav.kernels import unit
from code2wav.kernels.snake import residual_add, to_layout
from code2wav.model.layers import CausalConv1d, channels_last_

BLOCKS = ((768, 32), (384, 160))  # (channels, samples per frame): the blocks the fused tail leaves


def main() -> int:
    rows, frames = (int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "16x25").split("x"))
    dtype = getattr(torch, sys.argv[2] if len(sys.argv) > 2 else "bfloat16")
    unit.ACC_ELEMENTS = 32768  # the sweep's own bound (sweep_tiles); the kernel's default is 16k
    torch.backends.cudnn.benchmark = True
    g = torch.Generator().manual_seed(0)
    print(f"{dtype}, {rows} rows x {frames} frames; us per unit's tail after SnakeBeta")
    for C, spf in BLOCKS:
        L = frames * spf
        conv2 = CausalConv1d(C, C, 1).cuda().to(dtype).eval().requires_grad_(False)
        channels_last_(conv2.conv)
        s, x = (to_layout(torch.randn(rows, C, L, generator=g).to(dtype).cuda(), True) for _ in range(2))
        w, b = conv2.conv.weight, conv2.conv.bias
        with torch.no_grad():
            ref = residual_add(x, conv2(s, None, add_bias=False), b)
            ops = timed(lambda: residual_add(x, conv2(s, None, add_bias=False), b))  # noqa: B023
            diff = (unit.unit_tail(s, x, w, None, None, None, b).float() - ref.float()).abs().max().item()
            sweep = timed_sweep(C, lambda tile: unit.unit_tail(s, x, w, None, None, None, b, tiles=tile))  # noqa: B023
            default = timed(lambda: unit.unit_tail(s, x, w, None, None, None, b))  # noqa: B023
        print(f"{C:>5} x {L}: 1x1 conv + residual add {ops:.1f}; the GEMM at its default tiles {default:.1f} "
              f"(max difference {diff:.3g}, peak {ref.float().abs().max().item():.3g}); best:", flush=True)
        print_ranked(sweep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
