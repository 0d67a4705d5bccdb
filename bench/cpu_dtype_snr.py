"""A lone stream's audio on CPU in float32 and bfloat16 against the float64 whole-utterance
forward (embedded weights, 101 random frames in chunks of 1 then 25): SNR and worst error over
peak. ``python3 bench/cpu_dtype_snr.py``."""

from __future__ import annotations

import numpy as np
import torch

from code2wav.engine.build import EngineConfig, build_engine
from code2wav.model.loading import load_decoder
from code2wav.options import chunk_schedule


def main() -> None:
    codes = torch.from_numpy(np.random.default_rng(0).integers(0, 2048, (101, 16)))
    with torch.no_grad():
        ref = load_decoder(None, device="cpu", dtype=torch.float64)(codes.T.unsqueeze(0)).flatten()
    for dtype in ("float32", "bfloat16"):
        engine = build_engine(EngineConfig(dtype=dtype, max_streams=2))
        engine.open("s")
        pieces, at = [], 0
        for n in chunk_schedule(codes.shape[0], [1, 25]):
            pieces.append(engine.push("s", codes[at : at + n]))
            at += n
        got = torch.cat(pieces).double()
        snr = 10 * torch.log10((ref**2).sum() / ((got - ref) ** 2).sum())
        print(f"{dtype}: SNR {float(snr):.1f} dB, worst error / peak {float((got - ref).abs().max() / ref.abs().max()):.2e}")


if __name__ == "__main__":
    main()
