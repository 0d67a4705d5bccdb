"""Where a lone stream's first packet spends its time: one stream at a time pushes one frame
through the async engine (graphs of the 1- and 25-frame steps only, so capture is quick), and
each push is stamped at submit, step entry, runner entry, replay launched, audio handed over on
the worker, and the future resolved on the event loop. Prints the medians of each leg and the
step's GPU time. argv: [pushes, default 300] [dtype, default bfloat16] ["profile": cProfile the
worker's steps and print their costliest calls]."""

from __future__ import annotations

import asyncio
import cProfile
import pstats
import statistics
import sys
import time

import torch

from code2wav.engine.async_engine import AsyncEngine
from code2wav.engine.graphs import GraphRunner, use_expandable_segments
from code2wav.model.loading import configure_cuda, load_decoder
from code2wav.stream.engine import StreamEngine


def main() -> int:
    pushes = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    dtype = getattr(torch, sys.argv[2] if len(sys.argv) > 2 else "bfloat16")
    profiler = cProfile.Profile() if "profile" in sys.argv[3:] else None
    use_expandable_segments()
    configure_cuda(dtype)
    model = load_decoder(None, device="cuda", dtype=dtype)
    core = StreamEngine(model, max_streams=4, max_step_frames=32, max_batch_frames=256)
    runner = GraphRunner(model, core.pool, batch_sizes=(1,), frame_sizes=(1, 25), max_batch_frames=256)
    runner.capture()
    core.runner = runner
    marks: dict[str, float] = {}

    def stamp(name, fn):
        def wrapped(*a, **k):
            marks[name] = time.perf_counter()
            out = fn(*a, **k)
            marks[name + " done"] = time.perf_counter()
            return out
        return wrapped

    real_step = core.step

    def step(chunks, on_ready=None, more=None):
        def ready(rid, res):
            marks["handed over"] = time.perf_counter()
            on_ready(rid, res)
        if profiler is not None:
            profiler.enable()  # on the worker thread: profiles the step alone
        try:
            return stamp("step", real_step)(chunks, ready, more)
        finally:
            if profiler is not None:
                profiler.disable()

    core.step = step
    core.runner = stamp("runner", runner)
    legs = []

    async def run() -> None:
        async with AsyncEngine(core) as eng:
            for i in range(pushes):
                rid = f"p{i}"
                await eng.open(rid)
                codes = torch.randint(0, 2048, (1, 16))
                resolved: list[float] = []
                t0 = time.perf_counter()
                fut = eng.submit(rid, codes)
                fut.add_done_callback(lambda f: resolved.append(time.perf_counter()))
                await fut
                gpu = eng.stats.step_seconds[-1]
                legs.append((marks["step"] - t0, marks["runner"] - marks["step"], marks["runner done"] - marks["runner"],
                             marks["handed over"] - marks["runner done"], resolved[0] - marks["handed over"], resolved[0] - t0, gpu))
                await eng.finish(rid)
                await asyncio.sleep(0.002)

    asyncio.run(run())
    names = ("submit -> step", "step -> runner", "runner (replay launched)", "-> handed over (GPU, D2H)", "-> resolved on the loop",
             "first packet", "GPU step (events)")
    warm = legs[len(legs) // 10:]
    print(f"{dtype}, low-rate stages {model.low_rate_dtype}; medians over {len(warm)} first packets, us")
    for name, col in zip(names, zip(*warm)):
        print(f"{name:>28} {statistics.median(col) * 1e6:8.1f}")
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
