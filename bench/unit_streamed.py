"""The 192-channel unit as a CUDA C++ wgmma kernel with streamed weights
(``code2wav/kernels/unit_streamed.py``) against kernels/unit_conv.py's Triton unit, on the GPU:
the unit from the history concat against a float32 unit (SNR, max error) and the Triton unit, at
each dilation and at step shapes from one frame to 16 x 25 (ragged lengths included); the window
the kernel fills itself (the history read from the pool, act1 applied, the new history written
back) against the concat and the kernel reading it; both stagings the same bit for bit; then
the graph-replayed time of each. argv: [shapes, default 1x1,16x1,1x25,16x25,20x25] [replays,
default 10].
"""

from __future__ import annotations

import sys

import torch
from gpu_timing import timed_in_graph  # bench/ is the script's directory, first on sys.path
from unit_tail import snr
from unit_window import bf16, diff, history, inputs, reference, weights

from code2wav.kernels import unit_conv
from code2wav.kernels import unit_streamed as us
from code2wav.kernels.history import history_cat

C, K = us.C, us.TAPS
SPF = 640  # samples per frame at 192 channels
NAMES = ("w1", "w2", "b1", "alpha", "beta", "b2", "alpha1", "beta1")  # pack's order


def check(w, packs, shapes, dilations) -> bool:
    ok = True
    for (B, L) in shapes:
        for d in dilations:
            xx, x = inputs(B, L, d, c=C)
            ref = reference(xx, x, w, d)
            tri = unit_conv.unit_conv(xx, x, w["w1"], d, w["b1"], w["alpha"], w["beta"], w["w2"], w["b2"])
            ys = {kg: us.unit_streamed(x, *p, d, xx=xx, kg=kg) for kg, p in packs.items()}
            y = ys[us.DEFAULT_KG]
            same = all(torch.equal(v, y) for v in ys.values())
            s_tri, s_unit = snr(ref, tri), snr(ref, y)
            good = s_unit > 40 and s_unit > s_tri - 1.0 and same
            print(f"B={B:3d} L={L:6d} d={d}: triton {s_tri:5.1f} dB; streamed from xx {s_unit:5.1f} dB (max "
                  f"{(y.float() - ref).abs().max().item():.3g}; vs triton max {(y.float() - tri.float()).abs().max().item():.3g}); "
                  f"stagings {'the same' if same else 'DIFFER'}" + ("  ok" if good else "  FAIL"), flush=True)
            ok &= good
            ok &= check_history(x, w, packs[us.DEFAULT_KG], d, L // 10 if L < SPF else SPF)
    return ok


def check_history(x, w, packed, d: int, rate: int) -> bool:
    """The window filled by the kernel against the history concat's: no pool (zeros), then a
    pool with ragged new frames; the outputs and the pools written back."""
    B, _, L = x.shape
    H, act1 = (K - 1) * d, (w["alpha1"], w["beta1"])
    xx0 = history_cat(x, H, act=act1)
    y0, y = us.unit_streamed(x, *packed, d, xx=xx0), us.unit_streamed(x, *packed, d)
    pool, slots, n_new = history(B, L, d, rate, c=C)
    pool_ref, pool_got = pool.clone(), pool.clone()
    xx1 = history_cat(x, H, pool_ref, slots, act1, n_new=n_new, rate=rate)
    y1 = us.unit_streamed(x, *packed, d, xx=xx1)
    y1_got = us.unit_streamed(x, *packed, d, pool=pool_got, slots=slots, n_new=n_new, rate=rate)
    ref = reference(xx1, x, w, d)
    s_ref, s_got = snr(ref, y1), snr(ref, y1_got)
    # As bench/unit_window.py: e^alpha from torch (the packed parameters) vs Triton's exp in the
    # concat may move a rounding to bf16 now and then; rare, and no loss in SNR.
    rare = lambda a, b: (a.float() != b.float()).float().mean().item() < 1e-3  # noqa: E731
    near = lambda a, b: ((a.float() - b.float()).abs() <= 2 ** -7 * b.float().abs() + 1e-6).all().item()  # noqa: E731
    good = rare(y, y0) and rare(y1_got, y1) and s_got > s_ref - 0.1 and rare(pool_got, pool_ref) and near(pool_got, pool_ref)
    print(f"      history d={d} rate={rate}: zeros: {diff(y, y0)}; pool: out {diff(y1_got, y1)}, "
          f"{s_got:5.1f} vs {s_ref:5.1f} dB; pool written: {diff(pool_got, pool_ref)}" + ("  ok" if good else "  FAIL"), flush=True)
    return good


def timings(w, packs, shapes, replays: int) -> None:
    act1 = (w["alpha1"], w["beta1"])
    print("rows x frames, d: the history concat + the Triton unit; the streamed unit reading the history, "
          + " / ".join(f"kg={kg}" for kg in packs) + ", us (TFLOP/s)")
    for (B, T) in shapes:
        for d in (1, 9):
            L = T * SPF
            xx, x = inputs(B, L, d, c=C)
            pool = torch.zeros(B + 1, C, (K - 1) * d, dtype=torch.bfloat16, device="cuda")
            slots, n_new = torch.arange(B, device="cuda"), torch.full((B,), T, device="cuda")
            cat = timed_in_graph(lambda: history_cat(x, (K - 1) * d, pool, slots, act1, n_new=n_new, rate=SPF),  # noqa: B023
                                 calls=20, replays=replays)
            tri = timed_in_graph(lambda: unit_conv.unit_conv(xx, x, w["w1"], d, w["b1"], w["alpha"], w["beta"],  # noqa: B023
                                                              w["w2"], w["b2"]), calls=20, replays=replays)
            fused = [timed_in_graph(lambda: us.unit_streamed(x, *p, d, pool=pool, slots=slots, n_new=n_new, rate=SPF,  # noqa: B023
                                                             kg=kg), calls=20, replays=replays)  # noqa: B023
                     for kg, p in packs.items()]
            flop = 2 * B * L * C * C * (K + 1)
            print(f"{B:3d} x {T:2d}, d={d}: concat {cat:7.1f} + triton {tri:8.1f} = {cat + tri:8.1f} ({flop / (cat + tri) / 1e6:5.1f}); "
                  "streamed " + " / ".join(f"{t:8.1f} ({flop / t / 1e6:5.1f})" for t in fused), flush=True)


def main() -> int:
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[1] if len(sys.argv) > 1 else "1x1,16x1,1x25,16x25,20x25").split(",")]
    replays = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    w = bf16(weights(c=C))
    packed = us.pack(*(w[k] for k in NAMES))
    packs = {kg: packed for kg in us.STAGINGS}  # one image, streamed at each staging
    print(f"smem {us.smem_bytes(9)} B at d=9, MAX_DILATION {us.MAX_DILATION}; {torch.cuda.get_device_name()}", flush=True)
    ok = check(w, packs, [(1, SPF), (3, 1000), (16, 25 * SPF)], (1, 3, 9, us.MAX_DILATION))
    timings(w, packs, shapes, replays)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
