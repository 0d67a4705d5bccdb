"""How long one full garbage-collector pass takes in a process holding a built engine, with the
heap frozen at build (``gc_freeze``) and without: the pass holds the GIL, so a step's launch and
the event loop's deliveries both wait it out (BENCHMARKS.md, the collector).

    python3 bench/gc_pause.py [--device cuda] [--streams 512] [--objects 20000]

``--objects``: long-lived objects made after the build (what serving keeps: per-stream state).
"""

from __future__ import annotations

import argparse
import gc
import json
import time

from code2wav.engine.build import EngineConfig, build_engine, freeze_heap, thaw_heap


def full_pass_ms(repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        gc.collect()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--objects", type=int, default=20000)
    a = p.parse_args()
    dtype = a.dtype or ("bfloat16" if a.device.startswith("cuda") else "float32")
    engine = build_engine(EngineConfig(device=a.device, dtype=dtype, max_streams=a.streams, graphs=False))
    out = {"device": a.device, "dtype": dtype, "streams": a.streams, "objects_after_build": a.objects}
    for frozen in (False, True):
        if frozen:
            freeze_heap()
            out["frozen_objects"] = gc.get_freeze_count()
        kept, sfx = [{"n": [i]} for i in range(a.objects)], "_frozen" if frozen else ""
        out[f"heap_objects{sfx}"] = len(gc.get_objects())
        out[f"full_pass{sfx}_ms"] = round(full_pass_ms(), 2)
        del kept
    thaw_heap()
    print(json.dumps(out))
    del engine


if __name__ == "__main__":
    main()
