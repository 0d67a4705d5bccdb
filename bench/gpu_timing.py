"""Timing one GPU call with CUDA events (for the bench/ scripts): launched one by one, or
replayed from a CUDA graph (so launch gaps are the GPU's, as in a step's graph)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def shapes_arg(text: str) -> list[tuple[int, int]]:
    """``"16x25,20x25"`` as ``[(16, 25), (20, 25)]`` (rows x frames), the scripts' shape lists."""
    return [(int(b), int(t)) for b, t in (s.split("x") for s in text.split(","))]


def bf16_default(slots: int = 64):
    """The default load in bf16 on CUDA (the embedded random weights, float16 low-rate stages
    where ``auto`` picks them), with expandable segments on, and a state pool of ``slots``."""
    from code2wav.engine.graphs import use_expandable_segments
    from code2wav.model.loading import configure_cuda, load_decoder
    from code2wav.stream.pool import StatePool

    use_expandable_segments()
    configure_cuda(torch.bfloat16)
    model = load_decoder(None, device="cuda", dtype=torch.bfloat16)
    return model, StatePool(model, slots)


def captured_runner(model, pool, shapes: list[tuple[int, int]]):
    """A GraphRunner over ``pool`` with exactly ``shapes`` as its buckets (no budget-filling
    extras), every one captured, in a memory pool of its own."""
    from code2wav.engine.graphs import GraphRunner

    runner = GraphRunner(model, pool, batch_sizes=tuple(b for b, _ in shapes), frame_sizes=tuple(t for _, t in shapes),
                         max_batch_frames=max(b * t for b, t in shapes))
    runner.buckets = sorted(set(shapes), key=lambda bt: (bt[1], bt[0]))
    runner.capture()
    return runner


def timed(fn: Callable[[], object], reps: int = 20, warmup: int = 3) -> float:
    """Mean GPU time of ``fn()`` in microseconds, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1e3


def timed_in_graph(fn: Callable[[], object], calls: int = 50, replays: int = 10) -> float:
    """Mean GPU time of ``fn()`` in microseconds, ``calls`` of it captured in one CUDA graph
    (after 3 warm-up calls on a side stream) and the graph replayed ``replays`` times."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * calls)


def sweep_options(args: list[str]) -> tuple[tuple[int, int] | None, str | None]:
    """A tile sweep's options, taken out of ``args``: ``--compile-only I/N`` (compile the I-th of
    N shares and exit: N processes fill Triton's cache side by side before the timed run) and
    ``--tiles-out FILE`` (the best tiles as JSON)."""
    share, tiles_out = None, None
    if "--tiles-out" in args:
        i = args.index("--tiles-out")
        tiles_out = args[i + 1]
        del args[i : i + 2]
    if "--compile-only" in args:
        i = args.index("--compile-only")
        share = tuple(int(v) for v in args[i + 1].split("/"))
        del args[i : i + 2]
    return share, tiles_out  # type: ignore[return-value]


def ranked_tiles(tiles: list, run: Callable[[object], object], title: str) -> tuple[list, dict]:
    """Each of ``tiles`` timed by ``run(tile)`` replayed from a graph (a tiling that fails to
    compile or launch is reported and ranked last); prints ``title`` and the best five; returns
    the tilings fastest first and their times in microseconds."""
    times = {}
    for t in tiles:
        try:
            times[t] = timed_in_graph(lambda: run(t), calls=10, replays=5)
        except Exception as e:  # out of shared memory / registers for this tile
            times[t] = float("inf")
            print(f"  tile {t}: {type(e).__name__}: {str(e)[:80]}")
    ranked = sorted(times, key=times.get)
    print(title)
    for t in ranked[:5]:
        print(f"      {times[t]:8.1f} us  {t}")
    return ranked, times
