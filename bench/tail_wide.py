"""The 384-channel units' tail as one CUDA C++ kernel (``code2wav/kernels/tail_wide.py``) on the
GPU, against the three passes it replaces (SnakeBeta with conv1's bias, cuDNN's 1x1 conv, the
residual add: the layers' path with ``tail_wide_rows=0``): both against a float32 tail over the
same bf16 inputs (the activation rounded to bf16 as both forms round it), at step shapes from one
frame to 20 x 25, ``h`` dense and with the batch stride of a folded conv's output; then the
graph-replayed time of each. argv: [shapes, default 1x1,16x1,1x25,16x25,20x25] [replays, default 10].
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from gpu_timing import shapes_arg, timed_in_graph  # bench/ is the script's directory, first on sys.path
from unit_tail import snr

from code2wav.kernels import tail_wide
from code2wav.kernels.snake import residual_add, snake_beta
from code2wav.model.layers import CausalConv1d, channels_last_

C = 384
SPF = 160  # samples per frame at 384 channels


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(torch.bfloat16).cuda()  # noqa: E731
    return dict(w2=r(C, C, 1, scale=C ** -0.5), b1=r(C, scale=0.1), alpha=r(C, scale=0.2), beta=r(C, scale=0.2), b2=r(C, scale=0.1))


def inputs(B: int, L: int, pad: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``h`` (``[B, C, L]`` channels-last, each row ``pad`` samples longer in memory: a folded
    conv's trimmed output) and ``x``."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, L + pad, C, generator=g).to(torch.bfloat16).cuda()[:, :L].transpose(1, 2)
    x = torch.randn(B, L, C, generator=g).to(torch.bfloat16).cuda().transpose(1, 2)
    return h, x


def reference(h, x, w) -> torch.Tensor:
    v = h.float() + w["b1"].float()[:, None]
    a, inv_b = w["alpha"].float().exp()[:, None], 1.0 / (w["beta"].float().exp()[:, None] + 1e-9)
    act = (v + inv_b * torch.sin(v * a) ** 2).to(torch.bfloat16).float()
    return x.float() + F.conv1d(act, w["w2"].float(), w["b2"].float())


def passes(w, conv2: CausalConv1d):
    """The three passes the layers run without the kernel."""
    return lambda h, x: residual_add(x, conv2(snake_beta(h, w["alpha"], w["beta"], w["b1"]), None, add_bias=False), w["b2"])


def main() -> int:
    shapes = shapes_arg(sys.argv[1] if len(sys.argv) > 1 else "1x1,16x1,1x25,16x25,20x25")
    replays = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    torch.backends.cudnn.benchmark = True
    w = weights()
    conv2 = CausalConv1d(C, C, 1).cuda().to(torch.bfloat16).eval().requires_grad_(False)
    conv2.conv.weight.data.copy_(w["w2"])
    channels_last_(conv2.conv)
    three = passes(w, conv2)
    wpack, params = tail_wide.pack(w["w2"], w["b1"], w["alpha"], w["beta"], w["b2"])
    print(f"smem {tail_wide.smem_bytes(C)} B; {torch.cuda.get_device_name()}", flush=True)
    print("rows x frames (h's padding): SNR vs the float32 tail, the three passes / the kernel at each tiling "
          f"{list(tail_wide.TILINGS)}; the largest difference from the float32 tail, the three passes / the kernel's worst; "
          "us graph-replayed, the three passes / each tiling (TFLOP/s)")
    ok = True
    with torch.no_grad():
        for (B, T) in shapes + [(3, 7), (2, 1)]:
            for pad in (0, 24):
                L = T * SPF if T > 7 or B != 3 else 1000  # (3, 7): a length no multiple of the tile
                h, x = inputs(B, L, pad)
                ref = reference(h, x, w)
                y3 = three(h, x)
                s3 = snr(ref, y3)
                ys = [tail_wide.tail_wide(h, x, wpack, params, rows) for rows in tail_wide.TILINGS]
                e3 = (y3.float() - ref).abs().max().item()
                ek = max((y.float() - ref).abs().max().item() for y in ys)
                sk = [snr(ref, y) for y in ys]
                # The kernel rounds once where the passes round three times; its SnakeBeta's
                # sin.approx against torch's sin in the reference moves an activation's rounding
                # to bf16 now and then, as in the passes.
                good = min(sk) > 45 and min(sk) > s3 - 0.5 and ek <= 2 * e3 + 1e-3 and all(
                    y.stride() == (L * C, 1, C) for y in ys)
                ok &= good
                line = f"{B:3d} x {T:2d} (+{pad:2d}): {s3:5.1f} / " + " / ".join(f"{v:5.1f}" for v in sk) + f" dB, {e3:.3g} / {ek:.3g}"
                if pad == 0 and (B, T) in shapes:
                    t3 = timed_in_graph(lambda: three(h, x), calls=20, replays=replays)  # noqa: B023
                    tk = [timed_in_graph(lambda: tail_wide.tail_wide(h, x, wpack, params, rows), calls=20, replays=replays)  # noqa: B023
                          for rows in tail_wide.TILINGS]
                    line += f"; {t3:7.1f} / " + " / ".join(f"{t:7.1f} ({2 * B * L * C * C / t / 1e6:5.1f})" for t in tk) + " us"
                print(line + ("  ok" if good else "  FAIL"), flush=True)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
