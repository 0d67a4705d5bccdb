"""Small steps on the priority stream (``EngineConfig.priority_step_frames``), checked on the GPU: many
streams in flight at once through the async engine, some with a reference prefix, chunks of
1, 25, 25 and 4 frames, each stream pushing its next chunk when the last one's audio is back, so
that first chunks' one-frame steps run while 25-frame steps are queued. The same workload with
the priority stream and without it (float32, the released architecture's random weights): every
stream's audio within 1e-4 of the peak of the other run's (the steps' batches differ with
timing, and cuDNN's algorithm with the batch: each run is ~1.5e-5 from float64, so the two may
differ by as much; session 27's first run, held to 1e-5 here, differed by 1.55e-5), two streams
of each run within 1e-4 of the float64 whole-utterance forward (the fp32 bound of
bench/gpu_check.py), and how many steps ran on the priority stream.
argv: [streams, default 24]
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter

import torch

from code2wav.engine.async_engine import AsyncEngine
from code2wav.engine.graphs import GraphRunner, use_expandable_segments
from code2wav.model.config import DecoderConfig
from code2wav.model.init import random_decoder
from code2wav.model.loading import configure_cuda
from code2wav.stream.engine import StreamEngine
from code2wav.stream.pool import StatePool

SPF = 1920
CHUNKS = [1, 25, 25, 4]


async def workload(engine: StreamEngine, codes: list[torch.Tensor], prefixes: list[int]) -> list[torch.Tensor]:
    async with AsyncEngine(engine) as eng:

        async def one(i: int) -> torch.Tensor:
            await asyncio.sleep(0.002 * i)
            p = prefixes[i]
            await eng.open(f"s{i}", codes[i][:p] if p else None)
            out, at = [], p
            for n in CHUNKS:
                out.append(await eng.push(f"s{i}", codes[i][at : at + n]))
                at += n
            await eng.finish(f"s{i}")
            return torch.cat(out).double()

        return list(await asyncio.gather(*(one(i) for i in range(len(codes)))))


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    use_expandable_segments()
    configure_cuda(torch.float32)
    weights = random_decoder(DecoderConfig()).state_dict()
    g = torch.Generator().manual_seed(3)
    codes = [torch.randint(0, 2048, (40 + sum(CHUNKS), 16), generator=g) for _ in range(n)]
    prefixes = [40 if i % 4 == 1 else 0 for i in range(n)]
    outs, priority_steps = {}, {}
    for frames in (16, 0):
        m = random_decoder(DecoderConfig())
        m.load_state_dict(weights)
        m = m.to_dtypes(torch.float32, "cuda").channels_last()
        runner = GraphRunner(m, StatePool(m, 32), batch_sizes=(1, 2, 4, 8, 16), frame_sizes=(1, 4, 25), max_batch_frames=400,
                             priority_step_frames=frames)
        engine = StreamEngine(m, runner=runner, max_step_frames=25, max_batch_frames=400)
        runner.capture(engine.prefill_shapes())
        used: Counter[bool] = Counter()
        stream_for = runner.stream_for
        runner.stream_for = lambda shape, f=stream_for, used=used: (lambda s: (used.update([s is not None]), s)[1])(f(shape))  # type: ignore[method-assign]
        outs[frames] = asyncio.run(workload(engine, codes, prefixes))
        priority_steps[frames] = used[True]
        print(f"priority_step_frames={frames}: {used[True]} steps on the priority stream, {used[False]} asked and kept on the main one; "
              f"graph pools {runner.memory_bytes() / 2**20:.0f} MiB; fallbacks {dict(runner.fallbacks)}", flush=True)
        del runner, engine, m
        torch.cuda.empty_cache()
    worst = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(outs[16], outs[0]))
    m64 = random_decoder(DecoderConfig())
    m64.load_state_dict(weights)
    m64 = m64.double()
    errs = []
    with torch.no_grad():
        for i in (0, 1):  # a cold stream and a prefixed one
            p = prefixes[i]
            ref = m64(codes[i][: p + sum(CHUNKS)].T[None])[0, 0][p * SPF :]  # what the stream was sent
            errs += [((outs[frames][i] - ref).abs().max() / ref.abs().max()).item() for frames in (16, 0)]
    ok = priority_steps[16] > 0 and worst <= 1e-4 and max(errs) <= 1e-4
    print(f"{'PASS' if ok else 'FAIL'} priority stream: {priority_steps[16]} priority steps; {n} streams' audio vs the one-stream run: "
          f"max err / peak {worst:.2e}; vs float64 (cold, prefixed; with / without): {errs[0]:.2e} / {errs[1]:.2e}, {errs[2]:.2e} / {errs[3]:.2e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
