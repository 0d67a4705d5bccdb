"""Where the window unit's conv goes wrong, if ``bench/unit_window.py`` fails: the conv alone
(``conv_only``) with one tap's weight the identity, so each output should be one input element,
``y[t, c] = xx[t + tap * d, c]``. For each tap and dilation: how many outputs are exact, and for
the first wrong ones, which input row of the same channel (and which channel of the expected row)
holds their value. A wrong row offset points at the descriptors' row stepping, a wrong channel at
the chunk (LBO) stride or the fragment layout. argv: none.
"""

from __future__ import annotations

import torch

from code2wav.kernels import unit_window

C, K = unit_window.C, unit_window.TAPS


def probe(tap: int, d: int, L: int = 256) -> str:
    w1 = torch.zeros(C, C, K)
    w1[:, :, tap] = torch.eye(C)
    zero = torch.zeros(C)
    wpack, params = unit_window.pack(w1.cuda(), torch.eye(C)[:, :, None].cuda(), *[zero.cuda()] * 6)
    # a row's index (below 256: exact in bf16) signed by channel parity, a half added on odd
    # channel pairs (rounded to bf16 as the kernel sees it: past 128 the half may round away)
    rows = L + (K - 1) * d
    xx = (torch.arange(rows)[:, None] % 256).float().expand(rows, C).clone()
    xx *= torch.where(torch.arange(C) % 2 == 0, 1.0, -1.0)
    xx += (torch.arange(C) // 2 % 2) * 0.5 * torch.sign(xx)  # channel pairs told apart too
    xx = xx.to(torch.bfloat16).float()
    xxb = xx.to(torch.bfloat16).cuda()[None].transpose(1, 2)
    x = torch.zeros(1, L, C, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    y = unit_window.unit_window(x, wpack, params, d, xx=xxb, conv_only=True)[0].float().t().cpu()
    want = xx[tap * d: tap * d + L]
    bad = (y != want).nonzero()
    line = f"tap {tap} d {d}: {L * C - len(bad)}/{L * C} exact"
    for t, c in bad[:6].tolist():
        v = y[t, c].item()
        same_c = (xx[:, c] == v).nonzero().flatten().tolist()[:3]
        same_r = (xx[t + tap * d] == v).nonzero().flatten().tolist()[:3]
        line += f"\n   y[{t},{c}]={v:g} (want {want[t, c].item():g}): rows of channel {c} {same_c}, channels of row {t + tap * d} {same_r}"
    return line


def main() -> None:
    print(torch.cuda.get_device_name(), flush=True)
    for d in (1, 3, 8):
        for tap in (0, 1, 3, 6):
            print(probe(tap, d, L=256 - (K - 1) * d - 1), flush=True)


if __name__ == "__main__":
    main()
