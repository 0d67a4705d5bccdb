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
    ``round(clip(x, -1, 1) * 32767)``, halves rounded to even."""
    return np.rint(np.clip(to_f32(wav), -1.0, 1.0) * INT16_SCALE).astype("<i2")
