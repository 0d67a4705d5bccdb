"""The decoder blocks' ConvTranspose upsamplers as one Triton GEMM over row pairs
(``code2wav/kernels/convt.py``) against today's two cuBLAS products, on the GPU: a sweep of the
kernel's tiles (``convt.PairTiles``) at 16 x 25 frames per block, then, with the best tile, the
layer's graph-replayed time both ways at several step shapes (where the kernel starts to win:
``LayerChoices.convt_kernel_rows``), and the bf16 error of both against a float32 layer.
argv: [dtype, default bfloat16] [--compile-only I/N: compile the I-th of N shares of the sweep
and exit, so N processes fill Triton's on-disk cache side by side before the timed run]
[--tiles-out FILE: the best tiles per input width as JSON, ``{c_in: [bm, bn, bk, warps, stages]}``,
for the widths where the kernel beat the two products at the sweep's shape (``convt.TILES``
names only those)].
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from dataclasses import astuple, replace

import torch
from gpu_timing import ranked_tiles, sweep_options, timed_in_graph  # bench/ is the script's directory, first on sys.path
from unit_tail import snr

from code2wav.kernels import convt
from code2wav.kernels.snake import to_layout
from code2wav.model.config import DecoderConfig
from code2wav.model.layers import CausalConvTranspose1d, channels_last_

SWEEP_SHAPE = (16, 25)  # rows x frames: the shape a 256-stream load runs most
SHAPES = ((1, 1), (16, 1), (1, 25), (4, 25), (16, 25), (64, 8))


def blocks() -> list[tuple[int, int, int, int]]:
    """``(c_in, c_out, stride, input samples per frame)`` of each decoder block's ConvTranspose
    in the released architecture (the pre-upsamplers before them multiply the frame rate)."""
    cfg = DecoderConfig()
    out, c, rate = [], cfg.decoder_dim, math.prod(cfg.upsampling_ratios)
    for s in cfg.upsample_rates:
        out.append((c, c // 2, s, rate))
        c, rate = c // 2, rate * s
    return out


def sweep_tiles(c_in: int) -> list[convt.PairTiles]:
    return [convt.PairTiles(bm, bn, bk, w, st) for bm, bn, bk, w, st in
            itertools.product((64, 128), (64, 128, 256), (32, 64), (4, 8), (3, 4)) if c_in % bk == 0 and bm * bn <= 32768]


def layer_pair(c_in: int, c_out: int, s: int, dtype: torch.dtype, g: torch.Generator):
    """A float32 layer with random weights and the same in ``dtype``, both channels-last."""
    l32 = CausalConvTranspose1d(c_in, c_out, 2 * s, s)
    with torch.no_grad():
        for p in l32.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 / c_in ** 0.5 if p.dim() == 3 else 0.3))
    l32 = l32.cuda().eval().requires_grad_(False)
    lh = CausalConvTranspose1d(c_in, c_out, 2 * s, s).cuda().to(dtype).eval().requires_grad_(False)
    lh.load_state_dict(l32.state_dict())
    for layer in (l32, lh):
        channels_last_(layer.conv)
        layer.fuse()
    return l32, lh


def main() -> int:
    args = sys.argv[1:]
    share, tiles_out = sweep_options(args)
    dtype = getattr(torch, args[0] if args else "bfloat16")
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference stays float32
    g = torch.Generator().manual_seed(0)
    rows_, frames = SWEEP_SHAPE
    if share is not None:
        jobs = [(b, t) for b in blocks() for t in sweep_tiles(b[0])][share[0] :: share[1]]
        for (c_in, c_out, s, _), t in jobs:
            _, lh = layer_pair(c_in, c_out, s, dtype, g)
            w = lh.conv.weight.permute(0, 2, 1).reshape(c_in, -1)
            try:
                convt.convt_pairs(torch.randn(64, c_in, device="cuda", dtype=dtype), w, lh.bias_rows, tiles=t)
            except Exception as e:  # out of shared memory / registers for this tile
                print(f"  {c_in} {t}: {type(e).__name__}")
        torch.cuda.synchronize()
        print(f"compiled {len(jobs)} tilings")
        return 0
    print(f"{dtype}; us per ConvTranspose layer ([history, new] given), graph-replayed")
    best_tiles = {}
    for c_in, c_out, s, spf in blocks():
        l32, lh = layer_pair(c_in, c_out, s, dtype, g)
        T = frames * spf + 1
        rows = torch.randn(rows_ * T, c_in, device="cuda", dtype=dtype)
        w = lh.conv.weight.permute(0, 2, 1).reshape(c_in, -1)
        title = f"=== {c_in} -> {c_out} channels, stride {s}, {rows_} x {frames} frames ({rows.shape[0]} input rows): the kernel, best five"
        ranked, sweep = ranked_tiles(sweep_tiles(c_in), lambda t: convt.convt_pairs(rows, w, lh.bias_rows, tiles=t), title)
        best = ranked[0]
        if sweep[best] == float("inf"):
            continue
        convt.TILES[c_in] = best
        print(f"{'shape':>8}{'rows':>8}{'two GEMMs':>11}{'one kernel':>12}{'gain':>7}   SNR dB vs fp32 (two / one)")
        for r, f in SHAPES:
            x32 = to_layout(torch.randn(r, c_in, f * spf + 1, device="cuda"), True)
            x = x32.to(dtype)
            us, out = {}, {}
            for name, rows_min in (("two", 0), ("one", 1)):
                lh.choices = replace(lh.choices, convt_kernel_rows=rows_min)
                out[name] = lh._as_gemm(x)
                us[name] = timed_in_graph(lambda: lh._as_gemm(x), calls=10, replays=5)
            ref = l32._as_gemm(x32)
            print(f"{f'{r}x{f}':>8}{r * (f * spf + 1):>8}{us['two']:>11.1f}{us['one']:>12.1f}{us['two'] / us['one']:>6.2f}x"
                  f"   {snr(ref, out['two']):.1f} / {snr(ref, out['one']):.1f}", flush=True)
            if (r, f) == SWEEP_SHAPE and us["one"] < us["two"]:
                best_tiles[c_in] = best
        print(f"best tile at {c_in}: {best}; {'the kernel' if c_in in best_tiles else 'the two products'} at {c_in} channels")
    if tiles_out:
        with open(tiles_out, "w") as f:
            json.dump({c: list(astuple(t)) for c, t in best_tiles.items()}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
