"""``code2wav bench``: the streaming workload, every mode side by side on the same weights.

N streams arrive staggered; each opens (optionally with a reference prefix), pushes a first
chunk, then steady chunks (default 1 then 25 frames, like a talker), as fast as its audio comes
back, and finishes. Per mode and concurrency level we report aggregate throughput (audio seconds
per wall second), step latency p50/p99, time to first packet (first frames pushed -> first audio
back) p50/p99, and GPU memory.

Two loads: a burst (default: each of N streams decodes once; the staggered arrivals and the
drain are part of the measurement) and, with ``--seconds``, sustained load (N workers open
stream after stream; a window is measured once all N run), which is what one GPU holds.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch
from tqdm import tqdm

from code2wav.engine.async_engine import AsyncEngine
from code2wav.engine.build import EngineConfig, build_engine, thaw_heap
from code2wav.engine.graphs import default_batch_frames, use_expandable_segments
from code2wav.files import out_dir
from code2wav.model.decoder import Decoder
from code2wav.options import (
    DTYPES,
    CliError,
    EnvDefault,
    add_low_rate_dtype,
    add_set,
    add_threads,
    chunk_schedule,
    engine_config,
    non_negative_float,
    non_negative_int,
    parse_device,
    parse_floats,
    parse_ints,
    parse_prefixes,
    positive_int,
    server_url,
)
from code2wav.report import Result, json_safe, plot, table, title
from code2wav.stream.engine import StreamEngine
from code2wav.stream.lifecycle import Lifecycle

ALL_MODES = ("exact-graph", "exact-eager", "windowed", "full")


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1e3, q)) if xs else float("nan")


def engine_for(model: Decoder, mode: str, base: EngineConfig) -> Lifecycle:
    """The engine of one bench mode (``exact-graph`` / ``exact-eager``: the exact mode on the
    graph or eager runner) over ``model``, every other knob from ``base``."""
    decoding, _, runner = mode.partition("-")
    return build_engine(replace(base, mode=decoding, graphs=runner == "graph" if decoding == "exact" else None), model=model)


async def _workload(core: Lifecycle, concurrency: int, frames: int, schedule: list[int], prefix: int, stagger_s: float, seed: int,
                    seconds: float = 0.0, pace: float = 0.0, voices: int = 0, first_voice: int = 0) -> "_Measured":
    """``concurrency`` workers, started ``stagger_s`` apart. With ``seconds == 0`` each decodes
    one stream and everything is measured. With ``seconds > 0`` each opens stream after stream
    (sustained load: what a GPU holds, not how a burst drains), and only a window of that length
    is measured, opening once every worker has started: audio of chunks completed in it, latency
    of chunks pushed in it, steps ended in it.

    ``pace == 0``: a stream pushes its next chunk when the last one's audio is back (the engine
    sets the pace). ``pace > 0``: a talker generating ``pace`` x real time pushes each chunk
    as soon as its frames exist, whatever the audio; a listener plays from the first audio on.
    A slow talker makes it wait by itself, so per stream we keep the waiting the decoder adds:
    playback stalls with the real arrivals minus those had every chunk's audio come back the
    moment it was pushed (the first packet's latency is TTFP, not a stall). ``voices > 0``: each
    prefix is one of that many references (stream k: voice (first_voice + k) mod voices)."""
    q, size = core.cfg.num_quantizers, core.cfg.codebook_size
    bank = np.random.default_rng(7).integers(0, size, (voices, prefix, q)) if voices and prefix else None
    opened_streams = itertools.count()
    fps = core.cfg.sample_rate / core.cfg.samples_per_frame
    rng = np.random.default_rng(seed)
    m = _Measured()
    async with AsyncEngine(core, max_pending_chunks=4 if pace <= 0 else 1 << 16) as eng:
        t0 = time.perf_counter()
        start = t0 + (concurrency - 1) * stagger_s if seconds > 0 else t0
        end = start + seconds if seconds > 0 else float("inf")
        inside = lambda t: start <= t <= end  # noqa: E731
        counted = core.runner_stats() is not None  # a GraphRunner counts the work it replays

        def on_step(seconds_: float, rows: int, frames_: int) -> None:
            if inside(time.perf_counter()):
                m.steps.append(seconds_)
                m.rows.append(rows)
                m.widths.append(frames_)
                if counted:
                    g = core.runner_stats()
                    m.work.append((g["padded_frames"], g["frames"]))

        eng.on_step.append(on_step)

        async def stream(rid: str) -> None:
            # A voice's prefix is its reference's codes, drawn once (a talker has them already)
            ref = bank[(first_voice + next(opened_streams)) % voices] if bank is not None else rng.integers(0, size, (prefix, q)) if prefix else None
            codes = rng.integers(0, size, (frames, q))
            await eng.open(rid, ref)
            opened, at, chunks = time.perf_counter(), 0, []  # (pushed, landed, frames)
            sent: list[tuple[float, asyncio.Future, list[float], int]] = []  # (pushed, future, [landed], frames)
            for n in chunk_schedule(frames, schedule):
                if pace > 0:  # the talker has these frames only now
                    await asyncio.sleep(max(0.0, opened + (at + n) / (fps * pace) - time.perf_counter()))
                if time.perf_counter() > end:
                    break  # the window closed: free the slot, the rest is not measured
                fut = eng.submit(rid, codes[at : at + n])
                landed: list[float] = []
                fut.add_done_callback(lambda f, landed=landed: landed.append(time.perf_counter()))
                sent.append((time.perf_counter(), fut, landed, n))
                if pace <= 0:
                    await fut
                at += n
            for pushed, fut, landed, n in sent:
                out = await fut
                chunks.append((pushed, landed[0], n))
                if inside(landed[0]):
                    m.samples += out.numel()
            await eng.finish(rid)
            m.streams += 1
            m.chunk += [landed - pushed for pushed, landed, _ in chunks if inside(pushed)]
            if not chunks or not inside(chunks[0][0]):
                return
            m.ttfp.append(chunks[0][1] - chunks[0][0])
            if pace > 0:  # what the decoder adds to the talker's own stalls, first packet aside
                pushed, landed, n = zip(*chunks)
                m.stalls.append(max(0.0, playback_stall(landed, n, fps) - playback_stall(pushed, n, fps)))

        async def worker(i: int) -> None:
            await asyncio.sleep(i * stagger_s)
            n = 0
            while n == 0 or (seconds > 0 and time.perf_counter() < end):
                await stream(f"bench-{seed}-{i}-{n}")
                n += 1

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        m.wall = seconds if seconds > 0 else time.perf_counter() - t0
    return m


def _padding_pct(work: "list[tuple[int, int]]") -> float:
    """Padding's share of the replayed work between the window's first and last steps."""
    (p0, f0), (p1, f1) = (work[0], work[-1]) if work else ((0, 0), (0, 0))
    return 100 * (1 - (f1 - f0) / (p1 - p0)) if p1 != p0 else float("nan")


def _small_steps_pct(steps: "list[float]", widths: "list[int]", frames: int = 8) -> float:
    """Share of the step time in forwards of at most ``frames`` padded frames a row (first chunks' size class: a step each for little audio)."""
    total = sum(steps)
    return 100 * sum(s for s, w in zip(steps, widths) if w <= frames) / total if total else float("nan")


def playback_stall(arrivals: "tuple[float, ...]", frames: "tuple[int, ...]", fps: float) -> float:
    """Seconds a listener waits after the first chunk, playing chunks in order from the first
    arrival on; a chunk that lands after its turn pauses playback until it does."""
    play, stalled = arrivals[0], 0.0
    for at, n in zip(arrivals, frames):
        stalled += max(0.0, at - play)
        play = max(play, at) + n / fps
    return stalled


@dataclass
class _Measured:
    wall: float = 0.0
    samples: int = 0
    streams: int = 0
    ttfp: list[float] = field(default_factory=list)
    chunk: list[float] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)
    stalls: list[float] = field(default_factory=list)  # paced: seconds each stream's playback waited
    work: list[tuple[int, int]] = field(default_factory=list)  # graphs: (padded, real) frames replayed so far, per step in the window
    rows: list[int] = field(default_factory=list)  # rows of each step in the window
    widths: list[int] = field(default_factory=list)  # padded frames a row of each step in the window


def run(
    model: Decoder,
    modes: list[str],
    levels: list[int],
    frames: int = 101,
    schedule: list[int] | None = None,
    prefixes: tuple[int, ...] = (0,),
    stagger_s: float = 0.002,
    max_batch_frames: int | None = None,
    progress: bool = True,
    seconds: float = 0.0,
    group_by_size: bool = True,
    split_lone_group: bool = False,
    pace: float = 0.0,
    warm_eager: bool | None = None,
    first_chunk_waits: tuple[float | None, ...] = (None,),
    base: EngineConfig | None = None,
    voices: int = 0,
) -> list[Result]:
    """``warm_eager`` (default: on CUDA): eager modes run each level's workload once untimed first,
    so that a new shape's first call (cuDNN's plan for it) is not timed; graphs meet their shapes
    at capture. ``first_chunk_waits`` (seconds; None: the engine's default): each level runs once per value, on one engine.
    ``base``: every other engine knob (``max_streams`` is the largest level; pieces of 32 frames
    unless it sets ``max_step_frames``). ``voices``: prefixes drawn from that many references
    (``_workload``; 0: each stream its own)."""
    schedule = schedule or [1, 25]
    max_batch_frames = max_batch_frames or default_batch_frames()
    cuda = next(model.parameters()).is_cuda
    warm_eager = cuda if warm_eager is None else warm_eager
    weights_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    results: list[Result] = []
    bar = tqdm(total=len(modes) * len(levels) * len(prefixes) * len(first_chunk_waits), disable=not progress, desc="bench")
    for mode in modes:
        if mode == "exact-graph" and not cuda:
            bar.update(len(levels) * len(prefixes) * len(first_chunk_waits))
            continue
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            # Autotuning pays only where shapes repeat (graph buckets); eager modes see a new
            # shape at almost every step and would pay the tuning inside their timings.
            torch.backends.cudnn.benchmark = mode == "exact-graph"
        base = base or EngineConfig()
        policy = replace(base.schedule, group_by_size=group_by_size, split_lone_group=split_lone_group)
        core = engine_for(model, mode, replace(base, max_streams=max(levels), max_step_frames=base.max_step_frames or 32, max_batch_frames=max_batch_frames,
                                               schedule=policy))
        graph_mb = core.runner_stats()["pool_bytes"] / 2**20 if mode == "exact-graph" else 0.0  # type: ignore[index]  (taken at capture)
        for prefix_frames in prefixes:  # one engine (one capture) per mode, every prefix
            # Untimed warm-up (allocator, cudnn autotune, lazy init; a stream per voice: a warm prefix cache)
            for v in range(0, max(voices, 1) if prefix_frames else 1, warm := min(4, max(levels))):
                asyncio.run(_workload(core, warm, min(frames, 30), schedule, prefix_frames, 0.0, seed=99, voices=voices, first_voice=v))
            for c, wait in ((c, w) for c in levels for w in first_chunk_waits):
                wait_s = policy.first_chunk_wait if wait is None else wait
                if isinstance(core, StreamEngine):  # the baselines do not gather
                    core.policy = replace(policy, first_chunk_wait=wait_s)
                if warm_eager and mode != "exact-graph":  # the same workload, other stream ids
                    asyncio.run(_workload(core, c, frames, schedule, prefix_frames, stagger_s, seed=c + 1000, seconds=seconds, pace=pace))
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                c0, cpu0 = core.prefix_cache_stats() or {}, time.process_time()
                m = asyncio.run(_workload(core, c, frames, schedule, prefix_frames, stagger_s, seed=c, seconds=seconds, pace=pace, voices=voices))
                c1, cpu_s = core.prefix_cache_stats() or c0, time.process_time() - cpu0  # the run's alone
                # the run's own counts (none without a cache)
                hits, misses, alone, paired = (c1.get(k, 0) - c0.get(k, 0) for k in ("hits", "misses", "restored_alone", "restored_in_step"))
                g, audio_s = core.runner_stats() or {}, m.samples / core.cfg.sample_rate
                results.append(
                    Result(
                        mode=mode,
                        concurrency=c,
                        prefix_frames=prefix_frames,
                        streams=m.streams,
                        audio_s=audio_s,
                        wall_s=m.wall,
                        throughput_x=audio_s / m.wall,
                        step_p50_ms=_pct(m.steps, 50),
                        step_p99_ms=_pct(m.steps, 99),
                        ttfp_p50_ms=_pct(m.ttfp, 50),
                        ttfp_p99_ms=_pct(m.ttfp, 99),
                        chunk_p50_ms=_pct(m.chunk, 50),
                        chunk_p99_ms=_pct(m.chunk, 99),
                        steps=len(m.steps),
                        mem_weights_mb=weights_mb,
                        mem_state_pool_mb=core.state_bytes()["pool"] / 2**20,
                        mem_graph_pool_mb=graph_mb,
                        mem_peak_mb=torch.cuda.max_memory_allocated() / 2**20 if cuda else float("nan"),
                        graph_hits=g.get("hits", 0),
                        graph_fallbacks=sum(g.get("fallbacks", {}).values()),
                        sustained_s=seconds,
                        pace=pace,
                        prefix_hit_pct=100 * hits / (hits + misses) if hits + misses else float("nan"),
                        prefix_alone_pct=100 * alone / (alone + paired) if alone + paired else float("nan"),
                        stalled_pct=100 * float(np.mean(np.asarray(m.stalls) > 1e-3)) if m.stalls else float("nan"),
                        stall_p99_ms=_pct(m.stalls, 99),
                        padding_pct=_padding_pct(m.work),
                        rows_per_step=float(np.mean(m.rows)) if m.rows else float("nan"),
                        small_steps_pct=_small_steps_pct(m.steps, m.widths) if mode.startswith("exact") else float("nan"),
                        first_chunk_wait_ms=wait_s * 1e3,
                        host_cpu_us=cpu_s / max(1, m.streams) * 1e6,
                    )
                )
                print(json.dumps(json_safe(asdict(results[-1]))), flush=True)  # kept even if a later level is cut off
                bar.update(1)
        del core
        if base.gc_freeze:  # its cycles were frozen with it: freed before the next mode's run
            thaw_heap()
    bar.close()
    return results


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="checkpoint (default: embedded random weights)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda[:N] or cpu (default: cuda where there is one)")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    add_low_rate_dtype(p)
    p.add_argument("--modes", default=",".join(ALL_MODES), help=f"comma list of {', '.join(ALL_MODES)} (exact-graph needs CUDA: skipped on CPU)")
    p.add_argument("--levels", default="1,4,16,64,256")
    p.add_argument("--frames", type=positive_int, default=101, help="frames per stream (after the prefix)")
    p.add_argument("--chunks", default="1,25", help="chunk schedule, the last size repeating")
    p.add_argument("--prefix", default="0", help="reference prefix frames; comma list runs each")
    p.add_argument("--voices", type=non_negative_int, default=0, help="prefixes drawn from this many reference voices (0: each stream its own)")
    p.add_argument("--stagger-ms", type=non_negative_float, default=2.0)
    p.add_argument("--pace", type=non_negative_float, default=0.0,
                   help="talkers generating at this x real time push each chunk when its frames exist, and listeners play from the "
                        "first audio; reports the streams whose playback stalled (0: push the next chunk when the last one's audio is back)")
    p.add_argument("--seconds", type=non_negative_float, default=0.0,
                   help="sustained load: each of the c workers opens stream after stream and a window of this many seconds is "
                        "measured once all have started (0: each worker decodes one stream and the whole burst is measured)")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True,
                   help="CUDA: run the conv stack channels-last (the default; --no-channels-last: contiguous)")
    p.add_argument("--group-by-size", action=argparse.BooleanOptionalAction, default=True,
                   help="one size class of chunk per batched forward, 1-frame first chunks apart from 25-frame ones (the default; "
                        "--no-group-by-size: any sizes share a forward, padded to the widest)")
    p.add_argument("--split-lone-group", action="store_true",
                   help="with nothing on the GPU, run a group that takes every ready row as two halves, so the second "
                        "runs while the first's audio is delivered (SchedulePolicy.split_lone_group; off by default)")
    p.add_argument("--first-chunk-wait-ms", default=None,
                   help="how long a first chunk may wait for others to share its forward while other rows keep the GPU busy "
                        "(SchedulePolicy.first_chunk_wait; default: its default); a comma list runs each level once per value")
    p.add_argument("--max-batch-frames", type=positive_int, default=None,
                   help="padded frames per step; sets the graph pool size (default: graphs.default_batch_frames(), larger "
                        "with the allocator's expandable segments, which code2wav turns on unless PYTORCH_CUDA_ALLOC_CONF is set)")
    p.add_argument("--convt", choices=("gemm", "cudnn"), default="gemm",
                   help="the ConvTranspose layers as GEMMs (default) or cuDNN's transposed conv (LayerChoices.convt_gemm)")
    p.add_argument("--warm-eager", action=argparse.BooleanOptionalAction, default=None,
                   help="run each level of the eager modes once untimed first (default: on CUDA, where every "
                        "new shape's first call costs cuDNN plan building)")
    add_set(p)
    add_threads(p)
    p.add_argument("--out", default="bench-out", help="directory for results.json and plot.png")
    p.add_argument("--server", type=server_url, default=None, help="measure a running code2wav serve at this URL instead (TTFP at the client)")
    p.add_argument("--api-key", default=EnvDefault("CODE2WAV_API_KEY"), help="bearer token for --server (default: $CODE2WAV_API_KEY)")


def _modes(text: str, device: torch.device) -> list[str]:
    """The modes to run; ``exact-graph`` (CUDA graphs) on a CPU is skipped with a note, or refused
    when it is all that was asked for."""
    modes = [m for m in text.split(",") if m]
    bad = [m for m in modes if m not in ALL_MODES]
    if bad or not modes:
        raise CliError(f"bad --modes {text!r}: unknown mode(s) {', '.join(bad) or '(none)'}; choose from {', '.join(ALL_MODES)}")
    if device.type != "cuda" and "exact-graph" in modes:
        modes.remove("exact-graph")
        if not modes:
            raise CliError("--modes exact-graph replays CUDA graphs and needs --device cuda; on a CPU run exact-eager")
        print(f"code2wav: bench: exact-graph skipped: it replays CUDA graphs, and --device is {device}", file=sys.stderr, flush=True)
    return modes


def main(args: argparse.Namespace) -> int:
    from code2wav.engine.build import load_model

    use_expandable_segments()  # before the model touches CUDA
    if args.server:
        from code2wav.loadtest import service_bench

        return service_bench(args, parse_prefixes(args.prefix))

    device = parse_device(args.device)
    args.max_batch_frames = args.max_batch_frames or default_batch_frames()
    base = engine_config(args, device, [f"channels_last={args.channels_last}", f"layers.convt_gemm={args.convt == 'gemm'}"])
    levels = parse_ints(args.levels, "--levels", "1,16,64")
    chunks = parse_ints(args.chunks, "--chunks")
    prefixes = parse_prefixes(args.prefix)
    waits = (None,) if args.first_chunk_wait_ms is None else tuple(ms / 1e3 for ms in parse_floats(args.first_chunk_wait_ms, "--first-chunk-wait-ms"))
    modes = _modes(args.modes, device)
    out = out_dir(args.out, "--out")
    model = load_model(base)
    results = run(model, modes, levels, args.frames, chunks, prefixes, args.stagger_ms / 1e3, args.max_batch_frames, seconds=args.seconds,
                  group_by_size=args.group_by_size, split_lone_group=args.split_lone_group, pace=args.pace, warm_eager=args.warm_eager,
                  first_chunk_waits=waits, base=base, voices=args.voices)
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "dtype": args.dtype,
            "low_rate_dtype": model.precision()["low_rate_dtype"], "low_rate_peak": model.low_rate_peak, "torch": torch.__version__,
            "channels_last": args.channels_last, "max_batch_frames": args.max_batch_frames, "sustained_s": args.seconds,
            "group_by_size": args.group_by_size, "split_lone_group": args.split_lone_group, "pace": args.pace,
            "convt": args.convt, "warm_eager": args.warm_eager,  # None: run()'s default, on for CUDA
            "first_chunk_wait_ms": args.first_chunk_wait_ms,  # None: the engine's default
            "settings": args.settings, "voices": args.voices}
    # Figures with no value (no CUDA, no graphs, nothing in the window) are null: NaN is not JSON.
    (out / "results.json").write_text(json.dumps(json_safe({"meta": meta, "results": [asdict(r) for r in results]}), indent=2, allow_nan=False))
    skipped = plot(results, out / "plot.png", title(meta, args.frames, args.chunks, args.seconds, args.pace))
    print(table(results))
    wrote = f"{out / 'results.json'}" + ("" if skipped else f" and {out / 'plot.png'}")
    print(f"code2wav: bench: wrote {wrote}" + (f"; plot.png skipped: {skipped}" if skipped else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":  # python -m code2wav.bench ARGS is code2wav bench ARGS
    from code2wav.cli import main as cli_main

    raise SystemExit(cli_main(["bench", *sys.argv[1:]]))
