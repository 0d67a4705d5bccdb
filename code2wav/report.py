"""A bench run's report: one :class:`Result` per mode, concurrency level and prefix, printed as
a table, written as JSON (:func:`json_safe`) and drawn as a plot (throughput and first packet
against concurrent streams; needs matplotlib, the ``bench`` extra)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Result:
    mode: str
    concurrency: int
    prefix_frames: int
    streams: int
    audio_s: float
    wall_s: float
    throughput_x: float
    step_p50_ms: float
    step_p99_ms: float
    ttfp_p50_ms: float
    ttfp_p99_ms: float
    chunk_p50_ms: float  # every chunk: push -> its audio (what a listener's buffer must cover)
    chunk_p99_ms: float
    steps: int
    mem_weights_mb: float
    mem_state_pool_mb: float
    mem_graph_pool_mb: float
    mem_peak_mb: float
    graph_hits: int
    graph_fallbacks: int
    sustained_s: float = 0.0  # >0: workers opened streams back to back; a window this long was measured
    pace: float = 0.0  # >0: talkers at this x real time; stall figures are the listeners'
    stalled_pct: float = float("nan")  # streams whose playback the decoder stalled (> 1 ms in all)
    stall_p99_ms: float = float("nan")  # per stream, playback stall the decoder added
    padding_pct: float = float("nan")  # graphs: share of the replayed work (rows x frames) that was padding
    rows_per_step: float = float("nan")  # mean rows per batched forward in the window
    small_steps_pct: float = float("nan")  # exact modes: share of the window's step time in forwards of <= 8 padded frames a row
    first_chunk_wait_ms: float = 0.0  # how long first chunks could wait to gather (SchedulePolicy.first_chunk_wait)
    prefix_hit_pct: float = float("nan")  # with a prefix cache: prefixed opens in the window's run served from it
    prefix_alone_pct: float = float("nan")  # of the run's restores, those by a launch of their own (not a step's restore pairs)
    # CPU time of the whole process (every thread: the engine's worker, the event loop, the bench's
    # own clients) over the run, per stream ended in it: the host's cost of a stream
    host_cpu_us: float = float("nan")


def table(results: list[Result]) -> str:
    head = (f"{'mode':<12}{'c':>5}{'pfx':>5}{'wait':>5}{'x RT':>9}{'step p50':>10}{'step p99':>10}{'TTFP p50':>10}{'TTFP p99':>10}{'chunk p99':>10}"
            f"{'pad%':>6}{'rows':>6}{'small%':>7}{'stalled%':>9}{'stall p99':>10}{'pool MB':>9}{'graph MB':>9}{'peak MB':>9}{'hit%':>6}"
            f"{'alone%':>7}{'CPU us':>8}")
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r.mode:<12}{r.concurrency:>5}{r.prefix_frames:>5}{r.first_chunk_wait_ms:>5.0f}{r.throughput_x:>9.1f}{r.step_p50_ms:>10.2f}{r.step_p99_ms:>10.2f}"
            f"{r.ttfp_p50_ms:>10.2f}{r.ttfp_p99_ms:>10.2f}{r.chunk_p99_ms:>10.2f}{r.padding_pct:>6.1f}{r.rows_per_step:>6.1f}{r.small_steps_pct:>7.1f}{r.stalled_pct:>9.1f}{r.stall_p99_ms:>10.2f}{r.mem_state_pool_mb:>9.0f}"
            f"{r.mem_graph_pool_mb:>9.0f}{r.mem_peak_mb:>9.0f}{r.prefix_hit_pct:>6.1f}{r.prefix_alone_pct:>7.1f}{r.host_cpu_us:>8.0f}"
        )
    return "\n".join(lines)


def json_safe(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float as None: JSON has no NaN (``null`` it is)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def title(meta: dict, frames: int, chunks: str, seconds: float, pace: float) -> str:
    """What the plot's title says: where the bench ran, and on what workload."""
    load = f"sustained {seconds:g} s" if seconds else "each stream once"
    if pace:
        load += f", talkers at {pace:g}x real time"
    return (f"{meta['device']}, {meta['dtype']} (low-rate stages {meta['low_rate_dtype']}); "
            f"{frames} frames a stream in chunks {chunks}, {load}")


def figure(results: list[Result], title: str = ""):
    """The plot as a matplotlib Figure: throughput and first packet p50 against concurrent
    streams, both axes logarithmic with plain numbers, one series per mode, prefix and first
    chunk wait (when several were run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    levels = sorted({r.concurrency for r in results})
    several_waits = len({r.first_chunk_wait_ms for r in results}) > 1
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.8))
    for key in dict.fromkeys((r.mode, r.prefix_frames, r.first_chunk_wait_ms) for r in results):
        mode, prefix, wait = key
        rs = sorted((r for r in results if (r.mode, r.prefix_frames, r.first_chunk_wait_ms) == key), key=lambda r: r.concurrency)
        label = f"{mode}, " + (f"{prefix}-frame prefix" if prefix else "no prefix") + (f", first chunks wait {wait:g} ms" if several_waits else "")
        a.plot([r.concurrency for r in rs], [r.throughput_x for r in rs], marker="o", label=label)
        b.plot([r.concurrency for r in rs], [r.ttfp_p50_ms for r in rs], marker="o", label=label)
    for ax, ylabel in ((a, "throughput (audio seconds per second, x real time)"), (b, "time to first packet, p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(levels))  # the levels run, as plain numbers
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(plain)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))  # labels even within one decade
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot(results: list[Result], path: Path, title: str = "") -> str | None:
    """Write :func:`figure` to ``path`` (PNG); returns None, or why no plot was written."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (pip install 'code2wav[bench]')"
    import matplotlib.pyplot as plt

    fig = figure(results, title)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
