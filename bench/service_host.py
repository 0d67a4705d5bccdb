"""The service's host side alone: ``code2wav serve``'s app over an engine whose device is simulated,
so that on a CPU machine the server (event loop, WebSocket, hand-offs, the GIL) is the limit,
not the decoder.

A step validates, stages and hands rows back as a real one does, returns silence of its shape
(bfloat16, as on a GPU, so the worker's PCM conversion is real work), and sleeps for the device
time instead of computing: ``--step-ms A,B`` is A ms per step plus B ms per row (the default is
roughly the H200's bf16 step: ~1.5 ms at one row, ~7.7 ms at 16). The sleep releases the GIL, as a
worker waiting on a CUDA sync does.

``python bench/service_host.py serve [--port 8091] [--max-streams 256] [--step-ms A,B] [--loop L] [--ws W]``
serves it until SIGTERM; load it with ``bench/service_load.py``.
``python bench/service_host.py inproc [--levels 1,64,256] [--seconds 8] [--step-ms A,B] [--chunks 1,25]
[--prefix 0,200,200,0 --voices 8 --prefix-cache-bytes N [--free-restores | --restore-launches] [--in-step]]`` runs the same workload on the
``AsyncEngine`` in this process, no server: the ceiling the service is measured against, and the
host side of a cached voice against none (a restore on CPU is the foreach copy, not the GPU's).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import torch

from code2wav.model.config import DecoderConfig
from code2wav.model.decoder import Decoder
from code2wav.stream.engine import StreamEngine
from code2wav.stream.pool import StatePool
from code2wav.stream.runner import EagerRunner

# Widths are irrelevant (no decoder runs); the pool is small, the audio its real size.
TINY = DecoderConfig(latent_dim=16, hidden_size=16, num_attention_heads=2, num_key_value_heads=2, head_dim=8, intermediate_size=16,
                     decoder_dim=16, codebook_dim=16, num_hidden_layers=1)


class SimulatedDevice(EagerRunner):
    """Moves a step's inputs as the eager runner does, sleeps for the device's time, returns silence."""

    def __init__(self, model: Decoder, pool: StatePool, base_s: float, per_row_s: float):
        super().__init__(model, pool)
        self.base_s, self.per_row_s = base_s, per_row_s

    def __call__(self, codes: torch.Tensor, slots: torch.Tensor, n_new: torch.Tensor) -> torch.Tensor:
        codes, slots, n_new = self.pool._inputs(codes, slots, n_new)
        time.sleep(self.base_s + self.per_row_s * codes.shape[0])
        return torch.zeros(codes.shape[0], codes.shape[2] * self.model.config.samples_per_frame, dtype=torch.bfloat16)


def build_core(max_streams: int, step_ms: str, max_batch_frames: int = 512, prefix_cache_bytes: int = 0,
               restores_in_step: bool = False) -> StreamEngine:
    base, per_row = (float(x) / 1e3 for x in step_ms.split(","))
    model = Decoder(TINY)
    model.fold()  # a reference prefix's prefill runs the (tiny) model's front for real
    pool = StatePool(model, max_streams)
    return StreamEngine(model, runner=SimulatedDevice(model, pool, base, per_row), max_step_frames=32, max_batch_frames=max_batch_frames,
                        prefix_cache_bytes=prefix_cache_bytes, restores_in_step=restores_in_step)


def emulate_restores_in_step() -> None:
    """``restores_in_step`` on CPU, for timing: the stager puts hits into the steps' restore pairs
    as on a GPU, and the pairs kernel (which the simulated device would never run) does nothing."""
    from code2wav.kernels import slot_copy

    slot_copy.applies = lambda device: True
    slot_copy.SlotLayout.warm = slot_copy.SlotLayout.write_pairs = lambda self, *a: None
    slot_copy.SlotLayout.check_pairs = lambda self, slot: None  # the engine's check of that kernel passes


def serve(args: argparse.Namespace) -> int:
    from code2wav.engine.async_engine import AsyncEngine
    from code2wav.server.app import Limits, create_app
    from code2wav.server.connections import uvicorn_settings
    from code2wav.server.run import serve as run

    torch.set_num_threads(1)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval / 1e3)
    core = build_core(args.max_streams, args.step_ms, args.max_batch_frames)
    limits = Limits(max_connections=4 * args.max_streams + 64)
    app = create_app(AsyncEngine(core, max_pending_chunks=16), limits=limits)
    settings = uvicorn_settings(limits, ws=args.ws) if args.ws else uvicorn_settings(limits)
    loop = {"loop": args.loop} if args.loop else {}  # else serve's default (auto)
    print(f"simulated device, step {args.step_ms} ms (base, per row); serving on :{args.port}", file=sys.stderr, flush=True)
    if not args.profile:
        return run(app, host="127.0.0.1", port=args.port, shutdown_timeout=2.0, ws_max_size=8 << 20, log_level="warning", transport=settings, **loop)
    import cProfile

    prof = cProfile.Profile()  # the event loop's thread only (the worker's is not traced)
    try:
        return prof.runcall(run, app, host="127.0.0.1", port=args.port, shutdown_timeout=2.0, ws_max_size=8 << 20, log_level="warning",
                            transport=settings, **loop)
    finally:
        prof.dump_stats(args.profile)


def inproc(args: argparse.Namespace) -> int:
    from code2wav.bench import _workload

    torch.set_num_threads(1)
    levels = [int(x) for x in args.levels.split(",")]
    chunks = [int(x) for x in args.chunks.split(",")]
    prefixes = [int(x) for x in args.prefix.split(",")]
    if args.in_step:
        emulate_restores_in_step()
    # On the class, before the engine is built (a stager may keep the bound method): timing only, the simulated device reads no state.
    if args.free_restores:  # a hit's copy costs no host time, as on a GPU with the copy inside the step
        StatePool.restore = lambda self, slot, state: None
    if args.restore_launches:  # a hit's copy is a launch on the worker: it lets go of the GIL (as Triton's launcher does), nothing more
        StatePool.restore = lambda self, slot, state: time.sleep(0)
    core = build_core(max(levels), args.step_ms, args.max_batch_frames, args.prefix_cache_bytes, restores_in_step=args.in_step)
    if args.voices and max(prefixes):  # every voice's state in the cache before the timed runs
        for v in range(0, args.voices, 4):
            asyncio.run(_workload(core, 4, 30, chunks, max(prefixes), 0.0, seed=99, voices=args.voices, first_voice=v))
    print(f"{'c':>5}{'prefix':>7}{'x RT':>9}{'steps/s':>9}{'rows/step':>10}{'TTFP p50 ms':>13}{'CPU us/stream':>15}")
    for c in levels:
        for prefix in prefixes:  # e.g. 0,200,200,0: drift within the process falls on both alike
            cpu = time.process_time()
            m = asyncio.run(_workload(core, c, 101, chunks, prefix, 0.002, seed=c, seconds=args.seconds, voices=args.voices))
            cpu = (time.process_time() - cpu) / max(1, m.streams) * 1e6  # both threads, the streams ended in the run
            ttfp = sorted(m.ttfp)[len(m.ttfp) // 2] * 1e3 if m.ttfp else float("nan")
            rows = sum(m.rows) / max(1, len(m.rows))
            print(f"{c:>5}{prefix:>7}{m.samples / TINY.sample_rate / m.wall:>9.0f}{len(m.steps) / m.wall:>9.0f}{rows:>10.1f}{ttfp:>13.2f}{cpu:>15.0f}",
                  flush=True)
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, default=8091)
    s.add_argument("--max-streams", type=int, default=256)
    s.add_argument("--loop", default=None, help="uvicorn's event loop: auto, asyncio or uvloop (default: serve's own choice)")
    s.add_argument("--ws", default=None, help="uvicorn's WebSocket implementation (default: serve's own choice)")
    s.add_argument("--switch-interval", type=float, default=None, metavar="MS", help="sys.setswitchinterval, in ms")
    s.add_argument("--profile", default=None, metavar="PATH", help="cProfile the event loop's thread, stats written here at exit")
    i = sub.add_parser("inproc")
    i.add_argument("--levels", default="1,64,256")
    i.add_argument("--seconds", type=float, default=8.0)
    i.add_argument("--chunks", default="1,25", help="chunk schedule, the last size repeating")
    i.add_argument("--prefix", default="0", help="reference prefix frames, a comma list run in turn at each level")
    i.add_argument("--voices", type=int, default=0, help="prefixes drawn from this many references (0: each stream its own)")
    i.add_argument("--prefix-cache-bytes", type=int, default=0)
    i.add_argument("--free-restores", action="store_true", help="a cache hit's copy writes nothing (timing only)")
    i.add_argument("--in-step", action="store_true",
                   help="hits go into the steps' restore pairs, as on a GPU (the pairs kernel does nothing; a restore a step's pairs "
                        "have no room for, where a code2wav has that limit, goes by pool.restore: see --restore-launches)")
    i.add_argument("--restore-launches", action="store_true",
                   help="a cache hit's copy writes nothing and lets go of the GIL once, as a kernel launch does (timing only)")
    for q in (s, i):
        q.add_argument("--step-ms", default="1.2,0.4", help="simulated device time: A ms a step plus B ms a row")
        q.add_argument("--max-batch-frames", type=int, default=512)
    args = p.parse_args(argv)
    return serve(args) if args.cmd == "serve" else inproc(args)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
