"""A stream's ``open`` on the caller's thread, with and without a cached reference prefix, and the
bench's drawing of one stream's codes (its prefix rows included): host work on the event loop's
thread for each stream a client opens. CPU, the shrunk test model (``open`` does no decoder work).
argv: [prefix frames, default 200] [calls, default 3000]. Output: us per call, twice."""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from code2wav.stream.engine import StreamEngine
from tests.models import SMALL, model


def per_call_us(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> int:
    frames = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    engine = StreamEngine(model(SMALL, torch.float32), max_streams=4, prefix_cache_bytes=1 << 30)
    prefix = np.random.default_rng(7).integers(0, SMALL.codebook_size, (frames, SMALL.num_quantizers))
    engine.open("warm", prefix)  # its first chunk prefills the prefix: cached from then on
    engine.push("warm", prefix[:1])
    engine.finish("warm")
    rng = np.random.default_rng(0)

    def opened(p):
        def once(i: int) -> None:
            engine.open(f"s{i}", p)
            engine.abort(f"s{i}")

        return once

    for _ in range(2):
        print(f"open + abort, no prefix: {per_call_us(opened(None), calls):.1f} us; a cached {frames}-frame prefix: "
              f"{per_call_us(opened(prefix), calls):.1f} us; the bench's codes for a 101-frame stream: "
              f"{per_call_us(lambda i: rng.integers(0, 2048, (101, 16)), calls):.1f} us, with the prefix rows: "
              f"{per_call_us(lambda i: rng.integers(0, 2048, (frames + 101, 16)), calls):.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
