"""The few-row products of a small step: cuBLAS (TF32 allowed, as the low-rate stages run)
against ``code2wav/kernels/skinny.py``, per shape, each timed as 50 calls replayed in one CUDA
graph (so launch gaps are the GPU's, as in a step's graph), and checked against float64.
argv: [dtype, default float32; float16 / bfloat16: the half products ``LayerChoices.skinny_half``
sends through the kernel]. Exits non-zero unless the kernel is within 1e-5 (float32) or two
of the dtype's epsilons (half) of float64 (relative to the peak) and faster in sum. Then, in half, the MLP's down
projection of ``silu(gate) * up``: ``silu_mul`` and cuBLAS against the gated kernel; in float32
a tile sweep around the defaults."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from gpu_timing import timed_in_graph as timed  # bench/ is the script's directory, first on sys.path

from code2wav.kernels import skinny
from code2wav.kernels.transformer import silu_mul

# (rows, K, N): the transformer's q/k/v, o, gate/up, down and its in/out projections, the
# upsamplers' ConvNeXt MLPs (rows: 1-frame step at rates 2 and 4) and their ConvTranspose.
SHAPES = [(1, 512, 3072), (1, 1024, 512), (1, 512, 2048), (1, 1024, 512), (1, 1024, 512), (1, 512, 1024),
          (2, 1024, 4096), (2, 4096, 1024), (4, 1024, 4096), (4, 4096, 1024), (1, 1024, 2048), (4, 512, 3072)]


def gated(dtype: torch.dtype) -> None:
    """The one-frame MLP's down projection (gate/up 2 x 1024 -> 512): two launches against one."""
    gu = torch.randn(1, 2048, device="cuda", dtype=dtype)
    w = (torch.randn(512, 1024, device="cuda") / 32).to(dtype)
    gate, up = gu.double().chunk(2, dim=-1)
    ref = (F.silu(gate) * up) @ w.double().T
    a, s = F.linear(silu_mul(gu), w), skinny.linear(gu, w, gated=True)
    errs = [((y.double() - ref).abs().max() / ref.abs().max()).item() for y in (a, s)]
    t = [timed(lambda: F.linear(silu_mul(gu), w)), timed(lambda: skinny.linear(gu, w, gated=True))]
    print(f"gated down projection, 1 row: silu_mul + cuBLAS {t[0]:.2f} us, gated kernel {t[1]:.2f} us; "
          f"err vs fp64 {errs[0]:.1e} / {errs[1]:.1e}", flush=True)


def main() -> int:
    torch.backends.cuda.matmul.allow_tf32 = True
    dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "float32")
    bound = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps  # half: one rounding of the output
    print(f"{dtype}\n{'rows':>5}{'K':>6}{'N':>6}{'MB':>7}{'cuBLAS us':>11}{'skinny us':>11}{'TB/s':>7}  err vs fp64 (cuBLAS / skinny)")
    total, worst = [0.0, 0.0], 0.0
    for m, k, n in SHAPES:
        x = torch.randn(m, k, device="cuda").to(dtype)
        w = (torch.randn(n, k, device="cuda") / k**0.5).to(dtype)
        b = torch.randn(n, device="cuda").to(dtype)
        ref = (x.double() @ w.double().T + b.double())
        a, s = F.linear(x, w, b), skinny.matmul_t(x, w, b, enabled=True)
        errs = [((y.double() - ref).abs().max() / ref.abs().max()).item() for y in (a, s)]
        t = [timed(lambda: F.linear(x, w, b)), timed(lambda: skinny.matmul_t(x, w, b, enabled=True))]
        total = [total[0] + t[0], total[1] + t[1]]
        worst = max(worst, errs[1])
        mb = w.numel() * w.element_size() / 1e6
        print(f"{m:>5}{k:>6}{n:>6}{mb:>7.1f}{t[0]:>11.2f}{t[1]:>11.2f}{mb / t[1]:>7.2f}  {errs[0]:.1e} / {errs[1]:.1e}")
    print(f"sum: cuBLAS {total[0]:.1f} us, skinny {total[1]:.1f} us")
    ok = worst <= bound and total[1] < total[0]
    print(f"{'PASS' if ok else 'FAIL'} skinny: worst rel err {worst:.1e}, {total[1]:.1f} vs cuBLAS {total[0]:.1f} us", flush=True)
    if dtype != torch.float32:
        gated(dtype)
        return 0 if ok else 1
    # The tile settings around the defaults: the sum over the shapes, skinny only.
    default = skinny.TILE, skinny.PROGRAMS
    try:
        for tile, programs in ((2048, 256), (8192, 256), (4096, 128), (4096, 512), (8192, 512), (2048, 512)):
            skinny.TILE, skinny.PROGRAMS = tile, programs
            sweep = 0.0
            for m, k, n in SHAPES:
                x, w, b = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda"), torch.randn(n, device="cuda")
                sweep += timed(lambda: skinny.matmul_t(x, w, b, enabled=True))
            print(f"TILE {tile} PROGRAMS {programs}: skinny sum {sweep:.1f} us", flush=True)
    except Exception as e:  # a setting that does not compile is reported, not fatal
        print(f"sweep stopped: {type(e).__name__}: {e}")
    skinny.TILE, skinny.PROGRAMS = default
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
