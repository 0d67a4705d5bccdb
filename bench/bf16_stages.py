"""Which stages' bf16 rounding costs the SNR: the decoder run stage by stage, each stage in bf16
or float32 (same random weights), SNR vs the float64 forward. Stages: front (dequantize, pre_conv,
transformer), upsample (ConvTranspose + ConvNeXt x2), decoder[0] (the 1024 -> 1536 conv),
blocks 1-4, out (SnakeBeta + the 1-channel conv). CPU.

python bench/bf16_stages.py --frames 12 --threads 2
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bf16_error import setup, snr_db  # noqa: E402

from code2wav.model.decoder import Decoder  # noqa: E402

STAGES = ("front", "upsample", "conv0", "block1", "block2", "block3", "block4", "out")


def run(models: dict[torch.dtype, Decoder], codes: torch.Tensor, dtypes: dict[str, torch.dtype], upto: str = "out") -> torch.Tensor:
    """The forward with each stage in its own dtype (activations cast at stage edges), up to and
    including stage ``upto``."""
    m = models[dtypes["front"]]
    h = m.front(codes)
    d = dtypes["upsample"]
    h = h.to(d)
    for convt, block in models[d].upsample:
        h = block(convt(h))
    if upto == "upsample":
        return h
    for i, name in enumerate(("conv0", "block1", "block2", "block3", "block4")):
        h = models[dtypes[name]].decoder[i](h.to(dtypes[name]))
    out = models[dtypes["out"]].decoder
    return out[-1](h.to(dtypes["out"]), act=out[-2]).clamp(-1, 1)


def main() -> int:
    load, codes = setup()
    bf, f32 = torch.bfloat16, torch.float32
    models = {d: load(d) for d in (torch.float64, f32, bf)}
    with torch.no_grad():
        ref = models[torch.float64](codes)[0, 0]
        print(f"{'stage':<10}{'only it bf16':>14}{'all but it bf16':>17}{'it and all before fp32':>24}")
        for i, name in enumerate(STAGES):
            only = run(models, codes, {s: bf if s == name else f32 for s in STAGES})[0, 0]
            but = run(models, codes, {s: f32 if s == name else bf for s in STAGES})[0, 0]
            upto = run(models, codes, {s: f32 if j <= i else bf for j, s in enumerate(STAGES)})[0, 0]
            print(f"{name:<10}{snr_db(ref, only):>14.1f}{snr_db(ref, but):>17.1f}{snr_db(ref, upto):>24.1f}", flush=True)
        print(f"all bf16: {snr_db(ref, run(models, codes, dict.fromkeys(STAGES, bf))[0, 0]):.1f} dB")
        # What float32 there costs in work: the low-rate stages' share of the forward's FLOPs.
        from torch.utils.flop_counter import FlopCounterMode

        m, counts = models[f32], []
        for part in (lambda: run(models, codes, {s: f32 if s in ("front", "upsample") else None for s in STAGES}, upto="upsample"),
                     lambda: m(codes)):
            with FlopCounterMode(display=False) as fc:
                part()
            counts.append(fc.get_total_flops())
        print(f"front + upsample: {counts[0] / counts[1] * 100:.1f} % of the FLOPs ({counts[1] / codes.shape[-1] / 1e9:.2f} GFLOP per frame)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
