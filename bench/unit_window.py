"""The 96-channel unit as a CUDA C++ wgmma kernel (``code2wav/kernels/unit_window.py``) against
kernels/unit_conv.py's Triton unit, on the GPU: the conv alone (``mode=1``) and the whole unit
against a float32 unit (SNR, max error), at each dilation and at step shapes from one frame to
20 x 25 (ragged lengths included), then both kernels' graph-replayed time. argv: [shapes, default
1x1,16x1,1x25,16x25,20x25] [replays of each timing, default 10].
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from gpu_timing import timed_in_graph  # bench/ is the script's directory, first on sys.path
from unit_tail import snr

from code2wav.kernels import unit_conv, unit_window

C, K = 96, 7
SPF = 1920  # samples per frame at 96 channels


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).cuda()  # noqa: E731
    return dict(w1=r(C, C, K, scale=(C * K) ** -0.5), b1=r(C, scale=0.1), alpha=r(C, scale=0.2),
                beta=r(C, scale=0.2), w2=r(C, C, 1, scale=C ** -0.5), b2=r(C, scale=0.1))


def inputs(B: int, L: int, d: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``xx`` (``[B, C, 6 d + L]`` channels-last: the history concat) and ``x`` (the residual)."""
    g = torch.Generator().manual_seed(seed)
    xx = torch.randn(B, (K - 1) * d + L, C, generator=g).to(torch.bfloat16).cuda().transpose(1, 2)
    x = torch.randn(B, L, C, generator=g).to(torch.bfloat16).cuda().transpose(1, 2)
    return xx, x


def reference(xx, x, w, d: int, conv_only: bool = False) -> torch.Tensor:
    h = F.conv1d(xx.float(), w["w1"].float(), w["b1"].float(), dilation=d)
    if conv_only:
        return h
    a, inv_b = w["alpha"].float().exp()[:, None], 1.0 / (w["beta"].float().exp()[:, None] + 1e-9)
    h = (h + inv_b * torch.sin(h * a) ** 2).to(torch.bfloat16).float()
    return x.float() + F.conv1d(h, w["w2"].float(), w["b2"].float())


def bf16(w):
    return {k: v.to(torch.bfloat16) for k, v in w.items()}


def packed(wb) -> tuple[torch.Tensor, torch.Tensor]:
    return unit_window.pack(wb["w1"], wb["w2"], wb["b1"], wb["alpha"], wb["beta"], wb["b2"])


def check(w, shapes, dilations) -> bool:
    wb = bf16(w)
    wpack, params = packed(wb)
    ok = True
    for (B, L) in shapes:
        for d in dilations:
            xx, x = inputs(B, L, d)
            conv = unit_window.unit_window(xx, x, wpack, params, d, mode=1, kernel="unit_window")
            ref_c = reference(xx, x, wb, d, conv_only=True)
            ref = reference(xx, x, wb, d)
            tri = unit_conv.unit_conv(xx, x, wb["w1"], d, wb["b1"], wb["alpha"], wb["beta"], wb["w2"], wb["b2"])
            s_conv, s_tri = snr(ref_c, conv), snr(ref, tri)
            line = f"B={B:3d} L={L:6d} d={d}: conv {s_conv:5.1f} dB (max {(conv.float() - ref_c).abs().max().item():.3g}), triton {s_tri:5.1f} dB"
            good = s_conv > 45
            for name in unit_window.KERNELS:
                y = unit_window.unit_window(xx, x, wpack, params, d, kernel=name)
                s_unit = snr(ref, y)
                good &= s_unit > 40 and s_unit > s_tri - 1.0
                line += f"; {name} {s_unit:5.1f} dB (vs triton max {(y.float() - tri.float()).abs().max().item():.3g})"
            ok &= good
            print(line + ("  ok" if good else "  FAIL"), flush=True)
    return ok


def timings(w, shapes, replays: int) -> None:
    wb = bf16(w)
    wpack, params = packed(wb)
    print("rows x frames, d: the Triton unit and each window kernel, us (TFLOP/s)")
    for (B, T) in shapes:
        for d in (1, 9):
            L = T * SPF
            xx, x = inputs(B, L, d)
            tri = timed_in_graph(lambda: unit_conv.unit_conv(xx, x, wb["w1"], d, wb["b1"], wb["alpha"], wb["beta"],
                                                              wb["w2"], wb["b2"]), calls=20, replays=replays)
            flop = 2 * B * L * C * C * (K + 1)
            line = f"{B:3d} x {T:2d}, d={d}: triton {tri:8.1f} us"
            for name in unit_window.KERNELS:
                win = timed_in_graph(lambda: unit_window.unit_window(xx, x, wpack, params, d, kernel=name), calls=20, replays=replays)  # noqa: B023
                line += f"; {name} {win:8.1f} us ({flop / win / 1e6:5.1f} TFLOP/s)"
            print(line, flush=True)


def main() -> int:
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[1] if len(sys.argv) > 1 else "1x1,16x1,1x25,16x25,20x25").split(",")]
    replays = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    w = weights()
    print(f"smem {unit_window.smem_bytes(9)} B at d=9; {torch.cuda.get_device_name()}", flush=True)
    ok = check(w, [(1, SPF), (3, 1000), (16, 25 * SPF)], (1, 3, 8, 9))
    timings(w, shapes, replays)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
