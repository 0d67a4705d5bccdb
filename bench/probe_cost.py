"""What ``low_rate_dtype="auto"``'s probe (model/low_rate.py) costs at load, on a GPU, in a fresh
process: the low-rate stages' first and second plain run in the instant forms on the probe's
codes, then the probe twice (its first run pays what the plain runs did not). argv: [dtype,
default bfloat16]."""

from __future__ import annotations

import sys
import time

import torch

from code2wav.kernels import instant
from code2wav.model import low_rate
from code2wav.model.loading import load_decoder


def timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def main() -> int:
    dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
    t0 = time.perf_counter()
    model = load_decoder(None, device="cuda", dtype=dtype, low_rate_dtype=None)  # float32 low-rate stages
    print(f"load {time.perf_counter() - t0:.2f} s ({model.low_rate_dtype})")
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, cfg.codebook_size, (low_rate.PROBE_ROWS, cfg.num_quantizers, low_rate.PROBE_FRAMES), generator=g).cuda()

    def plain() -> None:
        with torch.no_grad(), instant.forms():
            model.upsampled(model.front(codes))

    for name, fn in (("plain, first", plain), ("plain, second", plain), ("probe, first", lambda: low_rate.low_rate_peak(model)),
                     ("probe, second", lambda: low_rate.low_rate_peak(model))):
        print(f"{name}: {timed(fn):.1f} ms", flush=True)
    print(f"peak {low_rate.low_rate_peak(model):.3g}; cast to float16: {timed(lambda: model.cast_low_rate(torch.float16)):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
