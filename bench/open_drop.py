"""Server memory over many WebSocket streams that open and are dropped by their clients.

Each cycle opens a stream, pushes one chunk, and drops the connection without ``end`` (every
other cycle before its audio arrives). Reports the server's resident memory and slots in use
(from ``/metrics``) at the start, after every quarter of the cycles, and at the end.

    python bench/open_drop.py --server http://127.0.0.1:8091 [--cycles 2000] [--api-key KEY]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import httpx
import numpy as np
from websockets.sync.client import connect


def gauges(url: str, headers: dict[str, str]) -> dict[str, float]:
    text = httpx.get(url + "/metrics", headers=headers, timeout=30).text
    want = ("process_resident_memory_bytes", "code2wav_pool_slots_in_use", "code2wav_active_streams")
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in want:
            out[name] = float(value)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default="http://127.0.0.1:8091")
    p.add_argument("--cycles", type=int, default=2000)
    p.add_argument("--api-key", default=os.environ.get("CODE2WAV_API_KEY"))
    args = p.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    ws_url = args.server.replace("http", "ws", 1) + "/v1/stream"
    frames = np.random.default_rng(0).integers(0, 2048, (2, 16)).astype("<i2").tobytes()
    rows = [(0, gauges(args.server, headers))]
    t0 = time.perf_counter()
    for i in range(args.cycles):
        with connect(ws_url, additional_headers=headers, compression=None) as ws:
            ws.send(json.dumps({"op": "open"}))
            json.loads(ws.recv(timeout=30))  # opened
            ws.send(frames)
            if i % 2:
                ws.recv(timeout=30)  # its audio, then the drop
            ws.socket.close()  # no end, no close handshake: a dropped client
        if (i + 1) % max(1, args.cycles // 4) == 0:
            time.sleep(1.0)  # the server notices the last drops
            rows.append((i + 1, gauges(args.server, headers)))
    took = time.perf_counter() - t0
    print(f"{args.cycles} open/drop cycles in {took:.1f} s")
    print(f"{'cycles':>7}{'RSS MiB':>10}{'slots in use':>14}{'streams':>9}")
    for n, g in rows:
        print(f"{n:>7}{g.get('process_resident_memory_bytes', float('nan')) / 2**20:>10.1f}"
              f"{g.get('code2wav_pool_slots_in_use', float('nan')):>14.0f}{g.get('code2wav_active_streams', float('nan')):>9.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
