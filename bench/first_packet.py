"""Where a lone stream's first packet spends its time: one stream at a time pushes one frame
through the async engine (graphs of the 1- and 25-frame steps only, so capture is quick), and
each push is stamped at submit, step entry, runner entry, replay launched, audio handed over on
the worker, the loop taking the hand-over (``_resolve_all``), and the future resolved there. Prints the medians of each leg, the
step's GPU time, and the engine's parts before the runner (admission, grouping, staging).
Without CUDA it times the host's legs alone (a runner that decodes nothing).
argv: [pushes, default 300] [dtype, default bfloat16] ["profile" [SORT]: cProfile the
worker's steps and print their costliest calls, by pstats' SORT key, default tottime].
FIRST_PACKET_PAUSE_MS (default 2): the pause between one stream's finish and the next one's
open; 0 is the sustained bench's one stream (the next opens as the last one finishes).
FIRST_PACKET_TAIL (default 0): 25-frame chunks each stream pushes after its first one, as the
sustained bench's streams do (4 there). FIRST_PACKET_ENGINE=default (CUDA): the engine
``code2wav.bench`` builds (``build_engine`` at the default config: every bucket's graph), not
the two graphs above."""

from __future__ import annotations

import asyncio
import cProfile
import os
import pstats
import statistics
import sys
import time

import torch

from code2wav.engine.async_engine import AsyncEngine
from code2wav.engine.graphs import GraphRunner, use_expandable_segments
from code2wav.model.config import DecoderConfig
from code2wav.model.decoder import Decoder
from code2wav.model.loading import configure_cuda, load_decoder
from code2wav.stream.engine import StreamEngine
from code2wav.stream.pool import StatePool


def main() -> int:
    pushes = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    dtype = getattr(torch, sys.argv[2] if len(sys.argv) > 2 else "bfloat16")
    profiler = cProfile.Profile() if "profile" in sys.argv[3:] else None
    if torch.cuda.is_available():
        use_expandable_segments()
        configure_cuda(dtype)
        model = load_decoder(None, device="cuda", dtype=dtype)
        if os.environ.get("FIRST_PACKET_ENGINE", "small") == "default":
            from code2wav.engine.build import EngineConfig, build_engine

            built = build_engine(EngineConfig(device="cuda", dtype=str(dtype).removeprefix("torch.")), model=model)
            runner = built.runner
        else:
            built = None
            runner = GraphRunner(model, StatePool(model, 64), batch_sizes=(1,), frame_sizes=(1, 25), max_batch_frames=256)
            runner.capture()
    else:  # no GPU: the host's legs alone, through a runner that decodes nothing (host_overhead.py)
        from host_overhead import NoDecode  # bench/ is the script's directory, first on sys.path

        model = Decoder(DecoderConfig()).to(dtype)
        built = None
        runner = NoDecode(model, StatePool(model, 64))
        runner._replay = lambda: None  # the leg the GPU runner stamps
    marks: dict[str, float] = {}
    spent: dict[str, float] = {}  # inside the step: seconds per part, summed over its calls in one push
    before_runner: dict[str, float] = {}  # ``spent`` when the runner was called

    class Stamped:
        """``fn`` with its calls stamped; its attributes (a runner's buckets) show through."""

        def __init__(self, name, fn):
            self.name, self.fn = name, fn

        def __call__(self, *a, **k):
            if self.name == "runner":  # the parts spent before the replay is launched
                before_runner.clear()
                before_runner.update(spent)
            marks[self.name] = t = time.perf_counter()
            out = self.fn(*a, **k)
            marks[self.name + " done"] = now = time.perf_counter()
            spent[self.name] = spent.get(self.name, 0.0) + now - t
            return out

        def __getattr__(self, attr):
            return getattr(self.fn, attr)

    stamp = Stamped
    runner._replay = Stamped("replay + count", runner._replay)  # (NoDecode: never called, 0 us)
    # The runner goes in stamped (its attributes show through); the engine never swaps it.
    if built is None:
        core = StreamEngine(model, runner=stamp("runner", runner), max_step_frames=32, max_batch_frames=256)
    else:
        core = built
        core.runner = stamp("runner", runner)
    # The host's parts before the replay: admission, the first chunks' gathering, taking the
    # group's rows (the scheduler's ``_take``: ``next_group`` less the gathering), staging.
    parts = {"_admit": (core, "_admit"), "_gathering": (core.scheduler, "_gathering"),
             "_take": (core.scheduler, "_take"), "stage": (core.stager, "stage")}
    for part, (owner, attr) in parts.items():
        setattr(owner, attr, Stamped(part, getattr(owner, attr)))

    real_decode = core.decode

    def decode(chunks, on_ready=None, more=None):
        spent.clear()

        def ready(rid, res):
            marks["handed over"] = time.perf_counter()
            on_ready(rid, res)
        if profiler is not None:
            profiler.enable()  # on the worker thread: profiles the step alone
        try:
            return stamp("step", real_decode)(chunks, ready, more)
        finally:
            if profiler is not None:
                profiler.disable()

    core.decode = decode
    legs = []
    pause = float(os.environ.get("FIRST_PACKET_PAUSE_MS", "2")) / 1e3
    tail = int(os.environ.get("FIRST_PACKET_TAIL", "0"))

    async def run() -> None:
        async with AsyncEngine(core) as eng:
            real_resolve = eng._resolve_all

            def resolve_all():
                marks["loop resolves"] = time.perf_counter()
                real_resolve()

            eng._resolve_all = resolve_all
            for i in range(pushes):
                rid = f"p{i}"
                await eng.open(rid)
                codes = torch.randint(0, 2048, (1, 16))
                resolved: list[float] = []
                t0 = time.perf_counter()
                fut = eng.submit(rid, codes)
                fut.add_done_callback(lambda f: resolved.append(time.perf_counter()))
                await fut
                gpu = eng.stats.step_seconds[-1] if eng.stats.step_seconds else 0.0
                legs.append((marks["step"] - t0, marks["runner"] - marks["step"], marks["runner done"] - marks["runner"],
                             marks["handed over"] - marks["runner done"], resolved[0] - marks["handed over"], resolved[0] - t0, gpu,
                             *(before_runner.get(p, 0.0) for p in parts), spent.get("replay + count", 0.0),
                             marks["loop resolves"] - marks["handed over"]))
                for _ in range(tail):
                    await eng.submit(rid, torch.randint(0, 2048, (25, 16)))
                await eng.finish(rid)
                if pause:
                    await asyncio.sleep(pause)

    asyncio.run(run())
    names = ("submit -> step", "step -> runner", "runner (replay launched)", "-> handed over (GPU, D2H)", "-> resolved on the loop",
             "first packet", "GPU step (events)", *(f"step -> runner: {p}" for p in parts), "runner: replay + count",
             "handed over -> loop takes it")
    warm = legs[len(legs) // 10:]
    print(f"{dtype}, low-rate stages {model.low_rate_dtype}; pause {pause * 1e3:g} ms, {tail} chunks of 25 after the first, "
          f"{'the default engine' if built is not None else 'two graphs'}; medians over {len(warm)} first packets, us")
    for name, col in zip(names, zip(*warm)):
        print(f"{name:>28} {statistics.median(col) * 1e6:8.1f}")
    if profiler is not None:
        pstats.Stats(profiler).sort_stats(sys.argv[4] if len(sys.argv) > 4 else "tottime").print_stats(40)
    return 0


if __name__ == "__main__":
    sys.exit(main())
