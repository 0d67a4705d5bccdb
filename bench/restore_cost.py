"""The worker's host time for one prefix-cache hit: ``StatePool.restore`` (the rows in one fused
foreach copy, the int64 position apart) against the same copy with the position in the list
(one mixed-dtype list: torch's foreach copy then copies tensor by tensor). argv: [dtype, default
bfloat16] [calls, default 2000]. Output: us per call, host side (the copies are queued, not
waited for, except once at the end)."""

from __future__ import annotations

import sys
import time

import torch

from code2wav.model.config import DecoderConfig
from code2wav.model.init import random_decoder
from code2wav.stream.pool import StatePool


def main() -> int:
    dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    m = random_decoder(DecoderConfig()).to_dtypes(dtype, "cuda")
    pool = StatePool(m, 4)
    state = pool.snapshot(1)

    def mixed(slot: int) -> None:
        rows, position = pool._rows[slot]
        torch._foreach_copy_([*rows, position], [*(state[k] for k in pool.buffers), state["position"]], non_blocking=True)

    for name, fn in (("restore (rows fused, position apart)", lambda s: pool.restore(s, state)), ("one mixed-dtype list", mixed)):
        for _ in range(50):
            fn(2)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(calls):
            fn(2 + i % 2)
        host = (time.perf_counter() - t0) / calls * 1e6
        torch.cuda.synchronize()
        print(f"{name}: {host:.1f} us host per hit ({len(pool.buffers)} buffers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
