"""The server's CPU per stream: what a connection costs alone and what its chunks add.

``python bench/server_cost.py PID [--url URL] [--streams N] [--at-once C]`` runs N WebSocket
streams against a running server (C at a time), twice: empty streams (connect, ``open``,
``end``, close) and streams of 101 frames in chunks of 1 then 25 (each chunk's audio awaited
before the next push), and prints each run's streams per second and the server process's CPU
time per stream (user + system, from ``/proc/PID/stat``: the event loop's and the worker's
threads together). Against ``bench/service_host.py serve`` (a simulated device) the CPU is the
host side alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import numpy as np

from code2wav.client import AsyncClient


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


async def run(url: str, pid: int, n: int, at_once: int, chunks: list[int]) -> tuple[float, float]:
    """(streams per second, server CPU ms per stream)."""
    codes = np.random.default_rng(0).integers(0, 2048, (sum(chunks) or 1, 16))
    async with AsyncClient(url) as client:

        async def worker() -> None:
            for _ in range(n // at_once):
                async with client.stream(format="pcm_s16le") as s:
                    at = 0
                    for k in chunks:
                        await s.push(codes[at : at + k])
                        await s.recv_audio()
                        at += k
                    await s.end()

        c0, t0 = cpu_seconds(pid), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(at_once)))
        wall, cpu = time.perf_counter() - t0, cpu_seconds(pid) - c0
    done = n // at_once * at_once
    return done / wall, cpu / done * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pid", type=int, help="the server's process id")
    p.add_argument("--url", default="http://127.0.0.1:8091")
    p.add_argument("--streams", type=int, default=300)
    p.add_argument("--at-once", type=int, default=8)
    args = p.parse_args()
    for name, chunks in (("empty (open, end, close)", []), ("101 frames (1 + 4 x 25)", [1, 25, 25, 25, 25])):
        rate, ms = asyncio.run(run(args.url, args.pid, args.streams, args.at_once, chunks))
        print(f"{name:>26}: {rate:6.0f} streams/s, server CPU {ms:.2f} ms a stream ({args.at_once} at once)", flush=True)


if __name__ == "__main__":
    main()
