"""A residual unit as one kernel after its history concat (``code2wav/kernels/unit_conv.py``)
against today's two launches (cuDNN's dilated conv, then kernels/unit.py's fused tail), on the
GPU: a sweep of the kernel's tiles (``unit_conv.ConvTiles``) at 16 x 25 frames per width, then,
with the best tile, a whole unit's graph-replayed time both ways at several step shapes (where
the one kernel starts to win: ``LayerChoices.unit_conv_rows``), and the bf16 error of both
against a float32 unit. argv: [widths, default 96,192] [dtype, default bfloat16]
[--compile-only I/N: compile the I-th of N shares of the sweep and exit, so N processes fill
Triton's on-disk cache side by side before the timed run] [--tiles-out FILE: the best tiles per
width as JSON, ``{C: [block_m, block_k, warps, stages, form]}``].
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from dataclasses import astuple, replace

import torch
from gpu_timing import ranked_tiles, sweep_options, timed_in_graph  # bench/ is the script's directory, first on sys.path
from unit_tail import snr

from code2wav.kernels import unit_conv
from code2wav.kernels.snake import to_layout
from code2wav.model.choices import LayerChoices
from code2wav.model.layers import ResidualUnit, channels_last_

SPF = {768: 32, 384: 160, 192: 640, 96: 1920}  # samples per frame at each block's width
SWEEP_SHAPE = (16, 25)  # rows x frames: the shape a 256-stream load runs most
SHAPES = ((1, 1), (4, 1), (16, 1), (1, 25), (4, 25), (8, 25), (16, 25))


# Session 15 call 1's five best samples-form tilings (block_m, block_k, warps, stages) at 96 and
# 192 channels (the residual loaded before the K loop was never among the best: gone).
SAMPLES_LEADERS = ((128, 32, 4, 3), (128, 32, 4, 4), (64, 32, 4, 4), (64, 64, 4, 3), (128, 64, 8, 4))


def sweep_tiles(C: int) -> list[unit_conv.ConvTiles]:
    """Both forms' tilings at ``C`` channels: the samples form's leaders, and the channels form
    over rows, K slices, warps and stages with an accumulator of at most 32k fp32 elements.
    With ``UNIT_CONV_SWEEP=tma`` in the environment: each of them with ``tma=True``, beside
    today's tiles of that width (``unit_conv.TILES``) as they are. With ``UNIT_CONV_SWEEP=tmaw``:
    each with the weights through descriptors (``tma_w``), with the windows too, and (8 warps:
    Triton 3.6's Hopper warp specialization asserted at 4) both warp-specialized (``ws``);
    ``tmaw-only`` and ``ws-only`` take one of the two groups. With ``UNIT_CONV_SWEEP=ksteps``:
    today's tiles and K steps of a whole or half tap (``k_steps``)."""
    out = [unit_conv.ConvTiles(*t) for t in SAMPLES_LEADERS if C % t[1] == 0]
    cp = unit_conv.triton.next_power_of_2(C)
    for bm, bk, w, st in itertools.product((64, 128, 256), (32, 64), (4, 8), (3, 4)):
        if C % bk == 0 and bm * cp <= 32768:
            out.append(unit_conv.ConvTiles(bm, bk, w, st, form="channels"))
    sweep = os.environ.get("UNIT_CONV_SWEEP")
    today = [t for t in [unit_conv.TILES.get(C)] if t is not None]
    if sweep == "ksteps":
        return today + k_steps(C)
    if sweep not in ("tma", "tmaw", "tmaw-only", "ws-only"):
        return out
    if sweep == "tma":
        return today + [replace(t, tma=True) for t in out]
    descs = [replace(t, tma_w=True) for t in out] + [replace(t, tma=True, tma_w=True) for t in out]
    ws = [replace(t, tma=True, tma_w=True, ws=True) for t in out if t.num_warps == 8]
    return today + (descs if sweep != "ws-only" else []) + (ws if sweep != "tmaw-only" else [])


def k_steps(C: int, smem: int = 220 * 1024) -> list[unit_conv.ConvTiles]:
    """Tilings whose K step is a whole tap (``block_k = C``) or half of one, in two power-of-two
    parts (96 = 64 + 32, 48 = 32 + 16, 192 = 128 + 64): a third or half the K steps of a
    power-of-two slice, so the per-step waits and barriers are paid fewer times. Those whose
    pipeline stages (``num_stages`` copies of a step's two operand tiles) fit in ``smem``."""
    cp = unit_conv.triton.next_power_of_2(C)
    out = []
    for bk, form, bm, w, st in itertools.product((C, C // 2), ("samples", "channels"), (64, 128, 256), (4, 8), (2, 3, 4)):
        t = unit_conv.ConvTiles(bm, bk, w, st, form)
        stage = 2 * bk * (bm + (C if form == "samples" else cp))
        acc = bm * (C if form == "samples" else cp)
        if unit_conv.computes(C, t) and st * stage <= smem and acc <= 32768 and not (w == 4 and acc > 16384):
            out.append(t)
    return out


def unit_pair(C: int, d: int, dtype: torch.dtype, g: torch.Generator) -> tuple[ResidualUnit, ResidualUnit]:
    """A float32 unit with random weights and the same in ``dtype``, both channels-last."""
    ru32 = ResidualUnit(C, d, rate=SPF[C])
    with torch.no_grad():
        for p in ru32.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 / (p.shape[1] * p.shape[2]) ** 0.5 if p.dim() == 3 else 0.3))
    ru32 = ru32.cuda().eval().requires_grad_(False)
    ru = ResidualUnit(C, d, rate=SPF[C]).cuda().to(dtype).eval().requires_grad_(False)
    ru.load_state_dict(ru32.state_dict())
    for mod in (ru32.conv1, ru32.conv2, ru.conv1, ru.conv2):
        channels_last_(mod.conv)
    return ru32, ru


def kernel_args(ru: ResidualUnit, x: torch.Tensor) -> tuple:
    c1 = ru.conv1.conv
    xx = ru.conv1._with_history(x, None, ru.act1)
    return (xx, x, c1.weight, c1.dilation[0], c1.bias, ru.act2.alpha, ru.act2.beta, ru.conv2.conv.weight, ru.conv2.conv.bias)


def main() -> int:
    args = sys.argv[1:]
    share, tiles_out = sweep_options(args)
    widths = [int(c) for c in (args[0] if args else "96,192").split(",")]
    dtype = getattr(torch, args[1] if len(args) > 1 else "bfloat16")
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False  # the float32 reference stays float32
    g = torch.Generator().manual_seed(0)
    rows, frames = SWEEP_SHAPE
    if share is not None:
        jobs = [(C, t) for C in widths for t in sweep_tiles(C)][share[0] :: share[1]]
        done = 0
        for C, t in jobs:
            _, ru = unit_pair(C, 9, dtype, g)
            x = to_layout(torch.randn(1, C, 64, device="cuda", dtype=dtype), True)
            try:
                unit_conv.unit_conv(*kernel_args(ru, x), tiles=t)
                done += 1
            except Exception as e:  # out of shared memory / registers for this tile
                print(f"  {C} {t}: {type(e).__name__}")
        torch.cuda.synchronize()
        print(f"compiled {done} of {len(jobs)} tilings")
        return 0
    print(f"{dtype}; us per residual unit, graph-replayed")
    best_tiles = {}
    for C in widths:
        ru32, ru = unit_pair(C, 9, dtype, g)
        x = to_layout(torch.randn(rows, C, frames * SPF[C], device="cuda", dtype=dtype), True)
        args_ = kernel_args(ru, x)
        ranked, sweep = ranked_tiles(sweep_tiles(C), lambda t: unit_conv.unit_conv(*args_, tiles=t),
                                     f"=== {C} channels, {rows} x {frames} frames (L = {frames * SPF[C]}), dilation 9: the kernel alone, best five")
        best = ranked[0]
        if unit_conv.TILES.get(C) in sweep:
            print(f"      today's tiles: {sweep[unit_conv.TILES[C]]:.1f} us  {unit_conv.TILES[C]}")
        if sweep[best] == float("inf"):
            continue
        unit_conv.TILES[C] = best_tiles[C] = best
        print(f"{'d':>3}{'shape':>8}{'samples':>9}{'two launches':>14}{'one kernel':>12}{'gain':>7}   SNR dB vs fp32 (two / one)")
        for d in (1, 3, 9):
            ru32, ru = unit_pair(C, d, dtype, g)
            for r, f in SHAPES if d == 9 else (SWEEP_SHAPE,):
                x32 = to_layout(torch.randn(r, C, f * SPF[C], device="cuda"), True)
                x = x32.to(dtype)
                us, out = {}, {}
                for name, rows_min in (("two", 0), ("one", 1)):
                    ru.choices = LayerChoices(unit_conv_rows=rows_min)
                    with torch.no_grad():
                        out[name] = ru(x)
                        us[name] = timed_in_graph(lambda: ru(x), calls=10, replays=5)
                with torch.no_grad():
                    ref = ru32(x32)
                print(f"{d:>3}{f'{r}x{f}':>8}{r * f * SPF[C]:>9}{us['two']:>14.1f}{us['one']:>12.1f}{us['two'] / us['one']:>6.2f}x"
                      f"   {snr(ref, out['two']):.1f} / {snr(ref, out['one']):.1f}", flush=True)
        print(f"best tile at {C}: {best}")
    if tiles_out:
        with open(tiles_out, "w") as f:
            json.dump({C: list(astuple(t)) for C, t in best_tiles.items()}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
