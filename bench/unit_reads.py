"""The one-kernel residual units reading their taps themselves (``LayerChoices.unit_conv_reads``:
no history concat written and read back) against the default, on the GPU, in one process: graph
replay per step shape both ways, and the audio of the same three steps of real rows (16 x 25
frames each, from zero state) both ways, as the largest difference over the peak.
argv: [dtype, default bfloat16] [replays per shape, default 50]
"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch

from code2wav.engine.graphs import GraphRunner, use_expandable_segments
from code2wav.model.choices import DEFAULT_CHOICES
from code2wav.model.config import DecoderConfig
from code2wav.model.init import random_decoder
from code2wav.model.loading import configure_cuda
from code2wav.model.low_rate import auto_low_rate
from code2wav.stream.pool import StatePool

SHAPES = ((1, 1), (16, 1), (1, 25), (16, 25), (20, 25))


def main() -> int:
    dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    use_expandable_segments()
    configure_cuda(dtype)
    weights = random_decoder(DecoderConfig()).state_dict()
    g = torch.Generator().manual_seed(0)
    steps = [torch.randint(0, 2048, (16, 16, 25), generator=g) for _ in range(3)]
    times, audio = {}, {}
    for reads in (False, True):
        m = random_decoder(DecoderConfig())
        m.load_state_dict(weights)
        m = m.to_dtypes(dtype, "cuda").set_layer_choices(replace(DEFAULT_CHOICES, unit_conv_reads=reads))
        auto_low_rate(m)
        m.channels_last()
        pool = StatePool(m, 64)
        runner = GraphRunner(m, pool, batch_sizes=(1, 16, 20), frame_sizes=(1, 25), max_batch_frames=500)
        runner.capture()
        for b, t in SHAPES:
            codes, slots, n_new = torch.zeros(b, 16, t, dtype=torch.long), torch.full((b,), pool.scratch_slot), torch.zeros(b, dtype=torch.long)
            for _ in range(3):
                runner(codes, slots, n_new)
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                runner(codes, slots, n_new)
            end.record()
            torch.cuda.synchronize()
            times[(reads, b, t)] = start.elapsed_time(end) / reps
        audio[reads] = torch.cat([runner(c, torch.arange(16), torch.full((16,), 25)).float().cpu() for c in steps], -1)
        print(f"unit_conv_reads={reads}: graph pool {runner.memory_bytes() / 2**20:.0f} MiB", flush=True)
        del runner, pool, m
        torch.cuda.empty_cache()
    print(f"{dtype}; graph replay, ms (50 replays a shape)")
    print(f"{'rows x frames':>14} {'default':>8} {'reads':>8}")
    for b, t in SHAPES:
        print(f"{f'{b} x {t}':>14} {times[(False, b, t)]:8.3f} {times[(True, b, t)]:8.3f}")
    ref = audio[False]
    print(f"audio, 3 steps of 16 x 25 from zero state: max |reads - default| / peak {(audio[True] - ref).abs().max().item() / ref.abs().max().item():.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
