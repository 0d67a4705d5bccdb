"""Where a cached voice's first packet at one stream spends its time, beside a fresh stream's:
one engine (graphs on CUDA, the prefix cache on), streams opened one at a time, alternating a
fresh stream and one whose 200-frame prefix is cached; for each, the first one-frame push
(admission, the cache lookup and restore, the step, the audio back) timed on the host, then the
same under torch.profiler (the host's ops and the GPU's kernels, per kind). argv: [device,
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
    engine = build_engine(EngineConfig(device=device, dtype=dtype, max_streams=4, prefix_cache_bytes=10**9))
    rng = np.random.default_rng(0)
    voice, frame = rng.integers(0, 2048, (PREFIX, 16)), rng.integers(0, 2048, (1, 16))
    n = 0

    def first_push(prefix: np.ndarray | None) -> float:
        nonlocal n
        n += 1
        rid = f"s{n}"
        engine.open(rid, prefix)
        t0 = time.perf_counter()
        engine.push(rid, frame)  # the audio comes back to the host: the step is done
        t = time.perf_counter() - t0
        engine.finish(rid)
        return t * 1e3

    for _ in range(5):  # the voice enters the cache; every shape has run once
        first_push(voice), first_push(None)
    times: dict[str, list[float]] = {"fresh": [], "cached": []}
    for _ in range(pairs):
        times["fresh"].append(first_push(None))
        times["cached"].append(first_push(voice))
    p50 = {k: float(np.median(v)) for k, v in times.items()}
    print(f"{torch.cuda.get_device_name() if device.startswith('cuda') else device}: first push p50 fresh "
          f"{p50['fresh']:.3f} ms, cached {p50['cached']:.3f} ms (+{p50['cached'] - p50['fresh']:.3f}); p90 "
          f"{np.percentile(times['fresh'], 90):.3f} / {np.percentile(times['cached'], 90):.3f} ms; "
          f"cache {engine.prefix_cache_stats()}", flush=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    for name, prefix in (("fresh", None), ("cached", voice)):
        with profile(activities=activities) as prof:
            for _ in range(10):
                first_push(prefix)
        sort = "cuda_time_total" if device.startswith("cuda") else "cpu_time_total"
        print(f"--- {name}: 10 first pushes, by {sort}")
        print(prof.key_averages().table(sort_by=sort, row_limit=25), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
