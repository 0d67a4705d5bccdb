"""Offline decode: whole code sequences (or a padded batch) -> exact-length waveforms.

``exact`` (default) equals the whole-utterance forward, computed in pieces of ``chunk_frames``
that carry streaming state, so memory stays bounded however long the input is. ``official``
reproduces qwen-tts ``chunked_decode(300, 25)``: independent 300-frame windows with 25 frames of
left context, which differs from the whole-utterance forward beyond 300 frames.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from code2wav.codes import padded_batch
from code2wav.model.decoder import Decoder
from code2wav.stream.pool import StatePool

OfflineMode = Literal["exact", "official"]
OFFICIAL_CHUNK, OFFICIAL_CONTEXT = 300, 25


@torch.no_grad()
def decode(
    model: Decoder,
    codes: object,
    lengths: object = None,
    mode: OfflineMode = "exact",
    chunk_frames: int = 64,
    progress: Callable[[int], None] | None = None,
) -> list[Tensor]:
    """Decode ``codes`` ``[B, 16, F]`` (or one ``[F, 16]`` sequence) to a list of 1-D waveforms of
    exactly ``length * 1920`` samples each (24 kHz, the model's dtype, on the CPU).

    Without ``lengths``, ``-1`` right padding marks the end of an item (official semantics).
    ``progress`` is called with the number of frames (per item) decoded by each piece.
    """
    cfg = model.config
    batch, lens = padded_batch(codes, cfg.num_quantizers, cfg.codebook_size, lengths)
    if mode == "exact":
        wav = _decode_exact(model, batch, lens, chunk_frames, progress)
    elif mode == "official":
        wav = _decode_official(model, batch, progress)
    else:
        raise ValueError(f"mode must be 'exact' or 'official', got {mode!r}")
    spf = cfg.samples_per_frame
    return [wav[b, : int(lens[b]) * spf] for b in range(batch.shape[0])]


def _decode_exact(model: Decoder, batch: Tensor, lens: Tensor, chunk: int, progress) -> Tensor:
    B, _, F = batch.shape
    spf = model.config.samples_per_frame
    out = torch.zeros(B, F * spf, dtype=model.dtype)
    pool = StatePool(model, max_streams=max(B, 1))  # item b lives in slot b
    for s in range(0, F, chunk):
        n_new = (lens - s).clamp(0, chunk)
        rows = (n_new > 0).nonzero().flatten()
        if rows.numel() == 0:
            break
        T = int(n_new.max())
        wav = pool.run(model, batch[rows, :, s : s + T], rows, n_new[rows])
        out[rows, s * spf : (s + T) * spf] = wav.cpu()
        if progress:
            progress(T)
    return out


def _decode_official(model: Decoder, batch: Tensor, progress) -> Tensor:
    p = next(model.parameters())
    spf = model.config.samples_per_frame
    pieces = []
    F = batch.shape[-1]
    for start in range(0, F, OFFICIAL_CHUNK):
        end = min(start + OFFICIAL_CHUNK, F)
        ctx = OFFICIAL_CONTEXT if start - OFFICIAL_CONTEXT > 0 else start
        wav = model(batch[..., start - ctx : end].to(p.device))[:, 0].cpu()
        pieces.append(wav[:, ctx * spf :])
        if progress:
            progress(end - start)
    return torch.cat(pieces, dim=-1) if pieces else torch.zeros(batch.shape[0], 0, dtype=model.dtype)
