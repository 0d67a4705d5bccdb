"""The decoder's output conv (96 channels -> 1, k=7) on the GPU: ``kernels/mono_conv.py`` over a
sweep of its time tile and warps, against cuDNN's conv1d, at a step's shape; then the history
concat and the conv, against ``mono_conv_history`` reading the history itself (its rows per
program swept), with a pool and each row's new frames.
argv: [rows x frames per step, default 16x25] [dtype, default bfloat16]."""

from __future__ import annotations

import itertools
import sys

import torch
import torch.nn.functional as F
from gpu_timing import timed  # bench/ is the script's directory, first on sys.path

from code2wav.kernels import mono_conv
from code2wav.kernels.history import history_cat
from code2wav.kernels.snake import to_layout

C, K, SAMPLES_PER_FRAME = 96, 7, 1920


def main() -> int:
    rows, frames = (int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "16x25").split("x"))
    dtype = getattr(torch, sys.argv[2] if len(sys.argv) > 2 else "bfloat16")
    torch.backends.cudnn.benchmark = True
    L = frames * SAMPLES_PER_FRAME + K - 1
    x = to_layout(torch.randn(rows, C, L, device="cuda", dtype=dtype), True)  # the decoder's layout
    w = to_layout(torch.randn(1, C, K, device="cuda", dtype=dtype) * 0.1, True)
    b = torch.randn(1, device="cuda", dtype=dtype)
    ref = F.conv1d(x.float(), w.float(), b.float())
    read_kb = x.numel() * x.element_size() / 1e3  # kB/us = GB/s
    cudnn = timed(lambda: F.conv1d(x, w, b))
    print(f"{dtype}, {rows} x {frames} frames, [{rows}, {C}, {L}] channels-last: cuDNN conv1d {cudnn:.1f} us")
    print(f"{'block_t':>8}{'warps':>6}{'us':>9}{'GB/s':>7}{'max err':>10}")
    results = {}
    for bt, nw in itertools.product((64, 128, 256, 512), (2, 4, 8)):
        y = mono_conv.mono_conv(x, w, b, block_t=bt, num_warps=nw)
        err = (y.float() - ref).abs().max().item()
        results[bt, nw] = timed(lambda: mono_conv.mono_conv(x, w, b, block_t=bt, num_warps=nw))
        print(f"{bt:>8}{nw:>6}{results[bt, nw]:>9.1f}{read_kb / results[bt, nw]:>7.0f}{err:>10.2e}", flush=True)
    best = min(results, key=results.get)
    print(f"best {best}: {results[best]:.1f} us; default ({mono_conv.BLOCK_T}, {mono_conv.NUM_WARPS}) "
          f"{results.get((mono_conv.BLOCK_T, mono_conv.NUM_WARPS), float('nan')):.1f} us")
    reading_the_history(rows, frames, dtype)
    return 0


def reading_the_history(rows: int, frames: int, dtype: torch.dtype) -> None:
    H = K - 1
    g = torch.Generator().manual_seed(0)
    x = to_layout(torch.randn(rows, C, frames * SAMPLES_PER_FRAME, generator=g).to(dtype).cuda(), True)
    w = to_layout(torch.randn(1, C, K, generator=g).to(dtype).cuda() * 0.1, True)
    b = torch.randn(1, generator=g).to(dtype).cuda()
    act = (torch.randn(C, generator=g).cuda() * 0.3, torch.randn(C, generator=g).cuda() * 0.3)
    pool = torch.randn(rows + 1, C, H, generator=g).to(dtype).cuda()
    slots = torch.arange(rows, device="cuda")
    n_new = torch.randint(0, frames + 1, (rows,), generator=g).cuda()
    pool_ref, pool_got = pool.clone(), pool.clone()
    ref = mono_conv.mono_conv(history_cat(x, H, pool_ref, slots, act, n_new=n_new, rate=SAMPLES_PER_FRAME), w, b)
    got = mono_conv.mono_conv_history(x, w, b, 1, act, pool_got, slots, n_new, SAMPLES_PER_FRAME)
    print(f"reading the history: max difference {(got.float() - ref.float()).abs().max().item():.3g} "
          f"(peak {ref.float().abs().max().item():.3g}), pools {'the same' if torch.equal(pool_got, pool_ref) else 'DIFFER'}")
    n_new.fill_(frames)
    cat = timed(lambda: history_cat(x, H, pool, slots, act, n_new=n_new, rate=SAMPLES_PER_FRAME))
    xx = history_cat(x, H, pool, slots, act, n_new=n_new, rate=SAMPLES_PER_FRAME)
    conv = timed(lambda: mono_conv.mono_conv(xx, w, b))
    line = f"history concat {cat:.1f} + conv {conv:.1f} = {cat + conv:.1f} us; reading the history, by rows per program:"
    for block_r in (64, 128, 256):
        us = timed(lambda: mono_conv.mono_conv_history(x, w, b, 1, act, pool, slots, n_new, SAMPLES_PER_FRAME, block_r=block_r))  # noqa: B023
        line += f" {block_r}: {us:.1f} us"
    print(line + f" (default {mono_conv.BLOCK_R})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
