"""Where a first packet's time goes under sustained load, phase by phase: code2wav.bench's own run
(its arguments after ``--``), with each stream's first chunk timed at five points on its way:

  push     the bench's ``submit`` (on the event loop)
  taken    the worker takes it from the stream's queue (``AsyncEngine._take``)
  grouped  the scheduler puts its row into a step's group (``Scheduler.next_group``; a gathering
           first chunk waits before this)
  launched its step is queued on the device (``StreamEngine._outputs`` entered, right after the
           runner's call: the staging, any restore's own launch and the replay's launch before it)
  handed   its audio is handed to the loop (``AsyncEngine._hand_over``, on the worker: after its
           step and every step queued on the device ahead of it)
  landed   its future's done callback runs on the loop (what the bench's TTFP ends at)

For each timed phase (a ``--prefix`` entry, warm-ups left out) it prints the mean and p50 of each
leg over the first chunks pushed inside the measured window, the device time of the steps of
1-frame pieces (first chunks' steps on a ramped schedule) and of all steps, how many first rows a group held
what share of the streams still held a cached state not yet written in at their first push
(with ``restores_in_step``, their first step writes it) and the garbage collector's passes by
generation (each holds the GIL: both threads wait; ``gc_freeze`` keeps the full ones short), how
late the loop ran a callback due (a 2 ms sleep's overshoot) and the loop's and the worker's CPU
time as shares of the window. Session 42 wrote it to break
the 512-stream cached-voice first-packet gap down (BENCHMARKS.md, "Voice clones that repeat").

    python3 bench/ttfp_parts.py -- --modes exact-graph --frames 101 --levels 512 \
        --chunks 1,4,8,16,25 --prefix 0,200,200,0 --voices 8 --seconds 3 --set prefix_cache_bytes=1000000000

After ``-- host`` the arguments are ``bench/service_host.py inproc``'s: the same legs over its
simulated device, on a CPU. ``python3 bench/ttfp_parts.py --table RUN.txt...``: a markdown row per
earlier run (its stdout kept as a ``.txt``), for BENCHMARKS.md. ``--switch-interval MS`` before
``--``: ``sys.setswitchinterval`` for the run (how long a thread waiting for the GIL lets the one
holding it run before asking it to let go; CPython's default 5 ms).
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

import code2wav.bench as bench
from code2wav.engine.async_engine import AsyncEngine
from code2wav.stream.engine import StreamEngine
from code2wav.stream.schedule import Scheduler

LEGS = ("push", "taken", "grouped", "launched", "handed", "landed")
phases: list[dict] = []  # per timed _workload call: its prefix, window and per-rid points
_cur: dict | None = None
pauses: list[tuple[float, float, int]] = []  # the collector's passes: (start, seconds, generation)
_gc_start = 0.0


def _on_gc(phase: str, info: dict) -> None:
    """A collector pass holds the GIL: the worker and the loop both wait it out."""
    global _gc_start
    if phase == "start":
        _gc_start = time.perf_counter()
    else:
        pauses.append((_gc_start, time.perf_counter() - _gc_start, info["generation"]))


def _cpu_s(ident: int | None) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(ident)) if ident is not None else float("nan")


async def _sample_loop(ph: dict, every_s: float = 0.002) -> None:
    """Over the phase's window: how late the loop runs a callback due now (a sleep's overshoot),
    and the CPU time the loop's and the worker's threads spent, as shares of the window."""
    await asyncio.sleep(max(0.0, ph["start"] - time.perf_counter()))
    worker = ph.get("worker")  # the engine's own thread, as its first submit saw it
    loop = threading.get_ident()
    first = last = (time.perf_counter(), _cpu_s(loop), _cpu_s(worker))
    lags: list[float] = []
    while not lags or last[0] < ph["end"]:  # one sample at least, however late this began
        t = time.perf_counter()
        await asyncio.sleep(every_s)
        lags.append(time.perf_counter() - t - every_s)
        try:  # the clocks at each sample: the shares end at the last one the worker was alive for
            last = (time.perf_counter(), _cpu_s(loop), _cpu_s(worker))
        except OSError:  # the worker has ended: the workload stopped before its window did
            break
    wall, loop_s, worker_s = (b - a for a, b in zip(first, last))
    lag = np.array(lags) * 1e3
    ph["loop"] = {"lag_mean_ms": round(float(lag.mean()), 3), "lag_p50_ms": round(float(np.median(lag)), 3),
                  "lag_p99_ms": round(float(np.percentile(lag, 99)), 3), "loop_cpu_pct": round(100 * loop_s / wall, 1) if wall else None,
                  "worker_cpu_pct": round(100 * worker_s / wall, 1) if wall else None}


def _patch() -> None:
    workload, submit, take, hand_over, next_group = (bench._workload, AsyncEngine.submit, AsyncEngine._take,
                                                     AsyncEngine._hand_over, Scheduler.next_group)
    outputs, on_step = StreamEngine._outputs, AsyncEngine._on_step

    async def timed_workload(core, concurrency, frames, schedule, prefix, stagger_s, seed, seconds=0.0, **kw):
        global _cur
        now = time.perf_counter()
        start = now + (concurrency - 1) * stagger_s
        _cur = None if seed == 99 else {"prefix": prefix, "start": start, "end": start + seconds, "points": {},
                                         "futs": {}, "groups": [], "cached": 0, "firsts": 0,
                                         "last_group": [], "steps": []}
        sampler = asyncio.ensure_future(_sample_loop(_cur)) if _cur is not None else None
        try:
            result = await workload(core, concurrency, frames, schedule, prefix, stagger_s, seed, seconds, **kw)
            if sampler is not None:  # it ends by itself once the window has (the workload may end first)
                await sampler
            return result
        finally:
            if sampler is not None and not sampler.done():  # the workload failed
                sampler.cancel()
            if _cur is not None:
                phases.append(_cur)
            _cur = None

    def timed_submit(self, request_id, frames, encode=None):
        fut = submit(self, request_id, frames, encode)
        ph = _cur
        if ph is not None and request_id not in ph["points"]:
            p = ph["points"][request_id] = {"push": time.perf_counter()}
            ph.setdefault("worker", self._thread.ident)
            st = getattr(self.engine, "_streams", {}).get(request_id)  # a state found in the prefix cache at open, not in yet
            ph["cached"] += st is not None and getattr(st, "cached", None) is not None
            ph["futs"][id(fut)] = request_id
            fut.add_done_callback(lambda f, p=p: p.setdefault("landed", time.perf_counter()))
        return fut

    def timed_take(self, in_flight, futures, encoders):
        batch = take(self, in_flight, futures, encoders)
        ph, now = _cur, time.perf_counter()
        if ph is not None:
            for rid in batch:
                p = ph["points"].get(rid)
                if p is not None:
                    p.setdefault("taken", now)
        return batch

    def timed_next_group(self, is_live, dropped, device_idle):
        group = next_group(self, is_live, dropped, device_idle)
        ph, now = _cur, time.perf_counter()
        if ph is not None:
            firsts = [r for r in group.rows if r.first]
            if firsts:
                ph["groups"].append(len(firsts))
            ph["last_group"] = []
            for r in firsts:
                p = ph["points"].get(r.stream.request_id)
                if p is not None and "grouped" not in p:
                    p["grouped"] = now
                    ph["firsts"] += 1
                    ph["last_group"].append(p)
        return group

    def timed_outputs(self, wav, group, n_new):
        ph, now = _cur, time.perf_counter()
        if ph is not None:
            for p in ph["last_group"]:
                p.setdefault("launched", now)
            ph["last_group"] = []
        return outputs(self, wav, group, n_new)

    def timed_on_step(self, seconds, rows, frames):
        ph = _cur
        if ph is not None:
            ph["steps"].append((time.perf_counter(), seconds, rows, frames))
        return on_step(self, seconds, rows, frames)

    def timed_hand_over(self, fut, res):
        ph = _cur
        if ph is not None:
            rid = ph["futs"].pop(id(fut), None)
            if rid is not None:
                ph["points"][rid].setdefault("handed", time.perf_counter())
        return hand_over(self, fut, res)

    gc.callbacks.append(_on_gc)
    bench._workload = timed_workload
    AsyncEngine.submit, AsyncEngine._take, AsyncEngine._hand_over = timed_submit, timed_take, timed_hand_over
    Scheduler.next_group = timed_next_group
    StreamEngine._outputs, AsyncEngine._on_step = timed_outputs, timed_on_step


def summary(ph: dict) -> dict:
    rows = [p for p in ph["points"].values() if all(k in p for k in LEGS) and ph["start"] <= p["push"] <= ph["end"]]
    out = {"prefix": ph["prefix"], "first_chunks": len(rows), "first_rows_per_group": float(np.mean(ph["groups"])) if ph["groups"] else None,
           "cached_pct": 100 * ph["cached"] / ph["firsts"] if ph["firsts"] else None}
    for a, b in zip(LEGS, LEGS[1:]):
        d = np.array([p[b] - p[a] for p in rows]) * 1e3
        out[f"{a}->{b}"] = {"mean_ms": round(float(d.mean()), 3), "p50_ms": round(float(np.median(d)), 3)} if len(d) else None
    steps = [(sec, rows, fr) for t, sec, rows, fr in ph["steps"] if ph["start"] <= t <= ph["end"]]
    for name, keep in (("steps_1_frame", lambda fr: fr == 1), ("steps_all", lambda fr: True)):
        sel = [(sec, rows) for sec, rows, fr in steps if keep(fr)]
        out[name] = {"n": len(sel), "mean_ms": round(1e3 * float(np.mean([x[0] for x in sel])), 4),
                     "rows": round(float(np.mean([x[1] for x in sel])), 2)} if sel else None
    for g in (0, 1, 2):  # the collector's passes inside the window, by generation
        sel = [sec for t, sec, gen in pauses if gen == g and ph["start"] <= t <= ph["end"]]
        out[f"gc{g}"] = {"n": len(sel), "total_ms": round(1e3 * sum(sel), 2), "max_ms": round(1e3 * max(sel, default=0.0), 2)}
    out["loop"] = ph.get("loop") and {**ph["loop"], "switch_interval_ms": sys.getswitchinterval() * 1e3}
    total = np.array([p["landed"] - p["push"] for p in rows]) * 1e3
    out["ttfp"] = {"mean_ms": round(float(total.mean()), 3), "p50_ms": round(float(np.median(total)), 3)} if len(total) else None
    return out


def table(paths: list[str]) -> str:
    """A markdown row per process from the outputs of earlier runs (each a ``.txt`` of this
    script's stdout): throughput and TTFP p50 per phase from the bench's table, the gap of the
    prefixed phases' first packet over the unprefixed ones', and the legs' means."""
    head = "| run | throughput x, in order | TTFP p50 ms | gap | " + " | ".join(f"{a} -> {b} ms" for a, b in zip(LEGS, LEGS[1:])) + " |"
    out = [head, "|" + "---|" * (4 + len(LEGS) - 1)]
    for path in paths:
        lines = Path(path).read_text().splitlines()
        bench_rows = [ln.split() for ln in lines if ln.startswith("exact-")]
        try:
            legs = [json.loads(ln) for ln in lines if ln.startswith("{") and '"steps_1_frame"' in ln]
        except json.JSONDecodeError:  # a line cut short
            legs = []
        if not bench_rows or len(legs) != len(bench_rows):
            out.append(f"| {Path(path).stem} | incomplete | | | |")
            continue
        x, ttfp = np.array([float(r[4]) for r in bench_rows]), np.array([float(r[7]) for r in bench_rows])
        pfx = np.array([d["prefix"] != 0 for d in legs])  # the prefixed phases
        both = pfx.any() and not pfx.all()
        gap = f"{100 * (ttfp[pfx].mean() / ttfp[~pfx].mean() - 1):+.1f} % ({ttfp[pfx].mean() - ttfp[~pfx].mean():+.2f} ms)" if both else ""
        share = f" ({100 * x[pfx].mean() / x[~pfx].mean():.1f} %)" if both else ""
        cells = [" / ".join(f"{d[f'{a}->{b}']['mean_ms']:.2f}" for d in legs) for a, b in zip(LEGS, LEGS[1:])]
        out.append(f"| {Path(path).stem} | {' / '.join(f'{v:,.0f}' for v in x)}{share} | {' / '.join(f'{t:.2f}' for t in ttfp)} | {gap} | "
                   + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> int:
    args = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else sys.argv[1:]
    if sys.argv[1:2] == ["--table"]:  # earlier runs' outputs, summarized
        print(table(sys.argv[2:]))
        return 0
    if sys.argv[1:2] == ["--switch-interval"]:
        sys.setswitchinterval(float(sys.argv[2]) / 1e3)
    _patch()
    if args[:1] == ["host"]:  # bench/service_host.py inproc: the simulated device's run, on a CPU
        sys.path.insert(0, str(Path(__file__).parent))
        from service_host import main as host_main

        rc = host_main(["inproc", *args[1:]])
    else:
        from code2wav.cli import main as cli_main

        rc = cli_main(["bench", *args])
    for ph in phases:
        print(json.dumps(summary(ph)), flush=True)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
