"""16-bit quantization: the one rule the CLI's ``.wav``/``.flac`` and the service's ``pcm_s16le``,
``pcm``, ``wav`` and ``flac`` all use, so that the same samples become the same integers wherever
they are written. Needs numpy and torch only (the CLI imports it without the web stack)."""

from __future__ import annotations

import numpy as np
from torch import Tensor

INT16_SCALE = 32767.0  # symmetric: -1.0 -> -32767, 1.0 -> 32767 (never -32768)


def to_int16(wav: Tensor | np.ndarray) -> np.ndarray:
    """Samples (any float dtype, bfloat16 included) -> int16 little-endian,
    ``round(clip(x, -1, 1) * 32767)``, halves rounded to even."""
    x = wav.detach().float().cpu().numpy() if isinstance(wav, Tensor) else np.asarray(wav, dtype=np.float32)
    return np.rint(np.clip(x, -1.0, 1.0) * INT16_SCALE).astype("<i2")
