"""The time from SIGTERM to exit of a ``code2wav serve`` process with streams in flight (CPU).

Starts a server on 127.0.0.1 (the tests' shrunk random checkpoint unless ``--model``), opens
``--streams`` WebSocket streams that keep pushing chunks and ``--http`` POST /v1/decode requests
of ``--http-frames`` frames each, and once every stream has had audio back and every request is
decoding, sends SIGTERM. Prints, per round: the seconds from the signal to the process's exit,
its exit status, the seconds until the last WebSocket stream saw its close, and what the clients
got (WebSocket: error code and close code; HTTP: status). Pass ``--shutdown-timeout none`` to
run a server without that option (the code before it).

    PYTHONPATH=$PWD python bench/shutdown.py [--streams 8] [--http 2] [--http-frames 20000]
                                             [--shutdown-timeout 5] [--rounds 3] [--model PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import websockets

Q, SPF = 16, 1920


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model: str, timeout: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "code2wav.cli", "serve", "--model", model, "--port", str(port), "--log-level", "warning"]
    if timeout != "none":
        cmd += ["--shutdown-timeout", timeout]
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):  # bounded: 120 s
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("server not ready after 120 s")


async def ws_stream(url: str, rng: np.random.Generator, ready: asyncio.Event, count: list[int], out: list) -> None:
    """Pushes 4-frame chunks back to back until the server ends the stream."""
    async with websockets.connect(url.replace("http", "ws") + "/v1/stream", max_size=None) as ws:
        await ws.send(json.dumps({"op": "open"}))
        await ws.recv()
        got, err = 0, None
        try:
            while True:
                await ws.send(rng.integers(0, 2048, (4, Q), dtype="<i2").tobytes())
                msg = await ws.recv()
                if isinstance(msg, str):
                    err = json.loads(msg).get("code")
                    break
                got += 1
                if got == 1:
                    count[0] += 1
                    if count[0] == count[1]:
                        ready.set()
            await ws.recv()
        except websockets.ConnectionClosed:
            pass
        out.append((err, ws.close_code, time.monotonic()))


async def http_decode(url: str, frames: int, rng: np.random.Generator, out: list) -> None:
    buf = io.BytesIO()
    np.save(buf, rng.integers(0, 2048, (frames, Q), dtype=np.int16))
    async with httpx.AsyncClient(timeout=600) as c:
        try:
            r = await c.post(url + "/v1/decode", content=buf.getvalue(), headers={"Content-Type": "application/x-npy"})
            out.append(r.status_code if r.status_code == 200 else f"{r.status_code} {r.json().get('code')}")
        except httpx.HTTPError as e:
            out.append(type(e).__name__)


async def active(url: str) -> int:
    async with httpx.AsyncClient(timeout=10) as c:
        return int((await c.get(url + "/health")).json()["active_streams"])


async def one_round(args, model: str, log: Path) -> dict:
    proc, url = start(model, args.shutdown_timeout, log)
    rng = np.random.default_rng(0)
    ready, count = asyncio.Event(), [0, args.streams]
    ws_out: list = []
    http_out: list = []
    tasks = [asyncio.create_task(ws_stream(url, rng, ready, count, ws_out)) for _ in range(args.streams)]
    tasks += [asyncio.create_task(http_decode(url, args.http_frames, rng, http_out)) for _ in range(args.http)]
    if args.streams:
        await asyncio.wait_for(ready.wait(), 120)
    for _ in range(1200):  # every HTTP request decoding (open streams = WS + HTTP)
        if await active(url) >= args.streams + args.http:
            break
        await asyncio.sleep(0.1)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc = await asyncio.to_thread(proc.wait, 600)
    t_exit = time.monotonic() - t0
    await asyncio.wait(tasks, timeout=60)
    return {
        "exit_s": round(t_exit, 2),
        "status": rc,
        "last_ws_close_s": round(max(t for *_, t in ws_out) - t0, 3) if ws_out else None,
        "ws": dict(collections.Counter(f"{e} {c}" for e, c, _ in ws_out)),
        "http": dict(collections.Counter(map(str, http_out))),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--http", type=int, default=2)
    p.add_argument("--http-frames", type=int, default=20_000)
    p.add_argument("--shutdown-timeout", default="5", help="seconds, or none: start the server without the option")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default=None)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model = args.model
        if model is None:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from tests.models import write_checkpoint

            model = str(write_checkpoint(Path(d) / "tokenizer"))
        print(f"cpu cores {os.cpu_count()}; {args.streams} WebSocket streams, {args.http} x {args.http_frames}-frame HTTP decodes; "
              f"--shutdown-timeout {args.shutdown_timeout}")
        for i in range(args.rounds):
            print(json.dumps(asyncio.run(one_round(args, model, Path(d) / f"server{i}.log"))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
