"""Where a cached voice's first packet at one stream spends its time, beside a fresh stream's:
one engine (graphs on CUDA, the prefix cache on), streams opened one at a time, alternating a
fresh stream and one whose 200-frame prefix is cached; for each, the first one-frame push
(admission, the cache lookup and restore, the step, the audio back) and the second 25-frame one
timed on the host; the lookup and the restore alone; then the same streams under torch.profiler (the host's ops and the GPU's kernels, per kind). argv: [device,
default cuda] [pairs, default 100] [trace path, optional] [``in_step``: the cached state written inside the
first step, ``EngineConfig.restores_in_step``]. A third kind, "ahead", restores the
cached state before the first push (``restore_opened`` right after ``open``, as the async engine's
worker does while idle, and waited for): a talker that opens its stream before its first frames
exist. The profiled first pushes are laid out in time (the trace): from the push's start, when
the step's graph launch is called, when the GPU starts and ends its work, when the push returns,
and which CUDA runtime calls ran in between. Session 35 measured a cached voice's first packet
0.28 ms later than a fresh stream's on an H100 through code2wav.bench (BENCHMARKS.md).
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from code2wav.engine.build import EngineConfig, build_engine

PREFIX = 200


def main() -> int:
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    # As the bench builds its engine at one stream (code2wav.bench.run): one slot, 32-frame pieces.
    in_step = len(sys.argv) > 4 and sys.argv[4] == "in_step"  # EngineConfig.restores_in_step
    engine = build_engine(EngineConfig(device=device, dtype=dtype, max_streams=1, max_step_frames=32, prefix_cache_bytes=10**9,
                                       restores_in_step=in_step))
    rng = np.random.default_rng(0)
    voice, first, second = rng.integers(0, 2048, (PREFIX, 16)), rng.integers(0, 2048, (1, 16)), rng.integers(0, 2048, (25, 16))
    n = 0

    kinds = {"fresh": None, "cached": voice, "ahead": voice}

    def stream(kind: str) -> tuple[float, float]:
        """The first (1-frame) and second (25-frame) push of a new stream, ms each."""
        nonlocal n
        n += 1
        rid = f"s{n}"
        engine.open(rid, kinds[kind])
        if kind == "ahead":
            engine.restore_opened()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
        t0 = time.perf_counter()
        with record_function(f"first push {kind}"):
            engine.push(rid, first)  # the audio comes back to the host: the step is done
        t1 = time.perf_counter()
        engine.push(rid, second)
        t2 = time.perf_counter()
        engine.finish(rid)
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3

    for _ in range(5):  # the voice enters the cache; every shape has run once
        for kind in kinds:
            stream(kind)
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    for _ in range(pairs):
        for kind in kinds:
            times[kind].append(stream(kind))
    name = torch.cuda.get_device_name() if device.startswith("cuda") else device
    for i, what in enumerate(("first push", "second push")):
        f = np.asarray([t[i] for t in times["fresh"]])
        for kind in ("cached", "ahead"):
            c = np.asarray([t[i] for t in times[kind]])
            print(
                f"{name}: {what} p50 fresh {np.median(f):.3f} ms, {kind} {np.median(c):.3f} ms "
                f"({np.median(c) - np.median(f):+.3f}); p90 {np.percentile(f, 90):.3f} / {np.percentile(c, 90):.3f} ms",
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
    through_async_engine(engine, kinds, first, second, pairs)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    # The timeline (its GPU columns on CUDA only).
    with profile(activities=activities) as prof:
        for _ in range(20 if device.startswith("cuda") else 2):
            for kind in kinds:
                stream(kind)
    path = sys.argv[3] if len(sys.argv) > 3 else "/tmp/prefix_first_packet.trace.json"
    prof.export_chrome_trace(path)
    timeline(path)
    for kind in ("fresh", "cached"):
        with profile(activities=activities) as prof:
            for _ in range(10):
                stream(kind)
        for sort in ("self_cpu_time_total", "cuda_time_total") if device.startswith("cuda") else ("self_cpu_time_total",):
            print(f"--- {kind}: 10 streams (a first and a second push), by {sort}")
            print(prof.key_averages().table(sort_by=sort, row_limit=30), flush=True)
    return 0


def through_async_engine(engine, kinds: dict, first, second, pairs: int) -> None:
    """The first push as code2wav.bench times it: through the async engine, open then push back to
    back ("ahead": 3 ms apart, a talker that opens before its first frames exist), from the push
    to its audio's landing on the loop, and back to back also from the open's start (the loop
    thread holds the GIL until it waits, so the worker's restore cannot start before the push
    has been queued). The worker's side, from the push: when its ``restore_opened`` starts and
    how long it takes, when its decode starts."""
    import asyncio

    from code2wav.engine.async_engine import AsyncEngine

    marks: dict[str, list[tuple[float, float]]] = {"restore": [], "decode": []}  # (start, end) of each call

    def timed(name: str, fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                marks[name].append((t, time.perf_counter()))

        return wrapper

    engine.restore_opened = timed("restore", engine.restore_opened)
    engine.decode = timed("decode", engine.decode)
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}

    async def run() -> None:
        async with AsyncEngine(engine, max_pending_chunks=4) as eng:
            for i in range(5 + pairs):
                for kind, prefix in kinds.items():
                    rid = f"a{i}{kind}"
                    for m in marks.values():
                        m.clear()
                    opened = time.perf_counter()
                    await eng.open(rid, prefix)
                    if kind == "ahead":
                        await asyncio.sleep(0.003)
                    t0 = time.perf_counter()
                    fut = eng.submit(rid, first)
                    landed: list[float] = []
                    fut.add_done_callback(lambda f, landed=landed: landed.append(time.perf_counter()))
                    await fut
                    row = {"first packet": landed[0] - t0}
                    if kind != "ahead":  # back to back: what a caller that opens and pushes at once waits
                        row["from the open"] = landed[0] - opened
                    # Calls begun since the open (one begun before, e.g. a decode still returning
                    # when the last stream's audio landed, is recorded as it ends: not this push's).
                    restores = [m for m in marks["restore"] if m[0] >= opened]
                    decodes = [m for m in marks["decode"] if m[0] >= opened]
                    if restores:  # the last idle work before the decode (the open's)
                        start, end = restores[-1]
                        row["restore starts"], row["restore takes"] = start - t0, end - start
                    if decodes:
                        row["decode starts"] = decodes[0][0] - t0
                    if i >= 5:
                        rows[kind].append(row)
                    await eng.push(rid, second)
                    await eng.finish(rid)

    asyncio.run(run())
    del engine.restore_opened, engine.decode
    for kind, rs in rows.items():
        keys = sorted({k for r in rs for k in r}, key=lambda k: ("first packet", "from the open", "restore starts", "restore takes", "decode starts").index(k))
        print(
            f"async engine, {kind} ({len(rs)} streams, p50 us from the push): "
            + ", ".join(f"{k} {np.median([r[k] for r in rs if k in r]) * 1e6:.1f}" for k in keys),
            flush=True,
        )


def timeline(path: str) -> None:
    """Each profiled first push laid out in time, medians per kind (us from the push's start)."""
    events = json.load(open(path))["traceEvents"]
    spans = [e for e in events if e.get("cat") == "user_annotation" and e.get("name", "").startswith("first push ")]
    runtime = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"]
    gpu = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            gpu.setdefault(e["args"].get("correlation"), []).append(e)
    rows: dict[str, list[dict[str, float]]] = {}
    calls: dict[str, Counter] = {}
    for s in spans:
        kind, t0, t1 = s["name"][len("first push ") :], s["ts"], s["ts"] + s["dur"]
        inside = [r for r in runtime if t0 <= r["ts"] <= t1]
        work = [g for r in inside for g in gpu.get(r["args"].get("correlation"), [])]
        launch = [r["ts"] for r in inside if "GraphLaunch" in r["name"]]
        row = {"push": s["dur"], "graph launch called": (min(launch) - t0) if launch else float("nan")}
        if work:
            row["GPU starts"] = min(g["ts"] for g in work) - t0
            row["GPU ends"] = max(g["ts"] + g["dur"] for g in work) - t0
            row["GPU busy"] = sum(g["dur"] for g in work)
        rows.setdefault(kind, []).append(row)
        calls.setdefault(kind, Counter()).update(r["name"] for r in inside)
    for kind, rs in rows.items():
        keys = rs[0].keys()
        print(
            f"timeline {kind} ({len(rs)} first pushes, p50 us from the push's start): "
            + ", ".join(f"{k} {np.median([r.get(k, np.nan) for r in rs]):.1f}" for k in keys),
            flush=True,
        )
        print(f"  runtime calls per push: {', '.join(f'{k} {v / len(rs):g}' for k, v in calls[kind].most_common())}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
