"""The engine's host-side ceiling: the bench workload with a runner that does no decoder work.

Every step still validates and packs codes, copies them to the device, allocates its output and
hands rows back through the async engine, so the throughput printed here is what the Python
side alone could sustain: if it is not far above the real workload's, the host is the limit.
With a reference prefix from a few voices, the prefix cache (on) restores each stream's state
after the first of its voice, as in the real workload; a prefill pass also returns zeros.
argv: [device] [levels] [seconds per level] [prefix frames, default 0] [voices, default 8].
"""

from __future__ import annotations

import asyncio
import sys

import torch

from code2wav.bench import _workload
from code2wav.model.config import DecoderConfig
from code2wav.model.decoder import Decoder
from code2wav.stream.engine import StreamEngine
from code2wav.stream.pool import StatePool
from code2wav.stream.runner import EagerRunner


class NoDecode(EagerRunner):
    """A runner that moves a step's inputs to the device as the eager one does, then returns
    silence of the step's shape instead of running the decoder."""

    def __call__(self, codes: torch.Tensor, slots: torch.Tensor, n_new: torch.Tensor) -> torch.Tensor:
        codes, slots, n_new = self.pool._inputs(codes, slots, n_new)
        return torch.zeros(codes.shape[0], codes.shape[2] * self.model.config.samples_per_frame, device=codes.device,
                           dtype=torch.bfloat16)

    def prefill(self, kind: str, x: torch.Tensor, slots: torch.Tensor, n_new: torch.Tensor) -> torch.Tensor:
        x, slots, n_new = self.pool._inputs(x, slots, n_new)
        cfg = self.model.config
        if kind == "front":
            return torch.zeros(x.shape[0], cfg.latent_dim, x.shape[2], device=x.device, dtype=torch.float32)
        return torch.zeros(x.shape[0], x.shape[2] * cfg.samples_per_frame, device=x.device, dtype=torch.bfloat16)


def main() -> int:
    device = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
    levels = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,16,64,256").split(",")]
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0
    prefix = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    voices = int(sys.argv[5]) if len(sys.argv) > 5 else 8
    cfg = DecoderConfig()
    model = Decoder(cfg).to(device, torch.bfloat16)  # weights unused; the pool is the real size
    core = StreamEngine(model, runner=NoDecode(model, StatePool(model, max(levels))), max_step_frames=32, max_batch_frames=256,
                        prefix_cache_bytes=(1 << 30) if prefix else 0)
    print(f"host-only workload on {device}, chunks 1 then 25, 101 frames per stream, prefix {prefix} from {voices} voices, "
          f"sustained {seconds:.0f} s per level")
    print(f"{'c':>5}{'x RT':>9}{'steps/s':>9}{'step ms':>9}{'TTFP p50 ms':>13}")
    for c in levels:
        m = asyncio.run(_workload(core, c, 101, [1, 25], prefix, 0.002, seed=c, seconds=seconds, voices=voices))
        ttfp = sorted(m.ttfp)[len(m.ttfp) // 2] * 1e3 if m.ttfp else float("nan")
        mean_step = 1e3 * sum(m.steps) / max(1, len(m.steps))
        print(f"{c:>5}{m.samples / cfg.sample_rate / m.wall:>9.0f}{len(m.steps) / m.wall:>9.0f}{mean_step:>9.2f}{ttfp:>13.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
