"""The first packet at one stream with freed slots zeroed at every end of a stream (the worker
woken for one slot while the next stream opens: ``StatePool.reset_batch = 1``, as before
session 19) and in batches (the default), on one engine: the sustained workload at one stream
(``code2wav.bench``'s, 101 frames in chunks of 1 then 25, the next stream opened as the last
one finishes), alternating, each run its own seconds. Prints each run's TTFP p50 / p99, x RT.
argv: [runs per setting, default 4] [seconds per run, default 3]."""

from __future__ import annotations

import asyncio
import statistics
import sys
from dataclasses import replace

import torch

from code2wav.bench import _workload, engine_for
from code2wav.engine.build import EngineConfig, load_model
from code2wav.engine.graphs import use_expandable_segments


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    use_expandable_segments()
    cuda = torch.cuda.is_available()
    base = EngineConfig(device="cuda" if cuda else "cpu", dtype="bfloat16" if cuda else "float32")
    model = load_model(base)
    core = engine_for(model, "exact-graph" if cuda else "exact-eager", replace(base, max_streams=256, max_step_frames=32))
    default = core.pool.reset_batch
    asyncio.run(_workload(core, 4, 30, [1, 25], 0, 0.0, seed=99))  # warm-up
    got: dict[int, list[float]] = {1: [], default: []}
    for run in range(runs):
        for batch in (1, default):
            core.pool.reset_batch = batch
            m = asyncio.run(_workload(core, 1, 101, [1, 25], 0, 0.002, seed=run, seconds=seconds))
            p50, p99 = (sorted(m.ttfp)[int(q * (len(m.ttfp) - 1))] * 1e3 for q in (0.5, 0.99))
            got[batch].append(p50)
            print(f"run {run} reset_batch {batch:>3}: TTFP p50 {p50:.3f} ms, p99 {p99:.3f} ms, "
                  f"{m.samples / core.cfg.sample_rate / m.wall:.0f}x RT, {m.streams} streams", flush=True)
    for batch, p50s in got.items():
        print(f"reset_batch {batch:>3}: TTFP p50 median of runs {statistics.median(p50s):.3f} ms ({', '.join(f'{x:.3f}' for x in p50s)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
