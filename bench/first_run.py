"""Where the first run of a new step shape spends its time (the cost a cold start pays per graph).

``python3 bench/first_run.py [dtype] [shape ...]`` (shapes as ``step:B:T``, ``front:B:T``): the
model loads, then each shape runs eagerly for the first time under cProfile (``GraphRunner.warm``:
two runs, on a side stream) and again (the second time, for comparison). Prints each shape's
first and second time and the functions the first run spent most in, grouped by where they
live (Triton's compiler and launcher, torch's ops, the rest), so the costly part is named. Run
it twice on a fresh machine: the second process finds Triton's on-disk cache warm.
``INSTANT=1``: the runs are in the instant forms (kernels/instant.py), as a warming engine's
eager steps are.
"""

from __future__ import annotations

import contextlib
import cProfile
import json
import os
import pstats
import sys
import time

import torch

from code2wav.engine.build import EngineConfig, load_model
from code2wav.engine.graphs import GraphRunner, use_expandable_segments
from code2wav.kernels import instant
from code2wav.model.loading import configure_cuda
from code2wav.stream.pool import StatePool

DEFAULT_SHAPES = ["step:1:1", "step:1:25", "step:8:25", "step:60:8", "step:16:4"]


def where(filename: str) -> str:
    if "triton" in filename:
        return "triton"
    if filename.startswith("~") or "torch" in filename:
        return "torch (ops, C++)"
    return "other python"


def main() -> None:
    dtype = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
    shapes = [(k, int(b), int(t)) for k, b, t in (s.split(":") for s in (sys.argv[2:] or DEFAULT_SHAPES))]
    use_expandable_segments()
    configure_cuda(getattr(torch, dtype))
    t = time.perf_counter()
    model = load_model(EngineConfig(device="cuda", dtype=dtype))
    torch.cuda.synchronize()
    print(f"load {time.perf_counter() - t:.2f} s")
    runner = GraphRunner(model, StatePool(model, 64))
    stream = runner.side_stream()
    forms = instant.forms if os.environ.get("INSTANT") == "1" else contextlib.nullcontext
    record = []
    for shape in shapes:
        prof = cProfile.Profile()
        t = time.perf_counter()
        with forms():
            prof.enable()
            runner.warm(shape, stream)
            prof.disable()
            first = time.perf_counter() - t
            t = time.perf_counter()
            runner.warm(shape, stream)
            second = time.perf_counter() - t
        stats = pstats.Stats(prof)
        groups: dict[str, float] = {}
        rows = []
        for (filename, line, name), (_, ncalls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
            groups[where(filename)] = groups.get(where(filename), 0.0) + tottime
            rows.append((tottime, ncalls, cumtime, f"{filename.rsplit('/', 2)[-1]}:{line}({name})"))
        print(
            f"\n=== {shape}: first {first:.3f} s, second {second:.3f} s; self time by place: "
            + ", ".join(f"{k} {v:.3f} s" for k, v in sorted(groups.items(), key=lambda kv: -kv[1]))
        )
        for tottime, ncalls, cumtime, name in sorted(rows, reverse=True)[:14]:
            print(f"  {tottime:7.3f} s self {cumtime:7.3f} s cum {ncalls:6d} calls  {name}")
        record.append({"shape": shape, "first_s": first, "second_s": second, "groups": groups})
    print(json.dumps(record))


if __name__ == "__main__":
    main()
