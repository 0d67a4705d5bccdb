"""Parity with the official qwen-tts decoder, the reference implementation.

Contract: with the same weights, ``code2wav``'s decoder computes the same function as the
official ``Qwen3TTSTokenizerV2Decoder``:

* float64, whole-utterance forward: max abs error <= 1e-9, once two float32 *downcasts* in the
  official code are lifted (see :func:`lifted_fp32_casts`), for the real (full-size)
  architecture at 1, 2, 73 (the window's first bite) and 150 frames, and for the shrunk one at
  the sliding-window edges (71, 72, 73 frames); with the stock official code the only
  difference left is those casts (<= 1e-4);
* float32, real architecture, official code untouched: max abs error <= 1e-4 * peak |reference|;
* the official batch API ``Qwen3TTSTokenizerV2Model.decode`` (``[B, T, 16]``, ``-1`` right
  padding) and ``code2wav.offline.decode`` (``[B, 16, F]``, same padding) return the same
  per-item lengths and samples for items <= 300 frames, where the official chunking is one
  whole forward and so is our default ``exact`` mode;
* beyond 300 frames, ``mode="official"`` reproduces ``chunked_decode(300, 25)`` while ``exact``
  stays equal to the whole-utterance forward, and the two differ.

Weights are ``random_decoder``'s non-trivial init (output std ~0.3, few clamped samples), copied
into the official module with ``load_state_dict`` (the key sets match exactly). The window
edges, the batch-API and the >300-frame checks use a shrunk config (same rates, window and
depth, tiny widths): what they test is bookkeeping (masks, padding, lengths, windows), which does
not depend on the widths, and the full-size arithmetic is covered at the lengths above. Every model is built and converted once per
module: the full-size float64 forward costs ~0.1-0.2 s per frame on a 2-core CPU.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from code2wav import offline
from code2wav.model.config import DecoderConfig
from tests import models
from tests.official import (
    Qwen3TTSTokenizerV2DecoderRMSNorm,
    copy_weights,
    official_full_model,
    promoted_rmsnorm_forward,
    reference_config,
    set_attn_implementation,
)

LENGTHS = (1, 2, 71, 72, 73, 150)  # 72 = sliding window: one below, at, and one above it
WINDOW_EDGES = (71, 72, 73)
FP64_FULL_LENGTHS = (1, 2, 73, 150)  # the edges run shrunk in float64 (test_fp64_window_edges_...)
SPF = 1920
FP64_TOL = 1e-9
FP64_STOCK_TOL = 1e-4
FP32_REL_TOL = 1e-4


def codes_for(length: int, batch: int = 1, seed: int | None = None) -> torch.Tensor:
    """Random codes ``[batch, 16, length]``, a different fixed sequence per length."""
    g = torch.Generator().manual_seed(1000 + length if seed is None else seed)
    return torch.randint(0, 2048, (batch, 16, length), generator=g)


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    return (a - b).abs().max().item()


@torch.no_grad()
def forward(model, codes: torch.Tensor) -> torch.Tensor:
    return model(codes)


@contextlib.contextmanager
def lifted_fp32_casts(official_decoder: torch.nn.Module):
    """Run the official decoder in float64 without its two float32 downcasts.

    The official code computes RMSNorm after ``.to(torch.float32)`` and its eager attention
    softmax with ``dtype=torch.float32``. In a float32 (or bf16) model those are upcasts; in a
    float64 model they round to float32, so the stock official fp64 output differs from a true
    fp64 computation by ~1e-7..1e-5, which would hide real bugs under a loose bound. code2wav
    computes norms and softmax in ``promote_types(dtype, float32)``, so fp64 stays fp64.

    Inside this block the official RMSNorm forward is the same formula in that promoted dtype
    (``tests.official.promoted_rmsnorm_forward``) and attention runs through the ``sdpa`` kernel,
    which has no softmax cast; a spy on ``scaled_dot_product_attention`` checks on exit that it
    really ran, once per layer per forward, in float64. Nothing else of the official computation
    is touched, and everything is restored on exit (test-scoped).
    """
    n_layers = official_decoder.config.num_hidden_layers
    real_sdpa = torch.nn.functional.scaled_dot_product_attention
    before = official_decoder.config._attn_implementation
    calls: list[torch.dtype] = []

    def spy(*args, **kwargs):
        calls.append(args[0].dtype)
        return real_sdpa(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Qwen3TTSTokenizerV2DecoderRMSNorm, "forward", promoted_rmsnorm_forward)
        mp.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
        set_attn_implementation(official_decoder, "sdpa")
        try:
            yield
        finally:
            set_attn_implementation(official_decoder, before)
    assert calls and len(calls) % n_layers == 0 and set(calls) == {torch.float64}, (
        f"sdpa was not the attention kernel in effect: {len(calls)} calls, dtypes {set(calls)}"
    )


class PerLength(dict):
    """Outputs computed on first use and kept for the module (several tests share them)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def __missing__(self, length):
        value = self[length] = self.fn(length)
        return value


# -- full-size models (built once per module) -------------------------------------------------


@pytest.fixture(scope="module")
def full_cfg() -> DecoderConfig:
    cfg = DecoderConfig.from_dict(reference_config()["decoder_config"])
    assert cfg == models.FULL  # the dataclass defaults are the released checkpoint's values
    return cfg


@pytest.fixture(scope="module")
def ours32(full_cfg):
    return models.model(full_cfg, torch.float32)


@pytest.fixture(scope="module")
def ours64(full_cfg):
    return models.model(full_cfg, torch.float64)


@pytest.fixture(scope="module")
def official32(ours32):
    """The official decoder (float32) with our weights, stock code and settings."""
    model = official_full_model()  # the released config.json, as the official loader reads it
    copy_weights(model.decoder, ours32)
    return model.decoder


@pytest.fixture(scope="module")
def official64(official32):
    return copy.deepcopy(official32).double()


@pytest.fixture(scope="module")
def ours64_out(ours64):
    return PerLength(lambda n: forward(ours64, codes_for(n)))


# -- float64, full size -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("length", FP64_FULL_LENGTHS)
def test_fp64_forward_matches_official(length, ours64_out, official64):
    """Whole-utterance forward, float64, each length: ``[1, 1, length * 1920]``, max abs error
    <= 1e-9 against the official decoder with its float32 casts lifted."""
    ours = ours64_out[length]
    assert ours.shape == (1, 1, length * SPF)
    with lifted_fp32_casts(official64):
        ref = forward(official64, codes_for(length))
    assert ref.abs().max() > 0.1  # a real signal, not silence
    assert max_err(ours, ref) <= FP64_TOL


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_fp64_stock_official_differs_only_by_its_fp32_casts(attention, ours64, official64):
    """The stock official code in float64 (stock RMSNorm; eager attention adds the softmax cast)
    is the same function up to its float32 casts: within 1e-4 of ours, yet measurably above the
    1e-9 that the same input reaches with the casts lifted. So the lift in
    :func:`lifted_fp32_casts` removes a real, small difference and nothing else."""
    codes = codes_for(8, seed=8)
    ours = forward(ours64, codes)
    with lifted_fp32_casts(official64):
        lifted = max_err(ours, forward(official64, codes))
    before = official64.config._attn_implementation
    set_attn_implementation(official64, attention)
    try:
        stock = max_err(ours, forward(official64, codes))
    finally:
        set_attn_implementation(official64, before)
    assert lifted <= FP64_TOL
    assert FP64_TOL < stock <= FP64_STOCK_TOL


# -- float32, full size, official code untouched ----------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("length", LENGTHS)
def test_fp32_forward_matches_official(length, ours32, official32):
    """Whole-utterance forward, float32, stock official code: max abs error <= 1e-4 * peak."""
    codes = codes_for(length)
    ours = forward(ours32, codes)
    ref = forward(official32, codes)
    assert ref.dtype == torch.float32
    peak = ref.abs().max().item()
    assert peak > 0.1
    assert max_err(ours, ref) <= FP32_REL_TOL * peak


# -- batch API and >300 frames: shrunk model, float64 -------------------------------------------


@pytest.fixture(scope="module")
def small_pair():
    """Our shrunk decoder and the whole official tokenizer built from the same decoder config
    (its ``decoder`` float64 with our weights; the unused encoder stays as built)."""
    ours = models.model(models.SMALL, torch.float64)
    official = official_full_model({**reference_config(), "decoder_config": models.SMALL.to_dict()})
    copy_weights(official.decoder, ours)
    official.decoder.double()
    return ours, official


@pytest.mark.parametrize("length", WINDOW_EDGES)
def test_fp64_window_edges_match_official(length, small_pair):
    """One frame below the sliding window, at it and one above, float64, shrunk widths (the
    attention mask's edges do not depend on them): ``[1, 1, length * 1920]``, max abs error
    <= 1e-9 against the official decoder with its float32 casts lifted."""
    ours, official = small_pair
    codes = codes_for(length)
    got = forward(ours, codes)
    with lifted_fp32_casts(official.decoder):
        ref = forward(official.decoder, codes)
    assert got.shape == ref.shape == (1, 1, length * SPF)
    assert ref.abs().max() > 0.1
    assert max_err(got, ref) <= FP64_TOL


def test_batch_decode_matches_official_decode_api(small_pair):
    """``Qwen3TTSTokenizerV2Model.decode`` on a ``-1`` padded ``[B, T, 16]`` batch and
    ``offline.decode`` (default ``exact`` mode) on the same batch in ``[B, 16, F]`` layout give the
    same per-item lengths (``length * 1920``) and samples (float64, <= 1e-9). Items are <= 300
    frames, where the official chunking is one whole forward: one exactly 300 frames, one crossing
    the attention window and our 64-frame pieces, one single frame padded far out; not sorted."""
    ours, official = small_pair
    lengths = [73, 300, 1]
    codes = codes_for(max(lengths), batch=len(lengths), seed=7)
    for b, n in enumerate(lengths):
        codes[b, :, n:] = -1

    with lifted_fp32_casts(official.decoder):
        ref = official.decode(codes.transpose(1, 2)).audio_values
    got = offline.decode(ours, codes)

    assert [r.shape for r in ref] == [(n * SPF,) for n in lengths]
    assert [g.shape for g in got] == [(n * SPF,) for n in lengths]
    for g, r in zip(got, ref):
        assert r.abs().max() > 0.1
        assert max_err(g, r) <= FP64_TOL


def test_official_mode_matches_chunked_decode_beyond_300_frames(small_pair):
    """330 frames: ``mode="official"`` equals the official ``chunked_decode(300, 25)`` and
    ``mode="exact"`` equals the official whole-utterance forward (float64, <= 1e-9). The two modes
    agree on the first window (a causal prefix of the whole forward) and differ after frame 300,
    where the official window restarts with 25 frames of context, fewer than the 72 the attention
    window and the conv stack see in the whole forward."""
    ours, official = small_pair
    F = 330
    codes = codes_for(F, seed=330)

    with lifted_fp32_casts(official.decoder):
        ref_chunked = forward(lambda c: official.decoder.chunked_decode(c, 300, 25), codes)[0, 0]
        ref_whole = forward(official.decoder, codes)[0, 0]
    (official_mode,) = offline.decode(ours, codes, mode="official")
    (exact_mode,) = offline.decode(ours, codes)

    assert official_mode.shape == exact_mode.shape == (F * SPF,)
    assert max_err(official_mode, ref_chunked) <= FP64_TOL
    assert max_err(exact_mode, ref_whole) <= FP64_TOL
    cut = 300 * SPF
    assert max_err(exact_mode[:cut], official_mode[:cut]) <= FP64_TOL
    assert max_err(exact_mode[cut:], official_mode[cut:]) > 1e-2
