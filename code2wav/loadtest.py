"""Load a running ``code2wav serve`` over WebSocket, from the client side (loopback use).

``code2wav loadtest --server URL --streams N --seconds M``: N workers, each opening stream after
stream for M seconds (random codes, the chunk schedule pushed one chunk at a time as audio comes
back). Reports streams served, errors by code, time to first packet at the client (first frames
sent -> first audio received) p50/p99, audio throughput, and the server's resident memory and
pool use at start and end (from ``/metrics``). ``code2wav bench --server URL`` runs the bench's
fixed workload (each of N streams decodes F frames once) through the same client path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from code2wav.client import AsyncClient, ServerError
from code2wav.options import chunk_schedule, parse_ints

SPF, SR = 1920, 24000


@dataclass
class LoadResult:
    streams: int
    seconds: float
    streams_served: int = 0
    audio_s: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    ttfp_ms: list[float] = field(default_factory=list, repr=False)
    server_before: dict[str, float] = field(default_factory=dict)
    server_after: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict:
        d = asdict(self)
        d.pop("ttfp_ms")
        t = np.asarray(self.ttfp_ms) if self.ttfp_ms else np.asarray([np.nan])
        d.update(ttfp_p50_ms=float(np.percentile(t, 50)), ttfp_p99_ms=float(np.percentile(t, 99)),
                 throughput_x=self.audio_s / self.seconds if self.seconds else 0.0)
        return d


async def server_gauges(client: AsyncClient) -> dict[str, float]:
    """The few /metrics samples a load test reports (memory, pool use, errors so far)."""
    want = ("process_resident_memory_bytes", "code2wav_pool_slots_in_use", "code2wav_active_streams")
    out: dict[str, float] = {}
    for line in (await client.metrics()).splitlines():
        name, _, value = line.partition(" ")
        if name in want:
            out[name] = float(value)
    return out


async def one_stream(client: AsyncClient, rng: np.random.Generator, frames: int, schedule: list[int], prefix: int, res: LoadResult) -> None:
    codes = rng.integers(0, 2048, (prefix + frames, 16))
    try:
        async with client.stream(prefix=codes[:prefix] if prefix else None, format="pcm_s16le") as s:
            at = prefix
            for k, n in enumerate(chunk_schedule(frames, schedule)):
                t0 = time.perf_counter()
                await s.push(codes[at : at + n])
                audio = await s.recv_audio()
                if k == 0:
                    res.ttfp_ms.append((time.perf_counter() - t0) * 1e3)
                res.audio_s += audio.size / SR
                at += n
            await s.end()
        res.streams_served += 1
    except ServerError as e:
        res.errors[e.code] = res.errors.get(e.code, 0) + 1


async def load(url: str, streams: int, seconds: float, frames: int = 101, schedule: list[int] | None = None,
               prefix: int = 0, api_key: str | None = None, seed: int = 0) -> LoadResult:
    """N workers open streams back to back until ``seconds`` have passed."""
    schedule = schedule or [1, 25]
    res = LoadResult(streams=streams, seconds=seconds)
    async with AsyncClient(url, api_key=api_key) as client:
        res.server_before = await server_gauges(client)
        deadline = time.perf_counter() + seconds
        t0 = time.perf_counter()

        async def worker(i: int) -> None:
            rng = np.random.default_rng(seed * 100_003 + i)
            while time.perf_counter() < deadline:
                await one_stream(client, rng, frames, schedule, prefix, res)

        await asyncio.gather(*(worker(i) for i in range(streams)))
        res.seconds = time.perf_counter() - t0
        res.server_after = await server_gauges(client)
    return res


async def fixed(url: str, streams: int, frames: int, schedule: list[int], prefix: int = 0, api_key: str | None = None) -> LoadResult:
    """The bench workload through the service: each of N streams decodes ``frames`` once."""
    res = LoadResult(streams=streams, seconds=0.0)
    async with AsyncClient(url, api_key=api_key) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one_stream(client, np.random.default_rng(i), frames, schedule, prefix, res) for i in range(streams)))
        res.seconds = time.perf_counter() - t0
    return res


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", required=True, help="base URL of a running code2wav serve, e.g. http://127.0.0.1:8091")
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--frames", type=int, default=101)
    p.add_argument("--chunks", default="1,25")
    p.add_argument("--prefix", type=int, default=0)
    p.add_argument("--api-key", default=None)
    p.add_argument("--json", default=None, help="also write the summary here")


def main(args: argparse.Namespace) -> int:
    res = asyncio.run(load(args.server, args.streams, args.seconds, args.frames, parse_ints(args.chunks, "--chunks"), args.prefix, args.api_key))
    summary = res.summary()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    mb = lambda d: d.get("process_resident_memory_bytes", float("nan")) / 2**20  # noqa: E731
    print(f"streams served {res.streams_served} in {res.seconds:.1f}s by {res.streams} workers; errors {res.errors or 0}")
    print(f"TTFP p50 {summary['ttfp_p50_ms']:.1f} ms, p99 {summary['ttfp_p99_ms']:.1f} ms; audio {res.audio_s:.1f}s ({summary['throughput_x']:.1f}x real time)")
    print(f"server RSS {mb(res.server_before):.0f} MiB -> {mb(res.server_after):.0f} MiB; slots in use "
          f"{res.server_before.get('code2wav_pool_slots_in_use')} -> {res.server_after.get('code2wav_pool_slots_in_use')}")
    return 1 if res.errors else 0


def service_bench(args: argparse.Namespace, prefixes: tuple[int, ...]) -> int:
    """The same workload through the service's WebSocket API, one row per level and prefix."""
    rows = []
    for pfx in prefixes:
        for c in parse_ints(args.levels, "--levels", "1,16,64"):
            r = asyncio.run(fixed(args.server, c, args.frames, parse_ints(args.chunks, "--chunks"), pfx, args.api_key))
            rows.append({"mode": "service", "concurrency": c, "prefix_frames": pfx, **r.summary()})
            print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": {"server": args.server}, "results": rows}, indent=2))
    print(f"{'mode':<10}{'c':>5}{'pfx':>5}{'x RT':>9}{'TTFP p50':>10}{'TTFP p99':>10}{'errors':>8}")
    for r in rows:
        print(f"{r['mode']:<10}{r['concurrency']:>5}{r['prefix_frames']:>5}{r['throughput_x']:>9.1f}{r['ttfp_p50_ms']:>10.2f}{r['ttfp_p99_ms']:>10.2f}{sum(r['errors'].values()):>8}")
    return 1 if any(r["errors"] for r in rows) else 0
