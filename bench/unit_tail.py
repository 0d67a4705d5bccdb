"""The residual unit's fused tail (``code2wav/kernels/unit.py``) against the ops it replaces, on
the GPU: per decoder block (its channels and samples per frame), a whole unit's time with and
without the fused tail, a sweep of the tail kernel's tiles (``unit.Tiles``: rows, output
channels and K slice per program, warps, stages), and the bf16 error of both against a float32
unit. argv: [rows x frames per step, default 16x25] [dtype, default bfloat16] [--compile-only
I/N: compile the I-th of N shares of the sweep and exit, so N processes fill Triton's on-disk
cache side by side before the timed run].
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from dataclasses import replace

import torch
from gpu_timing import timed  # bench/ is the script's directory, first on sys.path

from code2wav.kernels import unit
from code2wav.kernels.snake import residual_add, to_layout
from code2wav.model.layers import ResidualUnit, channels_last_

BLOCKS = ((768, 32), (384, 160), (192, 640), (96, 1920))  # (channels, samples per frame) of the decoder blocks


def sweep_tiles(C: int) -> list[unit.Tiles]:
    """The tilings tried at ``C`` channels: accumulators of at most 32k fp32 elements; and, on
    the two best plain tilings of session 14's first sweep (``LEADERS``), the residual loaded
    early. (A persistent form, each program looping over tiles at 1, 2 or 4 programs per SM,
    was slower everywhere in session 14's second sweep and is gone.)"""
    widths = [n for n in (64, 128, 256) if n <= unit.triton.next_power_of_2(C)]
    out = []
    for bn, bm, bk, (w, st) in itertools.product(widths, (64, 128), (32, 64), ((4, 2), (4, 4), (8, 2), (8, 4))):
        if C % bk == 0 and bm * bn <= 32768:
            out.append(unit.Tiles(bm, bn, bk, w, st))
    for lead in LEADERS.get(C, ()):
        base = unit.Tiles(*lead)
        out.append(replace(base, early_x=True))
    return out


# (block_m, block_n, block_k, warps, stages): the two best plain tilings per width, session 14 call 1
LEADERS = {768: ((64, 256, 32, 4, 4), (64, 256, 64, 4, 2)), 384: ((128, 128, 32, 4, 4), (64, 128, 32, 4, 4)),
           192: ((64, 256, 32, 4, 4), (64, 256, 64, 4, 2)), 96: ((64, 128, 32, 4, 4), (128, 128, 32, 4, 4))}


def timed_sweep(C: int, run: Callable[[unit.Tiles], object]) -> dict[unit.Tiles, float]:
    """``run(tile)``'s time in us for each of ``sweep_tiles(C)``; inf where a tile cannot run."""
    sweep = {}
    for tile in sweep_tiles(C):
        try:
            sweep[tile] = timed(lambda: run(tile))  # noqa: B023
        except Exception as e:  # out of shared memory / registers for this tile
            sweep[tile] = float("inf")
            print(f"  tile {tile}: {type(e).__name__}")
    return sweep


def print_ranked(sweep: dict[unit.Tiles, float], n: int = 5) -> None:
    """The ``n`` fastest tiles of a ``timed_sweep``, one a line."""
    for tile in sorted(sweep, key=sweep.get)[:n]:
        print(f"      {sweep[tile]:7.1f} us  {tile}")


def snr(ref: torch.Tensor, y: torch.Tensor) -> float:
    ref, y = ref.double(), y.double()
    return (10 * torch.log10(ref.pow(2).mean() / (y - ref).pow(2).mean())).item()


def main() -> int:
    args = sys.argv[1:]
    share = None
    if "--compile-only" in args:
        i = args.index("--compile-only")
        share = tuple(int(v) for v in args[i + 1].split("/"))
        del args[i : i + 2]
    rows, frames = (int(v) for v in (args[0] if args else "16x25").split("x"))
    dtype = getattr(torch, args[1] if len(args) > 1 else "bfloat16")
    unit.ACC_ELEMENTS = 32768  # the sweep's own bound (sweep_tiles); the kernel's default is 16k
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False  # the float32 reference stays float32
    g = torch.Generator().manual_seed(0)
    real_applies = unit.applies
    if share is not None:  # compile this share of the sweep (one call each) and stop
        jobs = [(C, spf, t) for C, spf in BLOCKS for t in sweep_tiles(C)][share[0] :: share[1]]
        for C, spf, t in jobs:
            x = to_layout(torch.randn(rows, C, frames * spf, device="cuda", dtype=dtype), True)
            p = torch.randn(C, device="cuda", dtype=dtype)
            unit.unit_tail(x, x, torch.randn(C, C, 1, device="cuda", dtype=dtype), p, p, p, p, tiles=t)
        torch.cuda.synchronize()
        print(f"compiled {len(jobs)} tilings")
        return 0
    print(f"{dtype}, {rows} rows x {frames} frames; times in us per residual unit (dilation 9)")
    print(f"{'C':>5}{'L':>7}{'unfused':>9}{'fused':>9}{'gain':>7}   best tiles   SNR dB unfused / fused vs fp32")
    for C, spf in BLOCKS:
        L = frames * spf
        ru32 = ResidualUnit(C, 9, rate=spf)
        with torch.no_grad():
            for p in ru32.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 / p.shape[1] ** 0.5 if p.dim() == 3 else 0.3))
        ru32 = ru32.cuda().eval().requires_grad_(False)
        for mod in (ru32.conv1, ru32.conv2):
            channels_last_(mod.conv)
        ru = ResidualUnit(C, 9, rate=spf).cuda().to(dtype).eval().requires_grad_(False)
        ru.load_state_dict(ru32.state_dict())
        for mod in (ru.conv1, ru.conv2):
            channels_last_(mod.conv)
        x32 = to_layout(torch.randn(rows, C, L, device="cuda"), True)
        x = x32.to(dtype)
        with torch.no_grad():
            ref = ru32(x32)
            out = {}
            us = {}
            for name, on in (("unfused", False), ("fused", True)):
                unit.applies = real_applies if on else (lambda x, h: False)
                out[name] = ru(x)
                us[name] = timed(lambda: ru(x))
            unit.applies = real_applies
            h = ru.conv1(x, None, add_bias=False, act=ru.act1)
            args = (h, x, ru.conv2.conv.weight, ru.conv1.conv.bias, ru.act2.alpha, ru.act2.beta, ru.conv2.conv.bias)
            # What the fused kernel replaces: SnakeBeta, cuDNN's 1x1 conv, the residual add.
            ops_tail = timed(lambda: residual_add(x, ru.conv2(ru.act2(h, bias=ru.conv1.conv.bias), None, add_bias=False), ru.conv2.conv.bias))
            sweep = timed_sweep(C, lambda tile: unit.unit_tail(*args, tiles=tile))
            default_tail = timed(lambda: unit.unit_tail(*args))
        ranked = sorted(sweep, key=sweep.get)
        best = ranked[0]
        moved = 3 * rows * L * C * x.element_size() / 1e3  # h and x read, y written, in kB: kB/us = GB/s
        print(f"{C:>5}{L:>7}{us['unfused']:>9.1f}{us['fused']:>9.1f}{us['unfused'] / us['fused']:>6.2f}x"
              f"   tail {sweep[best]:.1f} us ({moved / sweep[best]:.0f} GB/s), default {unit.tiles_for(C)} {default_tail:.1f},"
              f" separate ops {ops_tail:.1f}   {snr(ref, out['unfused']):.1f} / {snr(ref, out['fused']):.1f}", flush=True)
        print_ranked(sweep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
