"""Host time of a prefix-cache hit's lookup (``PrefixCache.get``: the key of the prefix's codes,
the entry, the codes compared), on whatever CPU runs it, beside the blake2b key it used before
session 35 and the tensor comparison it kept until session 36. argv: [frames, default 200] [calls, default 5000]. Output: us per call."""

from __future__ import annotations

import hashlib
import sys
import time

import torch

from code2wav.stream.pool import Snapshot
from code2wav.stream.prefix_cache import PrefixCache


def per_call(fn, calls: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> int:
    frames = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 5000
    codes = torch.randint(0, 2048, (frames, 16))
    cache = PrefixCache(1 << 30, code_bound=2048)  # the codebook's size
    cache.put(codes, Snapshot(torch.zeros(4, dtype=torch.int16), {}))  # the state's size does not enter a lookup
    asked = codes.clone()  # a new request's own tensor, equal codes
    assert cache.get(asked) is not None
    blake = lambda: hashlib.blake2b(asked.contiguous().numpy().tobytes(), digest_size=16).hexdigest()  # noqa: E731
    print(f"{frames} x 16 codes: get (a hit) {per_call(lambda: cache.get(asked), calls):.1f} us; its key "
          f"{per_call(lambda: cache._key(asked), calls):.1f} us; a blake2b key (before) {per_call(blake, calls):.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
