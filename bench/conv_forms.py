"""Two forms of the residual units' dilated k=7 convs on the GPU, and cuDNN's algorithm search.

The decoder's dilated conv (dilation d) runs today as a 2-D conv over ``[B, C, 1, L]`` with a
``(1, 7)`` kernel dilated ``(1, d)``, for which cuDNN may not have its best kernels. The same
conv is a plain ``(7, 1)`` conv over ``[B, C, L/d, d]``: sample ``t = i*d + j``
sits at row ``i``, column ``j``, and a channels-last ``[B, L, C]`` tensor already has that layout,
so the view costs nothing (``L`` padded up to a multiple of ``d``; the padding only feeds outputs
past the end, which are dropped). Undilated kernels may be faster, at the cost of that
padding (and a channels-last input). This times both forms per decoder block and dilation,
with cuDNN's default search (``benchmark_limit`` 10) and the full one (0), and checks the two
forms agree; the figures are in BENCHMARKS.md.

argv: [rows x frames, default 16x25] [dtype, default bfloat16]. Output: a table, times in us.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from gpu_timing import timed  # bench/ is the script's directory, first on sys.path

BLOCKS = ((768, 32), (384, 160), (192, 640), (96, 1920))  # (channels, samples per frame)


def dilated(x: torch.Tensor, w: torch.Tensor, d: int) -> torch.Tensor:
    """Today's form: [B, C, Lt] channels-last -> [B, C, Lt - 6d]."""
    return F.conv2d(x.unsqueeze(2), w.unsqueeze(2), dilation=(1, d)).squeeze(2)


def folded(x: torch.Tensor, w4: torch.Tensor, d: int) -> torch.Tensor:
    """The same conv as an undilated (7, 1) conv over [B, C, Lt/d, d] (Lt a multiple of d)."""
    B, C, Lt = x.shape
    x4 = x.as_strided((B, C, Lt // d, d), (Lt * C, 1, d * C, C))  # channels-last NHWC view, no copy
    y = F.conv2d(x4, w4)  # [B, C, Lt/d - 6, d], channels-last
    return y.permute(0, 2, 3, 1).reshape(B, -1, C).transpose(1, 2)  # a view when y is channels-last


def main() -> int:
    rows, frames = (int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "16x25").split("x"))
    dtype = getattr(torch, sys.argv[2] if len(sys.argv) > 2 else "bfloat16")
    torch.backends.cudnn.benchmark = True
    g = torch.Generator().manual_seed(0)
    print(f"{dtype}, {rows} rows x {frames} frames; us per conv (k=7); limit = cuDNN benchmark_limit")
    print(f"{'C':>5}{'d':>3}{'L':>7}{'dilated l10':>13}{'folded l10':>12}{'dilated l0':>12}{'folded l0':>11}{'max |diff|':>12}")
    for C, spf in BLOCKS:
        for d in (1, 3, 9):
            L = frames * spf
            Lt = -(-(L + 6 * d) // d) * d  # history + new samples, rounded up to a multiple of d
            x = torch.randn(rows, Lt, C, generator=g).to("cuda", dtype).transpose(1, 2)  # channels-last [B, C, Lt]
            w = (torch.randn(C, C, 7, generator=g) / (7 * C) ** 0.5).to("cuda", dtype)
            w = w.transpose(1, 2).contiguous().transpose(1, 2)  # stored [out, k, in], as the model keeps it
            w4 = w.unsqueeze(3).contiguous(memory_format=torch.channels_last)  # [C, C, 7, 1]
            res = {}
            with torch.no_grad():
                for limit in (10, 0):
                    torch.backends.cudnn.benchmark_limit = limit
                    res[f"dilated l{limit}"] = timed(lambda: dilated(x, w, d))
                    res[f"folded l{limit}"] = timed(lambda: folded(x, w4, d))
                a = dilated(x, w, d)[..., :L].float()
                b = folded(x, w4, d)[..., :L].float()
            diff = (a - b).abs().max().item()
            print(f"{C:>5}{d:>3}{L:>7}{res['dilated l10']:>13.1f}{res['folded l10']:>12.1f}{res['dilated l0']:>12.1f}"
                  f"{res['folded l0']:>11.1f}{diff:>12.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
