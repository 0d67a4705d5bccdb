"""kernels/tail_wide.py's host side, on CPU: the weight stages ``pack`` writes (read back the way
the kernel streams them), its shared memory, where the kernel may run and what it refuses. The
kernel itself needs an sm90 GPU: its exactness against a float32 tail and the three passes it
replaces is ``bench/tail_wide.py``'s and ``bench/gpu_check.py``'s (BENCHMARKS.md).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from code2wav.kernels import tail_wide as tw
from code2wav.kernels.sm90 import SMEM_LIMIT
from code2wav.model.choices import LayerChoices

C = 384


def _weights(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g, dtype=torch.float64) * scale).to(torch.bfloat16)  # noqa: E731
    # w2, b1, alpha, beta, b2: pack's order
    return [r(C, C, 1, scale=C ** -0.5), r(C, scale=0.1), r(C, scale=0.2), r(C, scale=0.2), r(C, scale=0.1)]


def _tail_like_the_kernel(h: torch.Tensor, x: torch.Tensor, wpack: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """The tail as the kernel computes it: the activated rows as ``[chunk][row][8]``, then for each
    output chunk ``j`` of NCH channels the stages ``j * (C / KCH) + i`` in order, stage ``i``
    holding inputs ``i * KCH ..`` as ``[8-input chunk][output][8]``."""
    b1, a, inv_b, b2 = params.double()
    v = h.double().transpose(1, 2) + b1  # [B, L, C]
    act = v + inv_b * torch.sin(a * v) ** 2
    per_stage = tw.KCH * tw.NCH
    stages = wpack.double().view(-1, tw.KCH // 8, tw.NCH, 8)
    assert stages.shape[0] == (C // tw.NCH) * (C // tw.KCH) and per_stage * stages.shape[0] == C * C
    out = []
    for j in range(C // tw.NCH):
        acc = 0
        for i in range(C // tw.KCH):
            rows = act[..., i * tw.KCH : (i + 1) * tw.KCH].unflatten(-1, (tw.KCH // 8, 8))  # [B, L, kc, 8]
            acc = acc + torch.einsum("blce,cne->bln", rows, stages[j * (C // tw.KCH) + i])
        out.append(acc)
    return (torch.cat(out, -1) + b2).transpose(1, 2) + x.double()


def test_pack_writes_the_stages_the_kernel_streams():
    w2, b1, alpha, beta, b2 = _weights()
    wpack, params = tw.pack(w2, b1, alpha, beta, b2)
    assert wpack.dtype == torch.bfloat16 and wpack.numel() == C * C and wpack.is_contiguous()
    assert params.dtype == torch.float32 and params.shape == (4, C)
    g = torch.Generator().manual_seed(1)
    h, x = (torch.randn(2, C, 50, generator=g, dtype=torch.float64) for _ in range(2))
    f = [t.double() for t in (w2, b1, alpha, beta, b2)]
    v = h + f[1][:, None]
    ref = x + F.conv1d(v + torch.sin(v * f[2].exp()[:, None]) ** 2 / (f[3].exp()[:, None] + 1e-9), f[0], f[4])
    got = _tail_like_the_kernel(h, x, wpack, params)
    # params hold e^alpha and 1 / (e^beta + 1e-9) in float32: relative error ~1e-7
    assert (got - ref).abs().max().item() < 1e-5 * ref.abs().max().item()


def test_pack_takes_channels_last_weights():
    w = _weights(2)
    w2_cl = w[0].transpose(1, 2).contiguous().transpose(1, 2)
    a, b = tw.pack(*w), tw.pack(w2_cl, *w[1:])
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_its_shared_memory_fits_at_every_width_it_takes():
    for c in tw.WIDTHS:
        assert c % tw.NCH == 0 and c % tw.KCH == 0  # whole output chunks and weight stages
        for rows, t in tw.TILINGS.items():
            assert tw.smem_bytes(c, rows) <= SMEM_LIMIT and 1 <= t.lead < t.stages
    # 64-row tiles: two programs an SM (1 KB of each block's shared memory is the system's)
    assert 2 * (tw.smem_bytes(384, 64) + 1024) <= 228 * 1024
    assert tw.smem_bytes(768) > SMEM_LIMIT  # why 768 channels keep the three passes


def test_applies_only_to_bf16_384_channel_tails_on_a_gpu():
    x = torch.zeros(2, 4000, C, dtype=torch.bfloat16).transpose(1, 2)
    assert not tw.applies(x, x, 1)  # CPU
    assert not tw.applies(x, x, 0)  # off
    x96 = torch.zeros(2, 4000, 96, dtype=torch.bfloat16).transpose(1, 2)
    assert not tw.applies(x96, x96, 1)


def test_it_refuses_what_it_cannot_read():
    wpack, params = tw.pack(*_weights())
    x = torch.zeros(2, 100, C, dtype=torch.bfloat16).transpose(1, 2)
    with pytest.raises(ValueError, match="bf16 h and x of one shape"):
        tw.tail_wide(x.float(), x, wpack, params)
    with pytest.raises(ValueError, match="bf16 h and x of one shape"):
        tw.tail_wide(x[..., :50], x, wpack, params)
    with pytest.raises(ValueError, match="channels-last h"):
        tw.tail_wide(x.contiguous(), x, wpack, params)
    x192 = torch.zeros(2, 100, 192, dtype=torch.bfloat16).transpose(1, 2)
    with pytest.raises(ValueError, match="384"):
        tw.tail_wide(x192, x192, wpack, params)
    with pytest.raises(ValueError, match="pack"):
        tw.tail_wide(x, x, wpack[:-8], params)


def test_the_knob_takes_a_row_count():
    assert LayerChoices(tail_wide_rows=1).tail_wide_rows == 1
    with pytest.raises(ValueError, match="tail_wide_rows"):
        LayerChoices(tail_wide_rows=-1)
    assert LayerChoices(tail_wide_tile=64).tail_wide_tile == 64
    with pytest.raises(ValueError, match="tail_wide_tile"):
        LayerChoices(tail_wide_tile=96)
