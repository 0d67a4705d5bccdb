"""Would two CUDA streams hide a step's low-rate half? A large step's front (quantizer, pre-conv,
transformer: latency-bound products at a few hundred rows) and back (upsamplers and the conv
stack, which fill the GPU) run one after the other today. The front of step n + 1 depends on no
part of step n's back, so on a stream of its own it could run beside it. This measures that
before the engine is changed: per step shape, graph replays of

- the whole step (one graph, the engine's today), N steps back to back on one stream;
- the front and back as two graphs (separate memory pools: they may now run at once), serial;
- the same two graphs pipelined: fronts on one stream, backs on another, the front of step
  n + 1 waiting only until step n's back has copied its hidden frames in;

with the front stream at normal and at high priority; and, with real rows whose state advances,
whether the pipelined steps' audio equals the whole-step graph's (max abs difference).
argv: [shapes, default 16x25,20x25] [steps per timing, default 50]
"""

from __future__ import annotations

import sys

import torch
from gpu_timing import bf16_default, shapes_arg, timed  # bench/ is the script's directory, first on sys.path

from code2wav.engine.graphs import GraphRunner


def main() -> int:
    shapes = shapes_arg(sys.argv[1] if len(sys.argv) > 1 else "16x25,20x25")
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    model, pool = bf16_default()
    runner = GraphRunner(model, pool, batch_sizes=tuple(b for b, _ in shapes), frame_sizes=tuple(t for _, t in shapes),
                         max_batch_frames=max(b * t for b, t in shapes))
    runner.capture()
    side = torch.cuda.Stream()
    main_stream = torch.cuda.current_stream()
    q = model.config.num_quantizers
    print(f"{model.dtype}, low-rate stages {model.low_rate_dtype}; ms per step over {steps} steps")
    print(f"{'shape':>6} {'whole':>7} {'front':>7} {'back':>7} {'f+b serial':>10} {'pipelined':>9} {'hi-prio':>8}  audio max |diff|")
    for b, t in shapes:
        whole = runner.graphs[(b, t)]
        front = runner._capture(side, pool.front, runner._shape_inputs(("front", b, t))[1])
        runner.mempool = torch.cuda.graph_pool_handle()  # the backs' own: a back may run beside a front
        back = runner._capture(side, pool.back, runner._shape_inputs(("back", b, t))[1])
        torch.cuda.synchronize()
        hidden_in = back.inputs[0]

        def serial() -> None:
            front.graph.replay()
            hidden_in.copy_(front.out)
            back.graph.replay()

        def pipelined_with(fs: torch.cuda.Stream, bs: torch.cuda.Stream):
            copied = [torch.cuda.Event() for _ in range(2)]
            fronted = torch.cuda.Event()
            for ev in copied:
                ev.record(bs)

            def step(i: int) -> None:
                with torch.cuda.stream(fs):
                    fs.wait_event(copied[(i - 1) % 2])  # the last back has its hidden frames
                    front.graph.replay()
                    fronted.record(fs)
                with torch.cuda.stream(bs):
                    bs.wait_event(fronted)
                    hidden_in.copy_(front.out)
                    copied[i % 2].record(bs)
                    back.graph.replay()
            return step

        def joined(priority: int) -> float:
            fs, bs = torch.cuda.Stream(priority=priority), torch.cuda.Stream()
            fn = pipelined_with(fs, bs)
            for i in range(2):
                fn(i)
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(fs)
            bs.wait_stream(fs)
            for i in range(steps):
                fn(i)
            fs.wait_stream(bs)
            end.record(fs)
            torch.cuda.synchronize()
            return start.elapsed_time(end) / steps

        # gpu_timing.timed gives microseconds per call
        t_whole, t_front, t_back, t_serial = (timed(fn, reps=steps) / 1e3 for fn in (whole.graph.replay, front.graph.replay,
                                                                                     back.graph.replay, serial))
        t_pipe, t_hi = joined(0), joined(-1)

        # Exactness: 6 steps of real rows (slots 0..b-1, every frame new) both ways from zero state.
        g = torch.Generator().manual_seed(0)
        codes = [torch.randint(0, 2048, (b, q, t), generator=g) for _ in range(6)]
        slots = torch.arange(b)
        n_new = torch.full((b,), t)

        def fresh() -> None:
            torch.cuda.synchronize()
            for buf in pool.buffers.values():
                buf.zero_()
            pool.position.zero_()

        fresh()
        ref = []
        for c in codes:
            for dst, src in zip(whole.inputs, (c, slots, n_new)):
                dst.copy_(src)
            whole.graph.replay()
            ref.append(whole.out.clone())
        fresh()
        fs, bs = torch.cuda.Stream(priority=-1), torch.cuda.Stream()
        for s in (fs, bs):
            s.wait_stream(main_stream)
        fn = pipelined_with(fs, bs)
        outs = []
        for i, c in enumerate(codes):
            with torch.cuda.stream(fs):  # the front's inputs change under the last front: after it
                for dst, src in zip(front.inputs, (c, slots, n_new)):
                    dst.copy_(src)
                for dst, src in zip(back.inputs[1:], (slots, n_new)):
                    dst.copy_(src)
            fn(i)
            with torch.cuda.stream(bs):
                outs.append(back.out.clone())
        torch.cuda.synchronize()
        diff = max((a - r[:, : a.shape[-1]]).abs().max().item() for a, r in zip(outs, ref))
        fresh()
        print(f"{b:>3}x{t:<2} {t_whole:7.3f} {t_front:7.3f} {t_back:7.3f} {t_serial:10.3f} {t_pipe:9.3f} {t_hi:8.3f}  {diff:.3g}")
        runner.mempool = torch.cuda.graph_pool_handle()
    return 0


if __name__ == "__main__":
    sys.exit(main())
