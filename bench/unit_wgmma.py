"""The Hopper residual unit (``code2wav/kernels/unit_wgmma.py``, Gluon) against the Triton
one-kernel unit (``kernels/unit_conv.py``, today's tiles) on the GPU, per dilation and step
shape: the kernel alone, graph-replayed (us), their outputs' largest difference, and each one's
bf16 error against a float32 unit (SNR). Shapes include a sample count no tile divides and a
zero-padded history concat. argv: [widths, default 96] [dtype, default bfloat16]
"""

from __future__ import annotations

import sys

import torch
from gpu_timing import timed_in_graph  # bench/ is the script's directory, first on sys.path
from unit_conv import SPF, kernel_args, unit_pair
from unit_tail import snr

from code2wav.kernels import unit_conv, unit_wgmma
from code2wav.kernels.snake import to_layout

SHAPES = ((1, 1), (4, 1), (16, 1), (1, 25), (4, 25), (16, 25), (20, 25))


def main() -> int:
    args = sys.argv[1:]
    widths = [int(c) for c in (args[0] if args else "96").split(",")]
    dtype = getattr(torch, args[1] if len(args) > 1 else "bfloat16")
    torch.backends.cudnn.allow_tf32 = False  # the float32 reference stays float32
    g = torch.Generator().manual_seed(0)
    bad = 0
    print(f"{dtype}; us per unit kernel, graph-replayed (the history concat not included)")
    print(f"{'C':>4}{'d':>3}{'shape':>8}{'samples':>9}{'triton':>9}{'gluon':>9}{'gain':>7}{'max |diff|':>12}   SNR dB vs fp32 (triton / gluon)")
    for C in widths:
        for d in (1, 3, 9):
            ru32, ru = unit_pair(C, d, dtype, g)
            for r, f in list(SHAPES) + [(3, 0.37)]:  # 0.37 frames: a sample count no tile divides
                L = int(f * SPF[C])
                x32 = to_layout(torch.randn(r, C, L, device="cuda"), True)
                x = x32.to(dtype)
                a = kernel_args(ru, x)
                if f == 0.37:  # a concat longer than the conv reads (a folded conv's padding)
                    a = (torch.nn.functional.pad(a[0].transpose(1, 2), (0, 0, 0, 5)).transpose(1, 2), *a[1:])
                with torch.no_grad():
                    ref = ru32(x32)
                    y_t = unit_conv.unit_conv(*a)
                    y_g = unit_wgmma.unit_wgmma(*a)
                    us_t = timed_in_graph(lambda: unit_conv.unit_conv(*a), calls=10, replays=5)
                    us_g = timed_in_graph(lambda: unit_wgmma.unit_wgmma(*a), calls=10, replays=5)
                diff = (y_t.float() - y_g.float()).abs().max().item()
                s_t, s_g = snr(ref, y_t), snr(ref, y_g)
                ok = s_g > s_t - 0.5 and torch.isfinite(y_g).all().item()
                bad += not ok
                print(f"{C:>4}{d:>3}{f'{r}x{f}':>8}{r * L:>9}{us_t:>9.1f}{us_g:>9.1f}{us_t / us_g:>6.2f}x{diff:>12.3e}   "
                      f"{s_t:.1f} / {s_g:.1f}{'' if ok else '  FAIL'}", flush=True)
    print("SUMMARY", "FAIL" if bad else "PASS", f"({bad} shapes off)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
