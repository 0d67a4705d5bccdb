"""Can two step graphs run at once on two CUDA streams when they were captured on the same
stream? Each graph has its own memory pool here, but a library's workspace (cuBLAS keeps one per
stream) is baked into a graph at capture, so two graphs captured on one stream may share it.
Real rows (a 16 x 25 step on slots 0-15, a 16 x 1 step on slots 16-31, six steps from zero
state) run serially, then with the small graph on a second, high-priority stream beside the
large one, for graphs captured on one capture stream and on two; prints how far the concurrent
run's audio is from the serial one's (0: no interference).
argv: [steps, default 6] [which: one, two or both (default; one crashed the process on the H200,
so "two" alone runs the other)]
"""

from __future__ import annotations

import contextlib
import sys

import torch
from gpu_timing import bf16_default  # bench/ is the script's directory, first on sys.path

from code2wav.engine.graphs import GraphRunner


def main() -> int:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    which = sys.argv[2] if len(sys.argv) > 2 else "both"
    model, pool = bf16_default()
    runner = GraphRunner(model, pool, batch_sizes=(16,), frame_sizes=(1, 25), max_batch_frames=400)
    q = model.config.num_quantizers
    g = torch.Generator().manual_seed(0)
    big_in = [(torch.randint(0, 2048, (16, q, 25), generator=g), torch.arange(16), torch.full((16,), 25)) for _ in range(steps)]
    small_in = [(torch.randint(0, 2048, (16, q, 1), generator=g), torch.arange(16, 32), torch.full((16,), 1)) for _ in range(steps)]
    side = torch.cuda.Stream(priority=-1)

    def fresh() -> None:
        torch.cuda.synchronize()
        for buf in pool.buffers.values():
            buf.zero_()
        pool.position.zero_()
        torch.cuda.synchronize()

    def run(big, small, beside: bool) -> list[torch.Tensor]:
        fresh()
        outs = []
        for i in range(steps):
            for graph, inputs, stream in ((big, big_in[i], None), (small, small_in[i], side if beside else None)):
                with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                    for dst, src in zip(graph.inputs, inputs):
                        dst.copy_(src, non_blocking=True)
                    graph.graph.replay()
                    outs.append(graph.out.clone())
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        return outs

    for how in [h for h, key in (("one capture stream", "one"), ("two capture streams", "two")) if which in (key, "both")]:
        cap = torch.cuda.Stream()
        fn, inputs, _ = runner._shape_inputs(("step", 16, 25))
        big = runner._capture(cap, fn, inputs)
        runner.mempool = torch.cuda.graph_pool_handle()  # the small graph's own pool
        cap2 = cap if how == "one capture stream" else torch.cuda.Stream()
        fn, inputs, _ = runner._shape_inputs(("step", 16, 1))
        small = runner._capture(cap2, fn, inputs)
        runner.mempool = torch.cuda.graph_pool_handle()
        torch.cuda.synchronize()
        ref = run(big, small, beside=False)
        worst = 0.0
        for _ in range(3):
            got = run(big, small, beside=True)
            worst = max(worst, max((a.float() - b.float()).abs().max().item() for a, b in zip(got, ref)))
        print(f"{how}: concurrent vs serial audio, max |diff| over 3 runs of {steps} step pairs: {worst:.3g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
