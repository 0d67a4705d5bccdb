"""The host-side sample conversions (code2wav/audio.py) and the thread count a GPU serve runs.

Every 16-bit float value converts to the float32 it denotes and to the int16 the one rule gives
(``round(clip(x, -1, 1) * 32767)``, halves to even), computed without torch's CPU ops; the
device-side form of the rule (``quantize16``, what the engine runs for a ``pcm16`` stream)
gives the same integers; and a process that decodes on CUDA runs torch's CPU work on one thread
unless told otherwise.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from code2wav import audio
from code2wav.options import apply_threads


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the NaN patterns: their int16 is unspecified
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_16_bit_value_converts_as_the_rule_says(dtype):
    every = torch.arange(2**16, dtype=torch.int32).to(torch.uint16).view(dtype)
    wide = every.float().numpy()  # torch's own widening: the reference
    np.testing.assert_array_equal(audio.to_f32(every), wide)  # NaNs equal NaNs here
    finite = np.isfinite(wide)
    want = np.rint(np.clip(wide[finite], -1.0, 1.0) * 32767.0).astype("<i2")
    got = audio.to_int16(every)
    assert got.dtype == np.dtype("<i2")
    np.testing.assert_array_equal(got[finite], want)
    assert got[wide == np.inf].tolist() == [32767] and got[wide == -np.inf].tolist() == [-32767]


def test_views_and_wide_dtypes_convert_too():
    x = torch.linspace(-1.5, 1.5, 3001, dtype=torch.float64)
    want = np.rint(np.clip(x.numpy().astype(np.float32), -1, 1) * 32767).astype("<i2")
    np.testing.assert_array_equal(audio.to_int16(x), want)
    np.testing.assert_array_equal(audio.to_int16(x.float()), want)
    b = x.bfloat16()
    np.testing.assert_array_equal(audio.to_int16(b[::7]), audio.to_int16(b.float())[::7])  # a strided view
    np.testing.assert_array_equal(audio.to_int16(x.numpy()), want)  # numpy in


def _halves() -> np.ndarray:
    """float32 samples whose product with 32767 is exactly an odd half: where rounding to even
    and rounding half away from zero part ways."""
    k = np.arange(-32767, 32767, dtype=np.float64)
    x = ((k + 0.5) / 32767).astype(np.float32)
    return x[x * np.float32(32767) == (k + 0.5).astype(np.float32)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_the_device_side_rule_gives_the_same_integers(dtype):
    g = torch.Generator().manual_seed(0)
    halves = torch.from_numpy(_halves())
    assert halves.numel() > 1000
    x = torch.cat([torch.randn(20_000, generator=g) * 0.7, halves, torch.tensor([-1.5, -1.0, 1.0, 1.5, 0.0, -0.0, 1e-9])])
    x = x.to(dtype)
    got = audio.quantize16(x)
    assert got.dtype == torch.int16 and got.shape == x.shape
    np.testing.assert_array_equal(got.numpy(), audio.to_int16(x))
    if dtype == torch.float32:  # the halves survived the cast: both forms rounded them to even
        assert (got[20_000 : 20_000 + halves.numel()] % 2 == 0).all()
    np.testing.assert_array_equal(audio.to_int16(got), audio.to_int16(x))  # int16 in: as it is
    view = x[:20_000].reshape(4, -1)[:, ::3]  # a strided view, as a step's sliced output is
    np.testing.assert_array_equal(audio.quantize16(view).numpy(), audio.to_int16(view))


def test_quantizing_on_the_device_leaves_its_input_alone():
    wav = torch.tensor([2.0, -3.0, 0.25])
    audio.quantize16(wav)
    assert wav.tolist() == [2.0, -3.0, 0.25]  # a graph's output buffer is read, never clamped in place


@pytest.mark.parametrize("device,threads,want", [("cuda", None, 1), ("cuda:1", None, 1), ("cuda", 3, 3), ("cpu", 2, 2)])
def test_torch_threads_default_to_one_on_a_gpu(monkeypatch, device, threads, want):
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    apply_threads(argparse.Namespace(device=device, threads=threads))
    assert calls == [want]


def test_on_a_cpu_device_torch_keeps_its_threads(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    apply_threads(argparse.Namespace(device="cpu", threads=None))
    assert calls == []
