"""gpu_check.py's 192-channel streamed-unit check alone (its quick form stops before it): the
bf16 check stream through graphs with the streamed unit in every step (``unit_streamed_rows=1``),
at the default (from 16,384 samples: the 40-frame prefill), and with the Triton unit everywhere
(0), each against the float64 forward."""

from __future__ import annotations

import sys
from dataclasses import replace

import torch
from gpu_check import SPF, check, failures, graph_stream, load, snr_db  # bench/ is first on sys.path

from code2wav.model.choices import DEFAULT_CHOICES
from code2wav.model.config import DecoderConfig
from code2wav.model.init import random_decoder


def main() -> int:
    torch.manual_seed(0)
    weights = random_decoder(DecoderConfig()).state_dict()
    codes = torch.randint(0, 2048, (200, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = load(weights, torch.float64, "cpu")(codes[:120].T[None])[0, 0][40 * SPF :]
    snrs = {}
    for rows in (1, DEFAULT_CHOICES.unit_streamed_rows, 0):
        layers = replace(DEFAULT_CHOICES, unit_streamed_rows=rows)
        snrs[rows] = snr_db(ref, graph_stream(load(weights, torch.bfloat16, "cuda", layers=layers), codes).float())
    check("unit_streamed_rows=1 (every step) and the default: bf16 stream SNR >= 30 dB, within 0.3 dB of the Triton units'",
          all(s >= 30.0 and s >= snrs[0] - 0.3 for s in snrs.values()), ", ".join(f"rows {r}: {s:.2f} dB" for r, s in snrs.items()))
    print(f"SUMMARY streamed_check: {len(failures)} failed: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
