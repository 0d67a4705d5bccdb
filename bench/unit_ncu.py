"""The residual units of a 16 x 25 step under Nsight Compute: one unit per width at dilation 9
(96 / 192 channels: the one-kernel unit, kernels/unit_conv.py; 384: cuDNN's conv and the tail),
each run twice (the first compiles), for ``ncu -k regex:...`` to read the second launch's
counters. argv: [widths, default 96,192,384] [dtype, default bfloat16]
Run as: ncu --clock-control none -k regex:'unit_conv|sm90|xmma' ... python3 bench/unit_ncu.py
"""

from __future__ import annotations

import sys

import torch
from unit_conv import SPF, SWEEP_SHAPE, unit_pair  # bench/ is the script's directory, first on sys.path

from code2wav.kernels.snake import to_layout


def main() -> int:
    args = sys.argv[1:]
    widths = [int(c) for c in (args[0] if args else "96,192,384").split(",")]
    dtype = getattr(torch, args[1] if len(args) > 1 else "bfloat16")
    torch.backends.cudnn.benchmark = True
    g = torch.Generator().manual_seed(0)
    rows, frames = SWEEP_SHAPE
    for C in widths:
        _, ru = unit_pair(C, 9, dtype, g)
        x = to_layout(torch.randn(rows, C, frames * SPF[C], device="cuda", dtype=dtype), True)
        with torch.no_grad():
            for _ in range(2):
                ru(x)
        torch.cuda.synchronize()
        print(f"{C} channels, {rows} x {frames} frames: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
