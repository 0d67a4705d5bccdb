"""Slow, idle and non-reading clients against a running ``code2wav serve``: how long the server
keeps them (issue 17, item 4). Client side only, on loopback:

- slowloris: N connections each send half a request line and then nothing; the time until the
  server has closed them all (``--read-timeout``), or how many are still open at ``--wait``;
- a WebSocket client that opens, pushes chunks and never reads: the time until its slot is free
  again (``--send-timeout``) and the chunks decoded for it meanwhile;
- a WebSocket client silent after its first audio: the time from that audio to its
  ``idle_timeout`` close (``--idle-timeout``).

python bench/slow_clients.py --server http://127.0.0.1:8091 [--api-key KEY] [--slowloris 50] [--wait 150]
"""

from __future__ import annotations

import argparse
import json
import re
import select
import socket
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from code2wav.client import frames_bytes  # noqa: E402


def metric(url: str, headers: dict, name: str) -> float:
    text = httpx.get(url + "/metrics", headers=headers, timeout=10).text
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def slowloris(host: str, port: int, n: int, wait: float) -> dict:
    socks = [socket.create_connection((host, port), timeout=10) for _ in range(n)]
    for s in socks:
        s.sendall(b"GET /heal")
    t0, open_ = time.monotonic(), set(range(n))
    while open_ and time.monotonic() - t0 < wait:
        ready, _, _ = select.select([socks[i] for i in open_], [], [], 0.5)
        for s in ready:
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if not data:
                open_.discard(socks.index(s))
    for s in socks:
        s.close()
    return {"connections": n, "still_open": len(open_), "seconds": round(time.monotonic() - t0, 2)}


def never_reads(ws_url: str, url: str, headers: dict, frames: int, chunks: int, wait: float) -> dict:
    from websockets.sync.client import connect

    codes = np.random.default_rng(0).integers(0, 2048, (frames, 16))
    before = metric(url, headers, "code2wav_chunks_total")
    with connect(ws_url, additional_headers=headers, compression=None) as ws:
        ws.send(json.dumps({"op": "open"}))
        ws.recv(timeout=30)
        t0 = time.monotonic()

        def push() -> None:  # from a thread: once the server stops reading, a send blocks
            try:
                for _ in range(chunks):
                    ws.send(frames_bytes(codes))
            except Exception:
                pass  # dropped by the server

        threading.Thread(target=push, daemon=True).start()
        time.sleep(0.5)
        while metric(url, headers, "code2wav_pool_slots_in_use") > 0 and time.monotonic() - t0 < wait:
            time.sleep(0.2)
        freed = metric(url, headers, "code2wav_pool_slots_in_use") == 0
        seconds = round(time.monotonic() - t0, 2)
    return {"chunks_pushed": chunks, "frames_per_chunk": frames, "slot_freed": freed, "seconds": seconds,
            "chunks_decoded": metric(url, headers, "code2wav_chunks_total") - before}


def silent_after_audio(ws_url: str, headers: dict, wait: float) -> dict:
    from websockets.sync.client import connect

    with connect(ws_url, additional_headers=headers, compression=None) as ws:
        ws.send(json.dumps({"op": "open"}))
        ws.recv(timeout=30)
        ws.send(frames_bytes(np.zeros((2, 16), np.int16)))
        ws.recv(timeout=30)
        t_audio = time.monotonic()
        try:
            msg = ws.recv(timeout=wait)
        except TimeoutError:
            msg = None
    return {"closed_with": json.loads(msg)["code"] if msg else None, "seconds_after_audio": round(time.monotonic() - t_audio, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default="http://127.0.0.1:8091")
    p.add_argument("--api-key", default=None)
    p.add_argument("--slowloris", type=int, default=50, help="slowloris connections")
    p.add_argument("--frames", type=int, default=25, help="frames per chunk of the non-reading client")
    p.add_argument("--chunks", type=int, default=400, help="chunks the non-reading client pushes")
    p.add_argument("--wait", type=float, default=150, help="the longest wait for each event, seconds")
    a = p.parse_args()
    url = a.server.rstrip("/")
    u = urlparse(url)
    headers = {"Authorization": f"Bearer {a.api_key}"} if a.api_key else {}
    ws_url = url.replace("http://", "ws://") + "/v1/stream"
    out = {
        "slowloris": slowloris(u.hostname, u.port, a.slowloris, a.wait),
        "never_reads": never_reads(ws_url, url, headers, a.frames, a.chunks, a.wait),
        "silent_after_audio": silent_after_audio(ws_url, headers, a.wait),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
