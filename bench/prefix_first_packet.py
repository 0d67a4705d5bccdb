"""Where a cached voice's first packet at one stream spends its time, beside a fresh stream's:
one engine (graphs on CUDA, the prefix cache on), streams opened one at a time, alternating a
fresh stream and one whose 200-frame prefix is cached; for each, the first one-frame push
(admission, the cache lookup and restore, the step, the audio back) and the second 25-frame one
timed on the host; the lookup and the restore alone; then the same streams under torch.profiler (the host's ops and the GPU's kernels, per kind). argv: [device,
default cuda] [pairs, default 100]. Session 35 measured a cached voice's first packet 0.28 ms
later than a fresh stream's on an H100 through code2wav.bench (BENCHMARKS.md).
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from code2wav.engine.build import EngineConfig, build_engine

PREFIX = 200


def main() -> int:
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    # As the bench builds its engine at one stream (code2wav.bench.run): one slot, 32-frame pieces.
    engine = build_engine(EngineConfig(device=device, dtype=dtype, max_streams=1, max_step_frames=32, prefix_cache_bytes=10**9))
    rng = np.random.default_rng(0)
    voice, first, second = rng.integers(0, 2048, (PREFIX, 16)), rng.integers(0, 2048, (1, 16)), rng.integers(0, 2048, (25, 16))
    n = 0

    def stream(prefix: np.ndarray | None) -> tuple[float, float]:
        """The first (1-frame) and second (25-frame) push of a new stream, ms each."""
        nonlocal n
        n += 1
        rid = f"s{n}"
        engine.open(rid, prefix)
        t0 = time.perf_counter()
        engine.push(rid, first)  # the audio comes back to the host: the step is done
        t1 = time.perf_counter()
        engine.push(rid, second)
        t2 = time.perf_counter()
        engine.finish(rid)
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3

    for _ in range(5):  # the voice enters the cache; every shape has run once
        stream(voice), stream(None)
    times: dict[str, list[tuple[float, float]]] = {"fresh": [], "cached": []}
    for _ in range(pairs):
        times["fresh"].append(stream(None))
        times["cached"].append(stream(voice))
    for i, what in enumerate(("first push", "second push")):
        f, c = (np.asarray([t[i] for t in times[k]]) for k in ("fresh", "cached"))
        print(
            f"{torch.cuda.get_device_name() if device.startswith('cuda') else device}: {what} p50 fresh "
            f"{np.median(f):.3f} ms, cached {np.median(c):.3f} ms (+{np.median(c) - np.median(f):.3f}); p90 "
            f"{np.percentile(f, 90):.3f} / {np.percentile(c, 90):.3f} ms",
            flush=True,
        )
    print(f"cache {engine.prefix_cache_stats()}", flush=True)
    cache, pool = engine.prefill.cache, engine.pool
    codes = torch.as_tensor(voice)
    state = cache.get(codes)
    for what, fn in (("cache.get", lambda: cache.get(codes)), ("pool.restore", lambda: pool.restore(0, state))):
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        sync()
        t0 = time.perf_counter()
        for _ in range(200):
            fn()
        host = (time.perf_counter() - t0) / 200 * 1e6
        sync()
        print(f"{what}: {host:.1f} us host a call, {(time.perf_counter() - t0) / 200 * 1e6:.1f} us with the device's work", flush=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    for name, prefix in (("fresh", None), ("cached", voice)):
        with profile(activities=activities) as prof:
            for _ in range(10):
                stream(prefix)
        for sort in ("self_cpu_time_total", "cuda_time_total") if device.startswith("cuda") else ("self_cpu_time_total",):
            print(f"--- {name}: 10 streams (a first and a second push), by {sort}")
            print(prof.key_averages().table(sort_by=sort, row_limit=30), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
