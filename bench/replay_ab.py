"""A/B of layer choices by graph replay, interleaved in one process: each layout's model (the
same random weights) captures the shapes' graphs, then every round replays each shape under each
layout in turn (CUDA events, ``reps`` replays), in alternating order, so drifts of the clock or the
machine and the cost of going first fall on all of them alike. Prints per shape and layout the median over rounds, and the graph pools' sizes.
Layouts are bench/profile_step.py's (``channels_last-unitconv=0``, ...).
argv: [layouts, default channels_last,channels_last-skinnyhalf=0] [shapes, default 1x1,1x25,16x25,20x25,64x8]
[rounds, default 7] [reps, default 20]
"""

from __future__ import annotations

import statistics
import sys

import torch
from gpu_timing import captured_runner, shapes_arg, timed  # bench/ is the script's directory, first on sys.path
from profile_step import layer_choices

from code2wav.engine.graphs import use_expandable_segments
from code2wav.model.config import DecoderConfig
from code2wav.model.init import random_decoder
from code2wav.model.loading import configure_cuda
from code2wav.model.low_rate import auto_low_rate
from code2wav.stream.pool import StatePool


def main() -> int:
    layouts = (sys.argv[1] if len(sys.argv) > 1 else "channels_last,channels_last-skinnyhalf=0").split(",")
    shapes = shapes_arg(sys.argv[2] if len(sys.argv) > 2 else "1x1,1x25,16x25,20x25,64x8")
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 7
    reps = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    use_expandable_segments()
    dtype = torch.bfloat16
    configure_cuda(dtype)
    weights = random_decoder(DecoderConfig()).state_dict()
    graphs = {}
    for layout in layouts:
        _, choices = layer_choices(layout)
        m = random_decoder(DecoderConfig())
        m.load_state_dict(weights)
        m = m.to_dtypes(dtype, "cuda").set_layer_choices(choices)
        auto_low_rate(m)
        m.channels_last()
        graphs[layout] = captured_runner(m, StatePool(m, 64), shapes)
        print(f"{layout}: graph pool {graphs[layout].memory_bytes() / 2**20:.0f} MiB", flush=True)
    times: dict[tuple[str, tuple[int, int]], list[float]] = {}
    for r in range(rounds):
        for shape in shapes:
            for layout in layouts if r % 2 == 0 else layouts[::-1]:  # each layout first in half the rounds
                times.setdefault((layout, shape), []).append(timed(graphs[layout].graphs[shape].graph.replay, reps=reps))
    print(f"median us per replay over {rounds} rounds of {reps} (bf16)")
    print(f"{'shape':>6} " + " ".join(f"{layout:>24}" for layout in layouts))
    for b, t in shapes:
        print(f"{b:>3}x{t:<2} " + " ".join(f"{statistics.median(times[(layout, (b, t))]):>24.1f}" for layout in layouts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
