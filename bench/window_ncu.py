"""The 96-channel window unit (kernels/unit_window.py) alone under Nsight Compute, as the step
runs it: reading its history from a pool, 16 x 25 frames, at dilation 1 and 9, each twice (the
first compiles). argv: [dilations, default 1,9] [rows x frames, default 16x25].
Run as: ncu --clock-control none -k unit_window ... python3 bench/window_ncu.py
"""

from __future__ import annotations

import sys

import torch
from unit_window import SPF, bf16, history, packed, weights  # bench/ is the script's directory, first on sys.path

from code2wav.kernels import unit_window


def main() -> int:
    dilations = [int(d) for d in (sys.argv[1] if len(sys.argv) > 1 else "1,9").split(",")]
    B, T = (int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "16x25").split("x"))
    wpack, params = packed(bf16(weights()))
    x = torch.randn(B, T * SPF, unit_window.C, device="cuda").to(torch.bfloat16).transpose(1, 2)
    for d in dilations:
        pool, slots, n_new = history(B, T * SPF, d, SPF)
        for _ in range(2):
            unit_window.unit_window(x, wpack, params, d, pool=pool, slots=slots, n_new=n_new, rate=SPF)
        torch.cuda.synchronize()
        print(f"d={d}, {B} x {T} frames: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
