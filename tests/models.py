"""Models shared by the tests: the real architecture and a shrunk one, random weights."""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

import torch

from code2wav.model.config import DecoderConfig
from code2wav.model.decoder import Decoder
from code2wav.model.init import random_decoder

# Same rates, window and depth as the released model, tiny widths: the streaming mechanics
# (histories, KV window, positions) are identical, the arithmetic is ~1000x cheaper.
SMALL = DecoderConfig(
    latent_dim=32,
    hidden_size=32,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=64,
    decoder_dim=64,
    codebook_dim=32,
)
FULL = DecoderConfig()


@functools.cache
def _weights(cfg: DecoderConfig, seed: int) -> dict[str, torch.Tensor]:
    return random_decoder(cfg, seed=seed).state_dict()


@functools.cache
def model(cfg: DecoderConfig = SMALL, dtype: torch.dtype = torch.float64, seed: int = 0,
          low_rate_dtype: torch.dtype | None = None) -> Decoder:
    """Random-weight decoder in ``dtype`` (cached: treat as read-only); the stages before the
    conv stack in ``low_rate_dtype`` (``Decoder.to_dtypes``' default: float32 under half types)."""
    m = Decoder(cfg)
    m.load_state_dict(_weights(cfg, seed))
    return m.to_dtypes(dtype, low_rate_dtype=low_rate_dtype)


def random_codes(frames: int, cfg: DecoderConfig = SMALL, seed: int = 0) -> torch.Tensor:
    """[frames, Q] codes, the layout a talker sends."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.codebook_size, (frames, cfg.num_quantizers), generator=g)


def stream_alone(engine, rid: str, codes: torch.Tensor, prefix: int, n: int, schedule: list[int]) -> torch.Tensor:
    """One stream through ``engine``: opened with ``codes[:prefix]``, then ``n`` frames pushed in
    ``schedule``'s chunk sizes (the last repeating), then finished; returns the pushed audio."""
    from code2wav.options import chunk_schedule

    spf = engine.cfg.samples_per_frame
    engine.open(rid, codes[:prefix])
    out, at = [], prefix
    for size in chunk_schedule(n, schedule):
        audio = engine.push(rid, codes[at : at + size])
        assert audio.shape == (size * spf,), "each push returns exactly its frames' audio"
        out.append(audio)
        at += size
    assert engine.finish(rid).numel() == 0, "nothing is held back"
    return torch.cat(out)


def ragged_pair(engine, codes: torch.Tensor) -> dict[str, torch.Tensor]:
    """A cold stream ``a`` and one ``b`` with a 30-frame prefix, opened on ``engine`` and stepped
    together with ragged chunks; each one's audio (``a`` from frame 0, ``b`` from frame 30)."""
    engine.open("a")
    engine.open("b", codes[:30])
    got: dict[str, list[torch.Tensor]] = {"a": [], "b": []}
    at = {"a": 0, "b": 30}
    for size_a, size_b in ((1, 25), (25, 3), (7, 25), (30, 1)):
        out = engine.decode({"a": codes[at["a"] : at["a"] + size_a], "b": codes[at["b"] : at["b"] + size_b]})
        for rid, size in (("a", size_a), ("b", size_b)):
            got[rid].append(out[rid])
            at[rid] += size
    return {rid: torch.cat(parts) for rid, parts in got.items()}


@torch.no_grad()
def forward_audio(m: Decoder, codes: torch.Tensor) -> torch.Tensor:
    """Whole-utterance forward of [frames, Q] codes -> 1-D audio."""
    return m(codes.T[None])[0, 0]


@contextlib.contextmanager
def one_thread():
    """The shrunk model's ops are tiny: extra intra-op threads only add barrier waits (and under
    CPU contention they make a step 20x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def write_checkpoint(path: Path, cfg: DecoderConfig = SMALL, seed: int = 0) -> Path:
    """A random checkpoint in the official on-disk layout, as the loader reads it."""
    from code2wav.model.loading import save_checkpoint

    return save_checkpoint(random_decoder(cfg, seed=seed), path)
