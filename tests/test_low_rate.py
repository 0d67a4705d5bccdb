"""``low_rate_dtype="auto"`` (model/low_rate.py): float16 low-rate stages only where the loaded
weights' values, measured at load, leave float16 room; the same weights as the float16 knob."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch

from code2wav.engine.build import EngineConfig
from code2wav.kernels.snake import to_layout
from code2wav.model import low_rate
from code2wav.model.loading import load_decoder, save_checkpoint
from tests.models import SMALL, model, random_codes


def _half_model() -> torch.nn.Module:
    return copy.deepcopy(model(SMALL, torch.bfloat16))  # low-rate stages float32 (to_dtypes' default)


def test_the_probe_reads_values_that_never_leave_a_module():
    """The last ConvNeXt block's hidden layer (4x wide, between its two products, inside one
    module) scaled up while its gamma is zero: the block passes its input through, and the peak
    still sees the hidden layer."""
    m = model(SMALL, torch.bfloat16)  # float32 low-rate stages; attention in bf16 (not read)
    codes = random_codes(16)[None].transpose(1, 2)
    base = low_rate.low_rate_peak(m, codes)
    with torch.no_grad():
        out = m.upsampled(m.front(codes))
    assert base >= float(out.abs().amax()) > 0

    scaled = copy.deepcopy(m)
    block = scaled.upsample[-1][1]
    with torch.no_grad():
        block.pwconv1.weight.mul_(1e5)
        block.pwconv1.bias.mul_(1e5)
        block.gamma.zero_()
        x = to_layout(scaled.front(codes), False)
        for convt, blk in scaled.upsample[:-1]:
            x = blk(convt(x))
        x = scaled.upsample[-1][0](x)
        normed = block.norm(block.dwconv(x).transpose(1, 2))
        hidden = torch.nn.functional.linear(normed, block.pwconv1.weight, block.pwconv1.bias)
        assert torch.equal(block(x), x)  # the block passes its input through
    peak = low_rate.low_rate_peak(scaled, codes)
    # (the probe's convs run as shifted products, the instant forms: rounding apart)
    assert peak >= float(hidden.abs().amax()) * (1 - 1e-5) and peak > torch.finfo(torch.float16).max
    assert low_rate.float16_fits(base) and not low_rate.float16_fits(peak)


def test_float16_room_is_the_headroom_under_its_largest_value():
    limit = torch.finfo(torch.float16).max / low_rate.FLOAT16_HEADROOM
    assert low_rate.float16_fits(limit) and not low_rate.float16_fits(limit * 1.001)
    assert not low_rate.float16_fits(float("inf"))


def test_auto_casts_to_float16_where_it_fits_and_keeps_float32_where_not():
    m = _half_model()
    assert low_rate.auto_low_rate(m, cuda_only=False) == torch.float16
    assert m.low_rate_peak is not None and low_rate.float16_fits(m.low_rate_peak)
    assert m.dtype == torch.bfloat16  # the conv stack is not touched

    big = _half_model()
    with torch.no_grad():
        big.pre_transformer.output_proj.weight.mul_(1e5)  # the transformer's output past float16's range / 32
    assert low_rate.auto_low_rate(big, cuda_only=False) == torch.float32
    assert not low_rate.float16_fits(big.low_rate_peak)


def test_a_probe_that_fails_leaves_float32_and_says_why(monkeypatch):
    def broken(*_a, **_k):
        raise RuntimeError("no room")

    monkeypatch.setattr(low_rate, "low_rate_peak", broken)
    m = _half_model()
    with pytest.warns(RuntimeWarning, match="the probe failed .RuntimeError: no room.; the low-rate stages stay float32"):
        assert low_rate.auto_low_rate(m, cuda_only=False) == torch.float32
    assert m.low_rate_peak is None and m.pre_transformer.input_proj.weight.dtype == torch.float32


def test_auto_gives_the_float16_knobs_weights():
    """Cast after the probe or cast at load: the same parameters and buffers (the codebook table
    folded again from the unrounded codebooks, the fused projections), in the same memory
    layout (channels-last convs, as on CUDA), attention in bf16."""
    auto = _half_model().channels_last()
    low_rate.auto_low_rate(auto, cuda_only=False)
    knob = copy.deepcopy(model(SMALL, torch.bfloat16, low_rate_dtype=torch.float16)).channels_last()
    a, k = dict(auto.named_buffers()) | auto.state_dict(), dict(knob.named_buffers()) | knob.state_dict()
    assert a.keys() == k.keys()
    for name in a:
        assert a[name].dtype == k[name].dtype and torch.equal(a[name], k[name]), name
        assert a[name].stride() == k[name].stride(), name
    assert auto.pre_transformer.layers[0].self_attn.attention_dtype == torch.bfloat16


def test_auto_is_the_default_and_changes_nothing_off_cuda(tmp_path):
    assert EngineConfig().low_rate_dtype == "auto"
    assert inspect.signature(load_decoder).parameters["low_rate_dtype"].default == "auto"
    with pytest.raises(ValueError, match="low_rate_dtype must be one of"):
        EngineConfig(low_rate_dtype="float8")
    ckpt = save_checkpoint(model(SMALL, torch.float32), tmp_path / "ckpt")
    for dtype in (torch.bfloat16, torch.float32):
        m = load_decoder(ckpt, dtype=dtype, low_rate_dtype="auto")
        assert m.low_rate_dtype == torch.float32 and m.low_rate_peak is None  # no probe on a CPU


def test_rope_frequencies_stay_float32_in_every_dtype():
    """A half cast would round RoPE's frequencies to 8 or 11 bits; every model keeps the float32
    ones (the angles are float32 products of positions and these)."""
    ref = model(SMALL, torch.float32).pre_transformer.rotary.inv_freq
    for dtype, low in ((torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float16), (torch.float64, None)):
        freqs = model(SMALL, dtype, low_rate_dtype=low).pre_transformer.rotary.inv_freq
        assert freqs.dtype == torch.float32 and torch.equal(freqs, ref)
    assert ref.to(torch.float16).to(torch.float32).ne(ref).any()  # what the cast would have done


def test_health_says_which_dtypes_run_and_the_probes_peak():
    """``/health``'s ``precision``: what an operator checks after a start with ``auto``."""
    from code2wav.engine.async_engine import AsyncEngine
    from code2wav.server.service import Service
    from code2wav.stream.engine import StreamEngine

    m = _half_model()
    low_rate.auto_low_rate(m, cuda_only=False)
    status, body = Service(AsyncEngine(StreamEngine(m, max_streams=1))).health()
    assert status == 200
    assert body["precision"] == {"dtype": "bfloat16", "low_rate_dtype": "float16", "low_rate_peak": round(m.low_rate_peak, 3)}
