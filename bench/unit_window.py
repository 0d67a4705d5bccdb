"""The 96-channel unit as a CUDA C++ wgmma kernel (``code2wav/kernels/unit_window.py``) against
kernels/unit_conv.py's Triton unit, on the GPU: the conv alone (``conv_only``) and the whole unit
against a float32 unit (SNR, max error), at each dilation and at step shapes from one frame to
16 x 25 (ragged lengths included); then the window the kernel fills itself (the history read
from the pool, act1 applied, the new history written back) against the history concat
(kernels/history.py) and the kernel reading it: outputs and pools the same, and the same bit for
bit with two warpgroups filling the windows (``producers=2``); then the graph-replayed time of
each. argv: [shapes, default 1x1,16x1,1x25,16x25,20x25] [replays of each timing, default 10].
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from gpu_timing import timed_in_graph  # bench/ is the script's directory, first on sys.path
from unit_tail import snr

from code2wav.kernels import unit_conv, unit_window
from code2wav.kernels.history import history_cat
from code2wav.kernels.snake import to_layout

C, K = 96, 7
SPF = 1920  # samples per frame at 96 channels
SLOTS = 40  # the pool's rows in the history checks; the last one is the scratch slot


def weights(seed: int = 0, c: int = C) -> dict[str, torch.Tensor]:
    """Random float32 weights of a ``c``-channel unit, the k=7 conv's channels-last as the decoder
    stores it (the Triton unit reads it so; a contiguous one is several times slower there)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).cuda()  # noqa: E731
    return dict(w1=to_layout(r(c, c, K, scale=(c * K) ** -0.5), channels_last=True), b1=r(c, scale=0.1),
                alpha=r(c, scale=0.2), beta=r(c, scale=0.2), w2=r(c, c, 1, scale=c ** -0.5), b2=r(c, scale=0.1),
                alpha1=r(c, scale=0.2), beta1=r(c, scale=0.2))


def inputs(B: int, L: int, d: int, seed: int = 1, c: int = C) -> tuple[torch.Tensor, torch.Tensor]:
    """``xx`` (``[B, c, 6 d + L]`` channels-last: the history concat) and ``x`` (the residual)."""
    g = torch.Generator().manual_seed(seed)
    xx = torch.randn(B, (K - 1) * d + L, c, generator=g).to(torch.bfloat16).cuda().transpose(1, 2)
    x = torch.randn(B, L, c, generator=g).to(torch.bfloat16).cuda().transpose(1, 2)
    return xx, x


def history(B: int, L: int, d: int, rate: int, seed: int = 2, c: int = C):
    """A pool of random histories, ``B`` rows on distinct slots but the last two (padding rows on
    the scratch slot, no new frames), ragged new frames of ``rate`` samples within ``L``."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.randn(SLOTS, c, (K - 1) * d, generator=g).to(torch.bfloat16).cuda()
    slots = torch.randperm(SLOTS - 1, generator=g)[:B]
    n_new = torch.randint(0, L // rate + 1, (B,), generator=g)
    if B > 2:
        slots[-2:], n_new[-2:] = SLOTS - 1, 0
    return pool, slots.cuda(), n_new.cuda()


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
    return unit_window.pack(*(wb[k] for k in ("w1", "w2", "b1", "alpha", "beta", "b2", "alpha1", "beta1")))


def diff(a: torch.Tensor, b: torch.Tensor) -> str:
    return f"{(a.float() != b.float()).sum().item()} of {a.numel()} differ, max {(a.float() - b.float()).abs().max().item():.3g}"


def check(w, shapes, dilations) -> bool:
    wb = bf16(w)
    wpack, params = packed(wb)
    ok = True
    for (B, L) in shapes:
        for d in dilations:
            xx, x = inputs(B, L, d)
            conv = unit_window.unit_window(x, wpack, params, d, xx=xx, conv_only=True)
            ref_c = reference(xx, x, wb, d, conv_only=True)
            ref = reference(xx, x, wb, d)
            tri = unit_conv.unit_conv(xx, x, wb["w1"], d, wb["b1"], wb["alpha"], wb["beta"], wb["w2"], wb["b2"])
            y = unit_window.unit_window(x, wpack, params, d, xx=xx)
            s_conv, s_tri, s_unit = snr(ref_c, conv), snr(ref, tri), snr(ref, y)
            good = s_conv > 45 and s_unit > 40 and s_unit > s_tri - 1.0
            print(f"B={B:3d} L={L:6d} d={d}: conv {s_conv:5.1f} dB (max {(conv.float() - ref_c).abs().max().item():.3g}), "
                  f"triton {s_tri:5.1f} dB; window from xx {s_unit:5.1f} dB (vs triton max {(y.float() - tri.float()).abs().max().item():.3g})"
                  + ("  ok" if good else "  FAIL"), flush=True)
            ok &= good
            ok &= check_history(x, wb, wpack, params, d, L // 10 if L < SPF else SPF)
    return ok


def check_history(x, wb, wpack, params, d: int, rate: int) -> bool:
    """The window filled by the kernel against the history concat's: no pool (zeros), then a
    pool with ragged new frames; the outputs and the pools written back."""
    B, _, L = x.shape
    H, act1 = (K - 1) * d, (wb["alpha1"], wb["beta1"])
    xx0 = history_cat(x, H, act=act1)
    y0, y = unit_window.unit_window(x, wpack, params, d, xx=xx0), unit_window.unit_window(x, wpack, params, d)
    pool, slots, n_new = history(B, L, d, rate)
    pool_ref, pool_got = pool.clone(), pool.clone()
    xx1 = history_cat(x, H, pool_ref, slots, act1, n_new=n_new, rate=rate)
    y1 = unit_window.unit_window(x, wpack, params, d, xx=xx1)
    y1_got = unit_window.unit_window(x, wpack, params, d, pool=pool_got, slots=slots, n_new=n_new, rate=rate)
    pool_two = pool.clone()  # two warpgroups filling the windows: the same outputs and pool, bit for bit
    y1_two = unit_window.unit_window(x, wpack, params, d, pool=pool_two, slots=slots, n_new=n_new, rate=rate, producers=2)
    y_two = unit_window.unit_window(x, wpack, params, d, xx=xx0, producers=2)
    two = torch.equal(y1_two, y1_got) and torch.equal(pool_two, pool_got) and torch.equal(y_two, y0)
    ref = reference(xx1, x, wb, d)
    s_ref, s_got = snr(ref, y1), snr(ref, y1_got)
    # The same but for SnakeBeta's e^alpha: torch's (the packed parameters) vs Triton's exp in
    # the concat may differ in a last fp32 bit and move a rounding to bf16 now and then (one
    # window value a bf16 step off, so an output a few steps off): rare, and no loss in SNR.
    rare = lambda a, b: (a.float() != b.float()).float().mean().item() < 1e-3  # noqa: E731
    near = lambda a, b: ((a.float() - b.float()).abs() <= 2 ** -7 * b.float().abs() + 1e-6).all().item()  # noqa: E731
    good = (rare(y, y0) and rare(y1_got, y1) and s_got > s_ref - 0.1 and rare(pool_got, pool_ref) and near(pool_got, pool_ref)
            and two)
    print(f"      history d={d} rate={rate}: zeros: {diff(y, y0)}; pool: out {diff(y1_got, y1)}, "
          f"{s_got:5.1f} vs {s_ref:5.1f} dB; pool written: {diff(pool_got, pool_ref)}; two filling warpgroups "
          + ("the same" if two else "DIFFER") + ("  ok" if good else "  FAIL"), flush=True)
    return good


def timings(w, shapes, replays: int) -> None:
    wb = bf16(w)
    wpack, params = packed(wb)
    act1 = (wb["alpha1"], wb["beta1"])
    print("rows x frames, d: the Triton unit; the history concat, the window unit from it, both; the window unit "
          "reading the history itself with one / two warpgroups filling the windows, us (TFLOP/s)")
    for (B, T) in shapes:
        for d in (1, 9):
            L = T * SPF
            xx, x = inputs(B, L, d)
            pool = torch.zeros(B + 1, C, (K - 1) * d, dtype=torch.bfloat16, device="cuda")
            slots, n_new = torch.arange(B, device="cuda"), torch.full((B,), T, device="cuda")
            tri = timed_in_graph(lambda: unit_conv.unit_conv(xx, x, wb["w1"], d, wb["b1"], wb["alpha"], wb["beta"],
                                                              wb["w2"], wb["b2"]), calls=20, replays=replays)
            cat = timed_in_graph(lambda: history_cat(x, (K - 1) * d, pool, slots, act1, n_new=n_new, rate=SPF),  # noqa: B023
                                 calls=20, replays=replays)
            win = timed_in_graph(lambda: unit_window.unit_window(x, wpack, params, d, xx=xx), calls=20, replays=replays)  # noqa: B023
            fused = [timed_in_graph(lambda: unit_window.unit_window(x, wpack, params, d, pool=pool, slots=slots,  # noqa: B023
                                                                    n_new=n_new, rate=SPF, producers=n),  # noqa: B023
                                    calls=20, replays=replays) for n in (1, 2)]
            flop = 2 * B * L * C * C * (K + 1)
            print(f"{B:3d} x {T:2d}, d={d}: triton {tri:8.1f}; concat {cat:7.1f} + window {win:8.1f} ({flop / win / 1e6:5.1f}) "
                  f"= {cat + win:8.1f}; reading the history, one / two filling warpgroups "
                  f"{fused[0]:8.1f} ({flop / fused[0] / 1e6:5.1f}) / {fused[1]:8.1f} ({flop / fused[1] / 1e6:5.1f})", flush=True)


def main() -> int:
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[1] if len(sys.argv) > 1 else "1x1,16x1,1x25,16x25,20x25").split(",")]
    replays = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    w = weights()
    print(f"smem {unit_window.smem_bytes(9)} B at d=9; {torch.cuda.get_device_name()}", flush=True)
    ok = check(w, [(1, SPF), (3, 1000), (16, 25 * SPF)], (1, 3, 8, 9, unit_window.MAX_DILATION))
    timings(w, shapes, replays)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
