"""What a WebSocket ``open``'s reference prefix costs the event loop to read, as JSON rows or as
the binary message after ``prefix_frames`` (``server/ws.py``'s own parse and checks).

``python bench/prefix_parse.py [FRAMES ...]`` prints the microseconds per open for each (default:
72 and 200 frames). The loop runs this once per prefixed stream, before the stream's first chunk.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from code2wav.codes import as_frames
from code2wav.server.payloads import parse_json


def per_call_us(fn, n: int = 300) -> float:
    fn()  # the first call imports what it needs
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def main(frames: list[int]) -> None:
    for p in frames:
        codes = np.random.default_rng(0).integers(0, 2048, (p, 16))
        text = json.dumps({"op": "open", "prefix": codes.tolist()})
        raw = codes.astype("<i2").tobytes()
        rows = per_call_us(lambda: as_frames(parse_json(text, "message")["prefix"], 16, 2048, "prefix", allow_empty=True))
        binary = per_call_us(lambda: as_frames(np.frombuffer(raw, "<i2").reshape(-1, 16).copy(), 16, 2048, "prefix", allow_empty=True))
        print(f"{p:>5} frames: JSON rows {rows:8.1f} us ({len(text)} bytes), binary {binary:6.1f} us ({len(raw)} bytes)")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [72, 200])
