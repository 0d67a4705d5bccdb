"""Would steps on two CUDA streams fill each other's gaps? Today every step runs on one stream,
so a step's latency-bound stretches (a large step's transformer, the whole of a first-chunk
step of a few one-frame rows) leave most of the GPU idle. Two steps on two streams may overlap
only if their graphs own separate memory pools, which this captures. Per pair of shapes (a
large step L, a small step S), graph replays, ms per iteration over N iterations:

- ``L`` alone, ``S`` alone (one stream, back to back);
- ``L + S serial``: one L then one S on one stream (the engine's order today);
- ``L | S``: L on the main stream, S on a side stream at high priority, launched just after it;
- ``L | L``: two copies of L (their own pools) on two streams, alternating: a step's front
  beside the other's back.

Steps here write only the pool's scratch slot (no new frames): timing, not audio.
argv: [large shapes, default 19x25,16x25] [small shapes, default 16x1,8x1,2x1] [iterations, default 40]
"""

from __future__ import annotations

import sys

import torch
from gpu_timing import bf16_default, captured_runner, shapes_arg  # bench/ is the script's directory, first on sys.path


def per_iteration(fn, n: int, streams: list[torch.cuda.Stream]) -> float:
    """ms per call of ``fn(i)`` over ``n`` calls, from the main stream's start event to the
    moment every stream in ``streams`` is done (two warm-up calls first)."""
    main = torch.cuda.current_stream()
    for i in range(2):
        fn(i)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(main)
    for s in streams:
        s.wait_stream(main)
    for i in range(n):
        fn(i)
    for s in streams:
        main.wait_stream(s)
    end.record(main)
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def main() -> int:
    large = shapes_arg(sys.argv[1] if len(sys.argv) > 1 else "19x25,16x25")
    small = shapes_arg(sys.argv[2] if len(sys.argv) > 2 else "16x1,8x1,2x1")
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    model, pool = bf16_default()
    every = large + small
    a, b = captured_runner(model, pool, every), captured_runner(model, pool, every)  # two graph pools
    main_stream = torch.cuda.current_stream()
    side = torch.cuda.Stream(priority=-1)
    side_normal = torch.cuda.Stream()
    print(f"{model.dtype}, low-rate stages {model.low_rate_dtype}; ms per iteration over {n}; graph pools "
          f"{a.memory_bytes() / 2**20:.0f} + {b.memory_bytes() / 2**20:.0f} MiB")

    for L in large:
        gl, gl2 = a.graphs[L], b.graphs[L]
        t_l = per_iteration(lambda i: gl.graph.replay(), n, [])

        def alternate(i: int) -> None:
            if i % 2 == 0:
                gl.graph.replay()
            else:
                with torch.cuda.stream(side_normal):
                    gl2.graph.replay()

        t_ll = per_iteration(alternate, n, [side_normal])
        print(f"{L[0]}x{L[1]}: alone {t_l:.3f}; two copies alternating on two streams {t_ll:.3f} a step "
              f"({100 * (t_l - t_ll) / t_l:+.1f} %)")
        for S in small:
            gs = b.graphs[S]
            t_s = per_iteration(lambda i: gs.graph.replay(), n, [])

            def serial(i: int) -> None:
                gl.graph.replay()
                gs.graph.replay()

            def beside(stream: torch.cuda.Stream):
                def fn(i: int) -> None:
                    gl.graph.replay()
                    with torch.cuda.stream(stream):
                        gs.graph.replay()
                return fn

            t_serial = per_iteration(serial, n, [])
            t_hi = per_iteration(beside(side), n, [side])
            t_norm = per_iteration(beside(side_normal), n, [side_normal])
            print(f"  + {S[0]}x{S[1]} (alone {t_s:.3f}): serial {t_serial:.3f}, beside at high priority {t_hi:.3f} "
                  f"(hides {100 * (t_serial - t_hi) / t_s:.0f} % of it), at normal priority {t_norm:.3f}")
    del main_stream
    return 0


if __name__ == "__main__":
    sys.exit(main())
