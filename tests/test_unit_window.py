"""kernels/unit_window.py's host side, on CPU: the shared-memory image ``pack`` writes, the window's
rows, where the CUDA C++ unit may run and which histories it takes. The kernel itself needs an sm90 GPU: its exactness
against a float32 unit and the Triton unit is ``bench/unit_window.py``'s (BENCHMARKS.md).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from code2wav.kernels import unit_window as uw

C, K = uw.C, uw.TAPS


def _weights(seed: int = 0, c: int = C) -> list[torch.Tensor]:
    """Random float64 weights of a ``c``-channel unit, in ``pack``'s order: w1, w2, b1, alpha,
    beta, b2, alpha1, beta1."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g, dtype=torch.float64) * scale)  # noqa: E731
    return [r(c, c, K, scale=(c * K) ** -0.5), r(c, c, 1, scale=c ** -0.5), r(c, scale=0.1), r(c, scale=0.2),
            r(c, scale=0.2), r(c, scale=0.1), r(c, scale=0.2), r(c, scale=0.2)]


def _float64_unit(w: tuple[torch.Tensor, ...], d: int, L: int, B: int = 2) -> tuple[torch.Tensor, ...]:
    """Random ``xx`` (the history concat) and ``x`` of ``B`` rows, and the unit over them in float64
    from ``w`` = (w1, w2, b1, alpha, beta, b2): the reference the packed images are read against."""
    c = w[0].shape[0]
    g = torch.Generator().manual_seed(1)
    xx = torch.randn(B, c, (K - 1) * d + L, generator=g, dtype=torch.float64)
    x = torch.randn(B, c, L, generator=g, dtype=torch.float64)
    f = [t.double() for t in w]
    h = F.conv1d(xx, f[0], f[2], dilation=d)
    h = h + torch.sin(h * f[3].exp()[:, None]) ** 2 / (f[4].exp()[:, None] + 1e-9)
    return xx, x, x + F.conv1d(h, f[1], f[5])


def _read_like_the_kernel(xx: torch.Tensor, x: torch.Tensor, wpack: torch.Tensor, params: torch.Tensor, d: int) -> torch.Tensor:
    """The unit as the kernel reads its operands: a window row holds 12 chunks of 8 channels, a
    weight tap is ``[chunk][n][8]``; tap ``j``'s products start ``j * d`` rows into the window."""
    B, _, T = xx.shape
    L = x.shape[-1]
    n1 = K * (C // 8) * C * 8
    img1 = wpack[:n1].double().view(K, C // 8, C, 8)
    img2 = wpack[n1:].double().view(C // 8, C, 8)
    b1, a, inv_b, b2 = params[:4].double()
    rows = xx.double().transpose(1, 2).reshape(B, T, C // 8, 8)
    h = sum(torch.einsum("bmce,cne->bmn", rows[:, j * d: j * d + L], img1[j]) for j in range(K)) + b1
    v = h + inv_b * torch.sin(a * h) ** 2
    y = torch.einsum("bmce,cne->bmn", v.reshape(B, L, C // 8, 8), img2) + b2
    return y.transpose(1, 2) + x.double()


@pytest.mark.parametrize("d", [1, 3, 9])
def test_pack_writes_the_image_the_kernel_reads(d):
    w1, w2, b1, alpha, beta, b2, alpha1, beta1 = [t.to(torch.bfloat16) for t in _weights()]
    wpack, params = uw.pack(w1, w2, b1, alpha, beta, b2, alpha1, beta1)
    assert wpack.dtype == torch.bfloat16 and wpack.numel() == (K + 1) * C * C
    assert params.dtype == torch.float32 and params.shape == (uw.PARAMS, C)
    # act1's rows, for the window the kernel fills from x: e^alpha1 and 1 / (e^beta1 + 1e-9)
    torch.testing.assert_close(params[4], alpha1.double().exp().float())
    torch.testing.assert_close(params[5], (1.0 / (beta1.double().exp() + 1e-9)).float())
    xx, x, ref = _float64_unit((w1, w2, b1, alpha, beta, b2), d, 200)
    got = _read_like_the_kernel(xx, x, wpack, params, d)
    # params hold e^alpha and 1 / (e^beta + 1e-9) in float32: relative error ~1e-7
    assert (got - ref).abs().max().item() < 1e-5 * ref.abs().max().item()


def test_pack_takes_channels_last_weights():
    w = [t.to(torch.bfloat16) for t in _weights(2)]
    w1_cl = w[0].transpose(1, 2).contiguous().transpose(1, 2)  # [out, k, in] in memory, as the decoder stores it
    a, b = uw.pack(*w), uw.pack(w1_cl, *w[1:])
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("d", [1, 3, 9, uw.MAX_DILATION])
def test_a_window_holds_every_tap_of_its_tile_and_fits(d):
    rows = uw.window_rows(d)
    assert rows >= uw.TILE + (K - 1) * d and rows % 8 == 1  # odd 16-byte rows a chunk apart: copies spread over the banks
    assert uw.smem_bytes(d) <= uw.SMEM_LIMIT


def test_applies_only_to_bf16_96_channel_units_on_a_gpu():
    x = torch.zeros(2, C, 4000, dtype=torch.bfloat16).transpose(1, 2).contiguous().transpose(1, 2)
    assert not uw.applies(x, 1, 9)  # CPU
    assert not uw.applies(x, 0, 9)  # off
    assert uw.smem_bytes(uw.MAX_DILATION + 1) > uw.SMEM_LIMIT  # a dilation whose window does not fit is refused
    with pytest.raises(ValueError, match="96-channel"):
        uw.unit_window(x[:, :64], torch.zeros(1), torch.zeros(1), 1)
    with pytest.raises(ValueError, match="bf16"):
        uw.unit_window(x.float(), torch.zeros(1), torch.zeros(1), 1)
    with pytest.raises(ValueError, match="channels-last x"):
        uw.unit_window(x.contiguous(), torch.zeros(1), torch.zeros(1), 1)


def test_the_history_it_reads_must_be_the_layers_pool_rows():
    """Reading the history itself, the kernel indexes the pool as ``[slots, C, 6 d]`` with time
    contiguous and reads int64 slots and frame counts, one per row: anything else is refused
    before a launch."""
    B, d = 2, 3
    x = torch.zeros(B, 4000, C, dtype=torch.bfloat16).transpose(1, 2)
    w = (torch.zeros(1), torch.zeros(1))
    pool = torch.zeros(5, C, 6 * d, dtype=torch.bfloat16)
    rows = torch.zeros(B, dtype=torch.long)
    with pytest.raises(ValueError, match="pool"):
        uw.unit_window(x, *w, d, pool=torch.zeros(5, C, 6 * 9, dtype=torch.bfloat16), slots=rows, n_new=rows)  # another dilation's
    with pytest.raises(ValueError, match="pool"):
        uw.unit_window(x, *w, d, pool=pool.float(), slots=rows, n_new=rows)
    with pytest.raises(ValueError, match="pool"):
        uw.unit_window(x, *w, d, pool=pool.transpose(1, 2).contiguous().transpose(1, 2), slots=rows, n_new=rows)
    with pytest.raises(ValueError, match="slots"):
        uw.unit_window(x, *w, d, pool=pool, slots=rows.int(), n_new=rows)
    with pytest.raises(ValueError, match="n_new"):
        uw.unit_window(x, *w, d, pool=pool, slots=rows, n_new=None)
    with pytest.raises(ValueError, match="xx has"):
        uw.unit_window(x, *w, d, xx=x)  # no room for the history


def test_one_or_two_warpgroups_fill_the_windows():
    """``LayerChoices.window_producers`` picks how many warpgroups fill the windows: 1 or 2, and
    nothing else reaches a launch, from the layer choices or the kernel's own call."""
    from code2wav.model.choices import LayerChoices

    assert LayerChoices().window_producers == 2  # the default since session 34 (BENCHMARKS.md)
    assert LayerChoices(window_producers=1).window_producers == 1
    for n in (0, 3):
        with pytest.raises(ValueError, match="window_producers"):
            LayerChoices(window_producers=n)
    x = torch.zeros(2, 4000, C, dtype=torch.bfloat16).transpose(1, 2)
    with pytest.raises(ValueError, match="producers=3"):
        uw.unit_window(x, torch.zeros(1), torch.zeros(1), 3, producers=3)
