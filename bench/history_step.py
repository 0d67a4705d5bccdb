"""Whether a step's GPU time depends on its rows' history: a first chunk's step over fresh
streams (position 0, zero state) against the same step over streams restored from a prefilled
200-frame prefix (a cached voice's first step: the transformer attends over a full window).
Graph replays, timed by CUDA events around each replay alone (the resets between replays are
outside them). argv: [dtype, default bfloat16] [replays per shape, default 200]. Output per
shape (rows x frames): mean GPU ms fresh and with history, and their ratio."""

from __future__ import annotations

import sys

import torch

from code2wav.engine.graphs import GraphRunner
from code2wav.model.config import DecoderConfig
from code2wav.model.init import random_decoder
from code2wav.model.loading import configure_cuda
from code2wav.model.low_rate import auto_low_rate
from code2wav.stream.pool import StatePool

SHAPES = [(1, 1), (16, 1), (16, 4), (64, 1)]
PREFIX = 200


def main() -> int:
    dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    configure_cuda(dtype)
    m = random_decoder(DecoderConfig()).to_dtypes(dtype, "cuda")
    auto_low_rate(m)
    m.channels_last()
    rows = max(b for b, _ in SHAPES)
    pool = StatePool(m, rows)
    for _ in range(rows):  # slots 0 .. rows - 1 in use; a "fresh" replay gives its rows back and takes them again
        pool.acquire()
    runner = GraphRunner(m, pool, batch_sizes=tuple(sorted({b for b, _ in SHAPES})), frame_sizes=(1, 4, 32), max_batch_frames=2048)
    runner.capture()
    g = torch.Generator().manual_seed(0)
    # One prefilled state (a 200-frame prefix through the step path, 32 frames at a time), copied
    # into every slot before each "history" replay, as a cache hit's restore does.
    slot0 = torch.zeros(1, dtype=torch.long)
    for at in range(0, PREFIX, 32):
        n = min(32, PREFIX - at)
        runner(torch.randint(0, 2048, (1, 16, n), generator=g), slot0, torch.full((1,), n))
    state = pool.snapshot(0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    print(f"{dtype}; a step's GPU ms, fresh rows against rows with a {PREFIX}-frame history (mean of {reps} replays)")
    print(f"{'B':>4}{'T':>4}{'fresh ms':>10}{'history ms':>12}{'ratio':>8}")
    for b, t in SHAPES:
        codes = torch.randint(0, 2048, (b, 16, t), generator=g)
        slots, n_new = torch.arange(b), torch.full((b,), t)
        ms = {}
        for form in ("fresh", "history", "fresh", "history"):  # twice each, alternating: the second pair is kept
            total = 0.0
            for _ in range(reps):
                if form == "fresh":  # as the engine makes a slot fresh for its next stream
                    for s in range(b):
                        pool.release(s)
                    pool.reset_stale()
                    assert sorted(pool.acquire() for _ in range(b)) == list(range(b))
                else:
                    for s in range(b):
                        pool.restore(s, state)
                start.record()
                runner(codes, slots, n_new)
                end.record()
                end.synchronize()
                total += start.elapsed_time(end)
            ms[form] = total / reps
        print(f"{b:>4}{t:>4}{ms['fresh']:>10.3f}{ms['history']:>12.3f}{ms['history'] / ms['fresh']:>8.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
