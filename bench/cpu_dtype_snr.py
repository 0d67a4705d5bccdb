"""A lone stream's audio on CPU in float32 and bfloat16 against the float64 whole-utterance
forward (embedded weights, 101 random frames in chunks of 1 then 25): SNR and worst error over
peak. ``python3 bench/cpu_dtype_snr.py``."""

import time

import numpy as np
import torch

from code2wav.engine.build import EngineConfig, build_engine
from code2wav.model.loading import load_decoder

torch.manual_seed(0)
codes = torch.from_numpy(np.random.default_rng(0).integers(0, 2048, (101, 16)))
print(codes.shape)
ref_m = load_decoder(None, device="cpu", dtype=torch.float64)
t=time.perf_counter()
with torch.no_grad():
    ref = ref_m(codes.T.unsqueeze(0) if codes.shape[-1]==16 else codes.unsqueeze(0)).flatten().double()
print("f64 forward", time.perf_counter()-t)
for dt in ("float32","bfloat16"):
    eng = build_engine(EngineConfig(dtype=dt, max_streams=2))
    eng.open("a")
    outs=[]; at=0
    for n in [1]+[25]*4:
        outs.append(eng.push("a", codes[at:at+n] if codes.shape[-1]==16 else codes[:,at:at+n].T)); at+=n
    got=torch.cat(outs).double(); r=ref[:got.numel()]
    snr=10*torch.log10((r**2).sum()/((got-r)**2).sum())
    print(dt, "frames", at, "SNR dB", float(snr), "max err/peak", float((got-r).abs().max()/r.abs().max()))
