"""One prefix-cache hit's restore (``StatePool.restore``), host and GPU: the one-launch kernel
(kernels/slot_copy.py, the default on CUDA; launched by its compiled launcher directly, and
through Triton's) against torch's foreach copy of the rows with the
position apart (``restore_rows``, the default before session 36). argv: [dtype, default bfloat16]
[calls, default 2000]. Output per form: us per call on the host (queued, not waited for) and on
the GPU (CUDA events around the calls, nothing else queued), and whether it wrote the snapshot
bit for bit. Then a stream restored from the cache against one prefilled from the same codes
(on CUDA, eager and through graphs, with the restore's own launch and inside the step,
``restores_in_step``): the same audio, bit for bit; and three cached streams whose first chunks
share a step (their restores all in its pairs) against the same three restored by launches of
their own, row by row, through graphs."""

from __future__ import annotations

import sys
import time

import torch

from code2wav.engine.graphs import GraphRunner
from code2wav.model.config import DecoderConfig
from code2wav.model.init import random_decoder
from code2wav.stream.engine import StreamEngine
from code2wav.stream.pool import StatePool


def main() -> int:
    dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    m = random_decoder(DecoderConfig()).to_dtypes(dtype, "cuda")
    pool = StatePool(m, 4)
    for b in [*pool.buffers.values(), pool.position]:
        b[1].copy_(torch.randint(-1000, 1000, b[1].shape, device="cuda").to(b.dtype))
    state = pool.snapshot(1)
    L = pool.layout

    def through_triton(slot: int, snap) -> None:  # the same kernel, launched by Triton's launcher
        L._launch(slot, snap.flat)

    forms = (
        ("kernel, its launcher called directly (default)", pool.restore),
        ("kernel, through Triton's launcher", through_triton),
        ("foreach rows + position", pool.restore_rows),
    )
    import triton

    print(f"direct launch in use: {L._direct is not None} (Triton {triton.__version__}; not in use because: {L.direct_off})", flush=True)
    for name, fn in forms:
        for _ in range(50):
            fn(2, state)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        for i in range(calls):
            fn(2 + i % 2, state)
        end.record()
        host = (time.perf_counter() - t0) / calls * 1e6
        torch.cuda.synchronize()
        exact = all(torch.equal(b[1], b[2]) and torch.equal(b[1], b[3]) for b in [*pool.buffers.values(), pool.position])
        print(
            f"{name}: {host:.1f} us host, {start.elapsed_time(end) / calls * 1e3:.1f} us GPU per hit "
            f"({len(pool.buffers)} buffers + the position); written bit for bit: {exact}",
            flush=True,
        )
    codes = torch.randint(0, 2048, (60, 16), generator=torch.Generator().manual_seed(0))
    for in_step in (False, True):
        for graphs in (False, True):
            engine = StreamEngine(m, max_streams=2, max_step_frames=32, prefix_cache_bytes=1 << 30, restores_in_step=in_step,
                                  runner=GraphRunner(m, StatePool(m, 2), batch_sizes=(1,), frame_sizes=(1, 32)) if graphs else None)
            if graphs:  # after the engine: with in_step, each graph captures the pairs kernel at its head
                engine.runner.capture(engine.prefill_shapes())
            audio = prefilled_then_restored(engine, codes)
            print(f"{'graphs' if graphs else 'eager'}, restores_in_step={in_step}: a restored stream's audio == a prefilled one's: "
                  f"{torch.equal(*audio)} ({engine.prefix_cache_stats()})", flush=True)
    print(f"the pairs kernel, three pairs: each slot written bit for bit (eager, in a CUDA graph): {pairs_written(m)}", flush=True)
    # Three streams opened with the same prefix whose first chunks share a step, in the same rows
    # and slots of the same 4-row graph: cached, their states written from the step's pairs;
    # cached, each written by a launch of its own before the step (the write kernel, checked bit
    # for bit above); prefilled with no cache (one batched prefill of three rows: in bfloat16 not
    # the bits of the one-row prefill the cache kept). Their inputs are identical, so within a run
    # any difference between rows is the step's own (a bfloat16 row's bits may depend on its row).
    audio = {}
    for name, cache, in_step in (("pairs", True, True), ("own launch", True, False), ("prefilled", False, False)):
        engine = StreamEngine(m, max_streams=4, max_step_frames=32, prefix_cache_bytes=(1 << 30) if cache else 0, restores_in_step=in_step,
                              runner=GraphRunner(m, StatePool(m, 4), batch_sizes=(4,), frame_sizes=(1, 32)))
        engine.runner.capture(engine.prefill_shapes())
        prefilled_then_restored(engine, codes)  # a miss, then a hit alone: the cache holds the voice
        rids = ["a", "b", "c"]
        for rid in rids:
            engine.open(rid, codes[:40])
        first, rest = engine.decode(dict.fromkeys(rids, codes[40:41])), engine.decode(dict.fromkeys(rids, codes[41:60]))
        audio[name] = [torch.cat([first[rid], rest[rid]]) for rid in rids]
        slots = [engine._streams[rid].slot for rid in rids]
        print(f"graphs, three streams in one step, {name} (slots {slots}): rows equal to the first row: "
              f"{[torch.equal(a, audio[name][0]) for a in audio[name]]} ({engine.prefix_cache_stats()}; "
              f"restores in steps off because: {engine.pool.in_step_off})", flush=True)
    same = [torch.equal(a, b) for a, b in zip(audio["pairs"], audio["own launch"])]
    print(f"graphs, three cached streams in one step, restored by the step's pairs == by their own launches, row by row: {same}", flush=True)
    return 0


def pairs_written(m, graphs: tuple[bool, ...] = (False, True)) -> list[bool]:
    """The pairs kernel (``SlotLayout.write_pairs``) given three pairs (two snapshots, slots 0, 2
    and 3) and an empty one, at both alignments a step's inputs give them, run eagerly and
    replayed from a CUDA graph: whether every named slot then holds its snapshot bit for bit."""
    pool = StatePool(m, 4)
    layout, device = pool.layout, pool.device  # built (and its write kernel warmed) first
    every = [*pool.buffers.values(), pool.position]
    got = []
    for graph in graphs:
        for at in (0, 1):
            for b in every:
                b.copy_(torch.randint(-1000, 1000, b.shape, device=device).to(b.dtype))
            snaps = [pool.snapshot(1), pool.snapshot(4)]
            want = {0: 0, 2: 1, 3: 0}
            buf = torch.zeros(at + 10, dtype=torch.long, device=device)
            pairs = buf[at : at + 10].view(5, 2)
            if graph:
                g = torch.cuda.CUDAGraph()
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    layout.write_pairs(pairs)  # compiled and warmed outside the capture
                torch.cuda.current_stream().wait_stream(s)
                with torch.cuda.graph(g):
                    layout.write_pairs(pairs)
            for b in every:  # the named slots scrambled again, so only the kernel can set them
                b[[0, 2, 3]] = 7
            pairs[:3] = torch.tensor([[snaps[want[slot]].flat.data_ptr(), slot] for slot in want], device=device)
            g.replay() if graph else layout.write_pairs(pairs)
            if device.type == "cuda":
                torch.cuda.synchronize()
            got.append(all(layout._holds(slot, snaps[want[slot]].flat) for slot in want))
    return got


def prefilled_then_restored(engine: StreamEngine, codes: torch.Tensor) -> list[torch.Tensor]:
    """The audio of a stream opened with ``codes[:40]`` (a miss: prefilled), then of another with
    the same prefix (a hit: restored), each decoding ``codes[40:60]`` as 1 then 19 frames."""
    audio = []
    for rid in ("prefilled", "restored"):
        engine.open(rid, codes[:40])
        audio.append(torch.cat([engine.push(rid, codes[40:41]), engine.push(rid, codes[41:60])]))
        engine.finish(rid)
    return audio


if __name__ == "__main__":
    sys.exit(main())
