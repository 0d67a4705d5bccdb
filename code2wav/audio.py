"""16-bit quantization: the one rule the CLI's ``.wav``/``.flac`` and the service's ``pcm_s16le``,
``pcm``, ``wav`` and ``flac`` all use, so that the same samples become the same integers wherever
they are written. Needs numpy and torch only (the CLI imports it without the web stack)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

INT16_SCALE = 32767.0  # symmetric: -1.0 -> -32767, 1.0 -> 32767 (never -32768)


def to_f32(wav: Tensor | np.ndarray) -> np.ndarray:
    """Samples (any float dtype) -> float32 on the host, widened by numpy alone: the service's
    worker converts every chunk between two steps, and a torch CPU op there runs on a team of
    threads whose waits stall it (options.apply_threads). bfloat16 is float32's upper half."""
    if not isinstance(wav, Tensor):
        return np.asarray(wav, dtype=np.float32)
    w = wav.detach().cpu()
    if w.dtype == torch.bfloat16:
        return (w.contiguous().view(torch.uint16).numpy().astype(np.uint32) << 16).view(np.float32)
    if w.dtype == torch.float16:
        return w.contiguous().view(torch.uint16).numpy().view(np.float16).astype(np.float32)
    return w.numpy().astype(np.float32, copy=False)


def to_int16(wav: Tensor | np.ndarray) -> np.ndarray:
    """Samples (any float dtype, bfloat16 included) -> int16 little-endian,
    ``round(clip(x, -1, 1) * 32767)``, halves rounded to even. int16 samples (a stream opened
    with ``pcm16``: :func:`quantize16` ran on the device) are already quantized: as they are."""
    if isinstance(wav, Tensor) and wav.dtype == torch.int16:
        return wav.detach().cpu().numpy().astype("<i2", copy=False)
    return np.rint(np.clip(to_f32(wav), -1.0, 1.0) * INT16_SCALE).astype("<i2")


def quantize16(wav: Tensor) -> Tensor:
    """:func:`to_int16`'s rule in torch ops, on the samples' own device: the engine quantizes a
    ``pcm16`` stream's audio where the step decoded it, so the host only copies int16 down
    instead of widening and rounding every sample between two steps. The same integers: float32
    arithmetic either way, and ``torch.round`` rounds halves to even as ``np.rint`` does."""
    return torch.round(wav.float().clamp(-1.0, 1.0).mul_(INT16_SCALE)).to(torch.int16)
