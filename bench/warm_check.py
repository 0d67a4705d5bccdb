"""Graphs captured while serving (engine/warmup.py), checked on a GPU.

An async engine with ``graph_capture="background"`` decodes streams (with and without a 72-frame
prefix, chunks of 1 then 25 frames) from its first moment, while its graphs are warmed and
captured, then again once it is ready. Every stream's audio is compared with the same stream
decoded by an eager engine over the same model: worst error over peak, during warm-up and
after. Prints when the first audio came (from the build's start), when every graph was in, the
fallbacks by reason, and the graph pool. ``python3 bench/warm_check.py [dtype] [streams]``;
``CUDNN_BENCHMARK=0``: cuDNN picks its algorithms by heuristics instead of timing them (the
A/B for the float32 warm-up's slow large shapes, BENCHMARKS.md "From a cold start").
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import numpy as np
import torch

from code2wav.engine.async_engine import AsyncEngine
from code2wav.engine.build import EngineConfig, build_async_engine, build_engine, load_model
from code2wav.engine.graphs import use_expandable_segments
from code2wav.model.loading import configure_cuda


async def streams(eng, codes: list[np.ndarray], prefix: int, t0: float, firsts: list[float]) -> list[torch.Tensor]:
    async def one(i: int) -> torch.Tensor:
        c, pre = codes[i], prefix if i % 2 else 0
        rid = f"w{i}-{time.perf_counter()}"
        await eng.open(rid, c[:pre] if pre else None)
        out, at = [], pre
        for n in [1] + [25] * ((len(c) - pre - 1) // 25):
            out.append((await eng.push(rid, c[at : at + n])).float().cpu())
            if not firsts:
                firsts.append(time.perf_counter() - t0)
            at += n
        await eng.finish(rid)
        return torch.cat(out)

    return list(await asyncio.gather(*(one(i) for i in range(len(codes)))))


def main() -> int:
    dtype = sys.argv[1] if len(sys.argv) > 1 else "float32"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    use_expandable_segments()
    configure_cuda(getattr(torch, dtype))
    if os.environ.get("CUDNN_BENCHMARK") == "0":  # cuDNN's heuristic choice: no algorithm timed
        torch.backends.cudnn.benchmark = False
    cfg = EngineConfig(device="cuda", dtype=dtype, max_streams=2 * n, graph_capture="background")
    model = load_model(cfg)
    rng = np.random.default_rng(0)
    codes = [rng.integers(0, 2048, (72 + 101, 16)) for _ in range(n)]
    eager = build_engine(EngineConfig(device="cuda", dtype=dtype, max_streams=2 * n, graphs=False), model=model)
    async def reference() -> list[torch.Tensor]:
        async with AsyncEngine(eager) as eng:
            return await streams(eng, codes, 72, time.perf_counter(), [])

    t = time.perf_counter()
    ref = asyncio.run(reference())
    print(f"eager reference decoded in {time.perf_counter() - t:.1f} s", flush=True)
    peak = max(float(r.abs().max()) for r in ref)
    err = lambda got: max(float((g - r).abs().max()) for g, r in zip(got, ref)) / peak  # noqa: E731
    t0 = time.perf_counter()
    warm = build_async_engine(cfg, model=model)
    firsts: list[float] = []

    async def run() -> tuple[list[torch.Tensor], list[torch.Tensor], float | None]:
        async with warm as eng:
            during = await streams(eng, codes, 72, t0, firsts)
            state_after_first = eng.warmup.status()
            print(f"first batch decoded {time.perf_counter() - t0:.1f} s after the build began; worst error / peak vs eager "
                  f"{err(during):.2e}; {state_after_first}", flush=True)
            last = time.perf_counter()
            while eng.warmup.state == "warming":
                await asyncio.sleep(0.05)
                if time.perf_counter() - last > 15:
                    last = time.perf_counter()
                    print(f"  {last - t0:.0f} s: {eng.warmup.status()}", flush=True)
            print("warming when the first batch ended:", state_after_first)
            return during, await streams(eng, codes, 72, t0, []), eng.warmup.seconds

    during, after, ready_s = asyncio.run(run())
    stats = warm.engine.runner_stats()
    print(f"first audio {firsts[0]:.2f} s after the build began; every graph in after {ready_s:.1f} s; {warm.warmup.status()}")
    print(f"worst error / peak vs eager: while warming {err(during):.2e}, once ready {err(after):.2e}")
    print(f"fallbacks {stats['fallbacks']}; replays {stats['hits']}; graph pool {stats['pool_bytes'] / 2**20:.0f} MiB")
    ok = err(during) <= 1e-4 and err(after) <= 1e-4 and not warm.warmup.failed
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
