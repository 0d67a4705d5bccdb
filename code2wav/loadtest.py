"""Load a running ``code2wav serve`` over WebSocket, from the client side (loopback use).

``code2wav loadtest --server URL --streams N --seconds M``: N workers, each opening stream after
stream for M seconds (random codes, the chunk schedule pushed one chunk at a time as audio comes
back). Reports streams served, errors by code, time to first packet at the client (first frames
sent -> first audio received) p50/p99, audio throughput, and the server's resident memory and
pool use at start and end (from ``/metrics``). ``code2wav bench --server URL`` runs the bench's
fixed workload (each of N streams decodes F frames once) through the same client path.

A worker refused for a full pool (``pool_full``/``queue_full``) or a lost connection waits the
server's ``Retry-After`` (1 s where none came, as on a WebSocket close 1013; at most 10 s, never
past the run's end) before it opens its next stream. A server that cannot be reached or refuses
the key (``--api-key``, default ``$CODE2WAV_API_KEY``) is one error line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from code2wav.client import AsyncClient, ServerError
from code2wav.files import out_dir
from code2wav.options import CliError, EnvDefault, chunk_schedule, non_negative_int, parse_ints, positive_float, positive_int, server_url
from code2wav.report import json_safe

SPF, SR = 1920, 24000
RETRY_CODES = ("pool_full", "queue_full", "connection")  # refusals a worker waits out before its next stream
RETRY_AFTER_S = 1.0  # without a Retry-After (a WebSocket close 1013 carries none): the server's own on 503 (Limits.retry_after_s)
MAX_RETRY_AFTER_S = 10.0  # however long a server asks for, a worker tries again within this
STEP_COUNTERS = ("code2wav_steps_total", "code2wav_step_rows_total", "code2wav_step_seconds_sum")  # LoadResult.server_rates


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
                 throughput_x=self.audio_s / self.seconds if self.seconds else 0.0, server=self.server_rates())
        return d

    def server_rates(self) -> dict[str, float]:
        """The server's steps over the run, from its counters at the start and the end (the whole
        server's, other clients' streams included): steps a second, rows a step, and the share
        of the wall its steps took (``device_busy_pct``: GPU time on CUDA). A service that holds
        less than the in-process engine with its device busy less is starving it on the host."""
        a, b = self.server_before, self.server_after
        if not self.seconds or any(k not in a or k not in b for k in STEP_COUNTERS):
            return {}
        steps = b["code2wav_steps_total"] - a["code2wav_steps_total"]
        return {"steps_per_s": steps / self.seconds,
                "rows_per_step": (b["code2wav_step_rows_total"] - a["code2wav_step_rows_total"]) / steps if steps else 0.0,
                "device_busy_pct": 100 * (b["code2wav_step_seconds_sum"] - a["code2wav_step_seconds_sum"]) / self.seconds}


async def server_gauges(client: AsyncClient) -> dict[str, float]:
    """The few /metrics samples a load test reports (memory, pool use, errors so far)."""
    want = ("process_resident_memory_bytes", "code2wav_pool_slots_in_use", "code2wav_active_streams", *STEP_COUNTERS)
    out: dict[str, float] = {}
    for line in (await client.metrics()).splitlines():
        name, _, value = line.partition(" ")
        if name in want:
            out[name] = float(value)
    return out


def retry_delay(e: ServerError) -> float:
    """Seconds to wait after refusal ``e`` before the next stream."""
    return min(MAX_RETRY_AFTER_S, RETRY_AFTER_S if e.retry_after is None else e.retry_after)


def voice_bank(voices: int, prefix: int, seed: int = 7) -> np.ndarray | None:
    """``[voices, prefix, 16]`` reference prefixes (the same in every process for one seed, so
    several client processes reuse the same voices), or None for a prefix of its own per stream."""
    return np.random.default_rng(seed).integers(0, 2048, (voices, prefix, 16)) if voices and prefix else None


async def one_stream(client: AsyncClient, rng: np.random.Generator, frames: int, schedule: list[int], prefix: int,
                     res: LoadResult, bank: np.ndarray | None = None) -> ServerError | None:
    """One stream start to end, on a connection of its own or one ``client`` keeps; returns the
    error that ended it (counted in ``res``), if any. ``bank``: its prefix is one of these
    voices, at random (``voice_bank``)."""
    from websockets.exceptions import WebSocketException

    codes = rng.integers(0, 2048, (prefix + frames, 16))
    if bank is not None:
        codes[:prefix] = bank[rng.integers(len(bank))]
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
        return None
    except (ServerError, OSError, WebSocketException) as e:
        return _failed(res, e)


def _failed(res: LoadResult, e: Exception) -> ServerError:
    """The error that ended a stream or its connection, counted in ``res``: the server's own, or
    ``connection`` for one refused or dropped mid-run (the server stopped, say)."""
    err = e if isinstance(e, ServerError) else ServerError("connection", f"{type(e).__name__}: {e}")
    res.errors[err.code] = res.errors.get(err.code, 0) + 1
    return err


async def load(url: str, streams: int, seconds: float, frames: int = 101, schedule: list[int] | None = None,
               prefix: int = 0, api_key: str | None = None, seed: int = 0, reuse: bool = False, voices: int = 0) -> LoadResult:
    """N workers open streams back to back until ``seconds`` have passed; each on a connection
    of its own, or (``reuse``) on the client's kept connections (``AsyncClient(keep_connections=N)``:
    a worker's next stream takes a connection a stream left open, a new one after an error).
    ``voices``: each stream's prefix is one of that many references (as voice clones repeat: a
    server's prefix cache then hits), else a prefix of its own."""
    schedule = schedule or [1, 25]
    bank = voice_bank(voices, prefix)
    res = LoadResult(streams=streams, seconds=seconds)
    async with AsyncClient(url, api_key=api_key, keep_connections=streams if reuse else 0) as client:
        res.server_before = await server_gauges(client)
        deadline = time.perf_counter() + seconds
        t0 = time.perf_counter()

        async def worker(i: int) -> None:
            rng = np.random.default_rng(seed * 100_003 + i)
            while time.perf_counter() < deadline:
                err = await one_stream(client, rng, frames, schedule, prefix, res, bank)
                if err is not None and err.code in RETRY_CODES:  # back off instead of flooding a full server
                    await asyncio.sleep(max(0.0, min(retry_delay(err), deadline - time.perf_counter())))

        await asyncio.gather(*(worker(i) for i in range(streams)))
        res.seconds = time.perf_counter() - t0
        try:
            res.server_after = await server_gauges(client)
        except (ServerError, OSError):  # the server went away: the run's figures stand without its gauges
            res.server_after = {}
    return res


async def fixed(url: str, streams: int, frames: int, schedule: list[int], prefix: int = 0, api_key: str | None = None) -> LoadResult:
    """The bench workload through the service: each of N streams decodes ``frames`` once."""
    res = LoadResult(streams=streams, seconds=0.0)
    async with AsyncClient(url, api_key=api_key) as client:
        await client.metrics()  # the server answers and takes the key (else one error line, see _run)
        t0 = time.perf_counter()
        await asyncio.gather(*(one_stream(client, np.random.default_rng(i), frames, schedule, prefix, res) for i in range(streams)))
        res.seconds = time.perf_counter() - t0
    return res


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", required=True, type=server_url, help="base URL of a running code2wav serve, e.g. http://127.0.0.1:8091")
    p.add_argument("--streams", type=positive_int, default=32, help="workers, each opening stream after stream")
    p.add_argument("--seconds", type=positive_float, default=10.0)
    p.add_argument("--frames", type=positive_int, default=101, help="frames per stream (after the prefix)")
    p.add_argument("--chunks", default="1,25", help="chunk schedule, the last size repeating")
    p.add_argument("--prefix", type=non_negative_int, default=0, help="reference prefix frames per stream")
    p.add_argument("--voices", type=non_negative_int, default=0,
                   help="prefixes drawn from this many reference voices, the same in every loadtest process (0: each stream its own)")
    p.add_argument("--reuse-connections", action="store_true",
                   help="streams run on kept WebSocket connections (open with keep_open; the client keeps one per worker)")
    p.add_argument("--api-key", default=EnvDefault("CODE2WAV_API_KEY"), help="bearer token (default: $CODE2WAV_API_KEY)")
    p.add_argument("--json", default=None, help="also write the summary here")


def _run(url: str, work):
    """``asyncio.run(work)``, a server that cannot be reached or refuses the key turned into one
    error line (``CliError``) instead of a traceback."""
    import httpx

    try:
        return asyncio.run(work)
    except ServerError as e:
        if e.status == 401 or e.code == "unauthorized":
            raise CliError(f"{url} refused the request: 401 unauthorized ({e.message}); pass --api-key KEY or set CODE2WAV_API_KEY") from None
        raise CliError(f"{url} answered {e.status or e.close_code} {e.code}: {e.message}") from None
    except (httpx.TransportError, OSError) as e:
        raise CliError(f"cannot reach {url} ({str(e).strip() or type(e).__name__}); is code2wav serve running there?") from None


def main(args: argparse.Namespace) -> int:
    chunks = parse_ints(args.chunks, "--chunks")
    res = _run(args.server, load(args.server, args.streams, args.seconds, args.frames, chunks, args.prefix, args.api_key,
                                 reuse=args.reuse_connections, voices=args.voices))
    summary = res.summary()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(json_safe(summary), f, indent=2, allow_nan=False)
    mb = lambda d: d.get("process_resident_memory_bytes", float("nan")) / 2**20  # noqa: E731
    print(f"streams served {res.streams_served} in {res.seconds:.1f}s by {res.streams} workers; errors {res.errors or 0}")
    print(f"TTFP p50 {summary['ttfp_p50_ms']:.1f} ms, p99 {summary['ttfp_p99_ms']:.1f} ms; audio {res.audio_s:.1f}s ({summary['throughput_x']:.1f}x real time)")
    print(f"server RSS {mb(res.server_before):.0f} MiB -> {mb(res.server_after):.0f} MiB; slots in use "
          f"{res.server_before.get('code2wav_pool_slots_in_use')} -> {res.server_after.get('code2wav_pool_slots_in_use')}")
    if rates := summary["server"]:
        print(f"server steps {rates['steps_per_s']:.0f}/s, {rates['rows_per_step']:.1f} rows a step, device busy {rates['device_busy_pct']:.0f} % of the wall")
    return 1 if res.errors else 0


def service_bench(args: argparse.Namespace, prefixes: tuple[int, ...]) -> int:
    """The same workload through the service's WebSocket API, one row per level and prefix."""
    rows = []
    levels, chunks = parse_ints(args.levels, "--levels", "1,16,64"), parse_ints(args.chunks, "--chunks")
    out = out_dir(args.out, "--out")
    for pfx in prefixes:
        for c in levels:
            r = _run(args.server, fixed(args.server, c, args.frames, chunks, pfx, args.api_key))
            rows.append({"mode": "service", "concurrency": c, "prefix_frames": pfx, **r.summary()})
            print(json.dumps(json_safe(rows[-1])), flush=True)
    (out / "results.json").write_text(json.dumps(json_safe({"meta": {"server": args.server}, "results": rows}), indent=2, allow_nan=False))
    print(f"{'mode':<10}{'c':>5}{'pfx':>5}{'x RT':>9}{'TTFP p50':>10}{'TTFP p99':>10}{'errors':>8}")
    for r in rows:
        print(f"{r['mode']:<10}{r['concurrency']:>5}{r['prefix_frames']:>5}{r['throughput_x']:>9.1f}{r['ttfp_p50_ms']:>10.2f}{r['ttfp_p99_ms']:>10.2f}{sum(r['errors'].values()):>8}")
    return 1 if any(r["errors"] for r in rows) else 0
