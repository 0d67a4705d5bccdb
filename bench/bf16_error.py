"""Where half-precision rounding error comes from: SNR of the bf16 (and fp16) decoder vs the float64
forward, with the front (dequantize, pre_conv, transformer) and the back (upsampling + conv
decoder) each in the half dtype or float32, and float32 arithmetic on weights rounded to the half
dtype (alone, with every GEMM's inputs rounded too, and with its outputs as well). Same random
weights for every variant. Runs on CPU (bf16 convs accumulate in fp32 and round
their outputs, as cuDNN's do).

python bench/bf16_error.py --frames 12 --threads 2
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from code2wav.model.config import DecoderConfig  # noqa: E402
from code2wav.model.decoder import Decoder  # noqa: E402
from code2wav.model.init import random_decoder  # noqa: E402


def snr_db(ref: torch.Tensor, x: torch.Tensor) -> float:
    ref, x = ref.double(), x.double()
    return 10 * torch.log10(ref.pow(2).sum() / (ref - x).pow(2).sum()).item()


def setup() -> tuple[Callable[[torch.dtype], Decoder], torch.Tensor]:
    """The set-up this script and ``bf16_stages.py`` share: ``--frames/--threads/--seed``, random
    weights of the real architecture, ``load(dtype)`` (the whole decoder in ``dtype``, its
    low-rate stages too) and the codes."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = DecoderConfig()
    weights = random_decoder(cfg).state_dict()

    def load(dtype: torch.dtype) -> Decoder:
        m = Decoder(cfg)
        m.load_state_dict(weights)
        return m.to_dtypes(dtype, low_rate_dtype=dtype)

    g = torch.Generator().manual_seed(args.seed)
    return load, torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, args.frames), generator=g)


def main() -> int:
    load, codes = setup()
    halves = (torch.bfloat16, torch.float16)
    models = {d: load(d) for d in (torch.float64, torch.float32, *halves)}
    with torch.no_grad():
        ref = models[torch.float64](codes)[0, 0]
        hidden = {d: models[d].front(codes) for d in (torch.float32, *halves)}
        print(f"{'front':<10}{'back':<10}{'SNR dB':>8}")
        for half in halves:
            for front, back in ((half, half), (half, torch.float32), (torch.float32, half)):
                out = models[back].back(hidden[front].to(back))[0, 0]
                print(f"{str(front)[6:]:<10}{str(back)[6:]:<10}{snr_db(ref, out):>8.1f}", flush=True)
        # Rounding the weights alone (float32 arithmetic throughout): the share of the error no
        # activation format can remove while the weights are stored in the half dtype.
        for half in halves:
            m = load(torch.float32)
            for t in (*m.parameters(), *m.buffers()):
                if t.is_floating_point():
                    t.copy_(t.to(half).to(torch.float32))
            print(f"weights {str(half)[6:]}, float32 arithmetic: {snr_db(ref, m(codes)[0, 0]):.1f} dB", flush=True)
            # The same, with every conv / matmul / attention input also rounded to the half dtype
            # (what tensor cores read) while everything else stays float32: residual adds,
            # SnakeBeta, norms and every op's output (as if GEMMs wrote float32).
            with _HalfOperands(half):
                print(f"weights and GEMM inputs {str(half)[6:]}, float32 elsewhere: {snr_db(ref, m(codes)[0, 0]):.1f} dB", flush=True)
            with _HalfOperands(half, outputs=True):  # GEMMs also write the half dtype (cuDNN, cuBLAS as called today)
                print(f"GEMM inputs and outputs {str(half)[6:]}, float32 elsewhere: {snr_db(ref, m(codes)[0, 0]):.1f} dB", flush=True)
        # Which weights: per-channel vectors could stay float32 at no cost (the kernels read them
        # in float32 anyway); the matrices are what tensor cores read.
        groups = (("per-channel vectors (biases, SnakeBeta, norms, gamma)", lambda n, t: t.dim() == 1),
                  ("SnakeBeta alpha, beta", lambda n, t: n.endswith(("alpha", "beta"))),
                  ("matrices (conv, linear, codebook table)", lambda n, t: t.dim() >= 2))
        for name, pick in groups:
            m = load(torch.float32)
            for n, t in (*m.named_parameters(), *m.named_buffers()):
                if t.is_floating_point() and pick(n, t):
                    t.copy_(t.to(torch.bfloat16).to(torch.float32))
            print(f"only {name} bfloat16, float32 arithmetic: {snr_db(ref, m(codes)[0, 0]):.1f} dB", flush=True)
    return 0


class _HalfOperands(torch.overrides.TorchFunctionMode):
    GEMMS = {torch.nn.functional.conv2d, torch.nn.functional.conv_transpose2d, torch.nn.functional.linear, torch.matmul,
             torch.Tensor.__matmul__, torch.bmm, torch.nn.functional.scaled_dot_product_attention}

    def __init__(self, dtype: torch.dtype, outputs: bool = False):
        super().__init__()
        self.dtype, self.outputs = dtype, outputs

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func not in self.GEMMS:
            return func(*args, **(kwargs or {}))
        args = tuple(a.to(self.dtype).to(a.dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        out = func(*args, **(kwargs or {}))
        return out.to(self.dtype).to(out.dtype) if self.outputs else out


if __name__ == "__main__":
    sys.exit(main())
