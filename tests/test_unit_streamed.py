"""kernels/unit_streamed.py's host side, on CPU: the stages ``pack`` writes, read back in the order
and at the offsets the kernel streams them, against the float64 unit; the shared memory each
staging needs; where the kernel may run and what it refuses. The kernel itself needs an sm90 GPU:
its exactness against a float32 unit, the Triton unit and the history concat is
``bench/unit_streamed.py``'s and ``bench/gpu_check.py``'s (BENCHMARKS.md).
"""

from __future__ import annotations

import pytest
import torch

from code2wav.kernels import unit_streamed as us
from tests.test_unit_window import _float64_unit as float64_unit
from tests.test_unit_window import _weights as unit_weights

C, K = us.C, us.TAPS


def _weights(seed: int = 0) -> list[torch.Tensor]:
    return unit_weights(seed, c=C)


def _stages(wpack: torch.Tensor, kg: int) -> list[torch.Tensor]:
    """The stages as the streaming thread copies them: the conv's ``7 C / kg`` of ``kg * C``
    values, then the 1x1 conv's ``2 C / kg`` of ``kg * C / 2``, back to back."""
    conv, tail = K * C // kg, 2 * C // kg
    sizes = [kg * C] * conv + [kg * C // 2] * tail
    assert sum(sizes) == wpack.numel()
    return list(wpack.double().split(sizes))


def _read_like_the_kernel(xx: torch.Tensor, x: torch.Tensor, wpack: torch.Tensor, params: torch.Tensor, d: int,
                          kg: int) -> torch.Tensor:
    """The unit as the kernel reads its operands: conv stage ``s`` is tap ``s // (C / kg)``'s
    input chunks ``(s % (C / kg)) * kg / 8 ..`` as ``[chunk][n][8]``, its products starting
    ``tap * d`` rows into the window; then, per output half, ``C / kg`` stages of ``[chunk][n][8]``
    against SnakeBeta of the conv's accumulator (the register operand)."""
    B, _, T = xx.shape
    L = x.shape[-1]
    per_tap = C // kg
    stages = _stages(wpack, kg)
    b1, a, inv_b, b2 = params[:4].double()
    rows = xx.double().transpose(1, 2).reshape(B, T, C // 8, 8)
    h = torch.zeros(B, L, C, dtype=torch.float64)
    for s in range(K * per_tap):
        tap, c0 = divmod(s, per_tap)
        w = stages[s].view(kg // 8, C, 8)
        h += torch.einsum("bmce,cne->bmn", rows[:, tap * d: tap * d + L, c0 * kg // 8: (c0 + 1) * kg // 8], w)
    h = h + b1
    v = (h + inv_b * torch.sin(a * h) ** 2).reshape(B, L, C // 8, 8)
    halves = []
    for nh in range(2):
        acc = torch.zeros(B, L, C // 2, dtype=torch.float64)
        for s in range(per_tap):
            w = stages[K * per_tap + nh * per_tap + s].view(kg // 8, C // 2, 8)
            acc += torch.einsum("bmce,cne->bmn", v[:, :, s * kg // 8: (s + 1) * kg // 8], w)
        halves.append(acc)
    y = torch.cat(halves, dim=-1) + b2
    return y.transpose(1, 2) + x.double()


@pytest.mark.parametrize("kg", sorted(us.STAGINGS))
@pytest.mark.parametrize("d", [1, 9])
def test_pack_writes_the_stages_the_kernel_streams(d, kg):
    w1, w2, b1, alpha, beta, b2, alpha1, beta1 = [t.to(torch.bfloat16) for t in _weights()]
    wpack, params = us.pack(w1, w2, b1, alpha, beta, b2, alpha1, beta1)  # one image, read at each staging
    assert wpack.dtype == torch.bfloat16 and wpack.numel() == (K + 1) * C * C
    assert params.dtype == torch.float32 and params.shape == (us.PARAMS, C)
    xx, x, ref = float64_unit((w1, w2, b1, alpha, beta, b2), d, 150)
    got = _read_like_the_kernel(xx, x, wpack, params, d, kg)
    # params hold e^alpha and 1 / (e^beta + 1e-9) in float32: relative error ~1e-7
    assert (got - ref).abs().max().item() < 1e-5 * ref.abs().max().item()


@pytest.mark.parametrize("kg", sorted(us.STAGINGS))
def test_every_dilation_of_the_model_fits_beside_the_stages(kg):
    for d in (1, 3, 9, us.MAX_DILATION):
        rows = us.window_rows(d)
        assert rows >= us.TILE + (K - 1) * d and rows % 8 == 1
        assert us.smem_bytes(d, kg) <= us.SMEM_LIMIT
    assert us.smem_bytes(us.MAX_DILATION + 1, kg) > us.SMEM_LIMIT or us.STAGINGS[kg].ring_bytes < max(
        s.ring_bytes for s in us.STAGINGS.values())
    # a stage's bytes: whole 16-byte copies, and the 1x1 conv's half stage fits a conv stage's buffer
    assert (kg * C * 2) % 16 == 0 and (kg * C) % 16 == 0 and kg % 16 == 0 and C % kg == 0


def test_applies_only_to_bf16_192_channel_units_on_a_gpu():
    x = torch.zeros(2, C, 4000, dtype=torch.bfloat16).transpose(1, 2).contiguous().transpose(1, 2)
    assert not us.applies(x, 1, 9)  # CPU
    assert not us.applies(x, 0, 9)  # off
    w = us.pack(*[t.to(torch.bfloat16) for t in _weights()])
    with pytest.raises(ValueError, match="192-channel"):
        us.unit_streamed(x[:, :96], *w, 1)
    with pytest.raises(ValueError, match="bf16"):
        us.unit_streamed(x.float(), *w, 1)
    with pytest.raises(ValueError, match="channels-last x"):
        us.unit_streamed(x.contiguous(), *w, 1)
    with pytest.raises(ValueError, match="pack"):
        us.unit_streamed(x, torch.zeros(8), w[1], 1)
    with pytest.raises(ValueError, match="kg"):
        us.unit_streamed(x, *w, 1, kg=48)
    with pytest.raises(ValueError, match="shared memory"):
        us.unit_streamed(x, *w, us.MAX_DILATION + 1)


def test_the_history_it_reads_must_be_the_layers_pool_rows():
    B, d = 2, 3
    x = torch.zeros(B, 4000, C, dtype=torch.bfloat16).transpose(1, 2)
    w = us.pack(*[t.to(torch.bfloat16) for t in _weights()])
    pool = torch.zeros(5, C, 6 * d, dtype=torch.bfloat16)
    rows = torch.zeros(B, dtype=torch.long)
    with pytest.raises(ValueError, match="pool"):
        us.unit_streamed(x, *w, d, pool=torch.zeros(5, C, 6 * 9, dtype=torch.bfloat16), slots=rows, n_new=rows)
    with pytest.raises(ValueError, match="pool"):
        us.unit_streamed(x, *w, d, pool=pool.float(), slots=rows, n_new=rows)
    with pytest.raises(ValueError, match="slots"):
        us.unit_streamed(x, *w, d, pool=pool, slots=rows.int(), n_new=rows)
    with pytest.raises(ValueError, match="xx has"):
        us.unit_streamed(x, *w, d, xx=x)


def test_the_knob_reaches_the_192_channel_units_only():
    from code2wav.model.choices import LayerChoices

    assert LayerChoices().unit_streamed_rows == 16384  # a tile for about every SM (BENCHMARKS.md, session 35)
    with pytest.raises(ValueError, match="unit_streamed_rows"):
        LayerChoices(unit_streamed_rows=-1)
