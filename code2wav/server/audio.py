"""Audio encodings the service returns. Quantization to 16 bits is ``code2wav.audio.to_int16``,
the CLI's too, so raw ``pcm_s16le`` and the samples inside ``wav``/``flac`` (the service's and
the CLI's files alike) are the same integers."""

from __future__ import annotations

import io
import struct

import torch
from torch import Tensor

from code2wav.audio import to_f32, to_int16

__all__ = ["INT16_FORMATS", "to_int16", "to_f32", "raw_bytes", "wav_header", "encode_file", "media_type", "concat"]

RAW_FORMATS = ("pcm_s16le", "f32le")
FILE_FORMATS = ("wav", "flac", "pcm")  # "pcm" is raw pcm_s16le
HTTP_FORMATS = FILE_FORMATS + ("f32le",)
INT16_FORMATS = ("pcm_s16le", "pcm", "wav", "flac")  # 16-bit samples: their streams open with pcm16
MEDIA_TYPES = {"wav": "audio/wav", "flac": "audio/flac", "pcm": "audio/L16", "pcm_s16le": "audio/L16", "f32le": "application/octet-stream"}


def media_type(fmt: str, sample_rate: int) -> str:
    """The Content-Type of ``fmt``. A raw 16-bit body cannot say its rate and channels itself,
    so ``audio/L16`` carries them as parameters (RFC 2586): ``audio/L16;rate=24000;channels=1``.
    The samples are little-endian, as ``pcm_s16le`` says."""
    base = MEDIA_TYPES[fmt]
    return f"{base};rate={sample_rate};channels=1" if base == "audio/L16" else base


def raw_bytes(wav: Tensor, fmt: str) -> bytes:
    """``pcm_s16le``/``pcm``: int16 little-endian; ``f32le``: float32 little-endian."""
    if fmt in ("pcm_s16le", "pcm"):
        return to_int16(wav).tobytes()
    if fmt == "f32le":
        return to_f32(wav).tobytes()
    raise ValueError(f"not a raw format: {fmt}")


def wav_header(num_samples: int, sample_rate: int) -> bytes:
    """A 44-byte RIFF header for mono 16-bit PCM of a known length (lets a WAV stream)."""
    data = num_samples * 2
    return b"RIFF" + struct.pack("<I", 36 + data) + b"WAVE" + b"fmt " + struct.pack(
        "<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16
    ) + b"data" + struct.pack("<I", data)


def encode_file(wav: Tensor, fmt: str, sample_rate: int) -> bytes:
    if fmt == "wav":
        return wav_header(wav.numel(), sample_rate) + to_int16(wav).tobytes()
    if fmt == "flac":
        import soundfile as sf

        buf = io.BytesIO()
        sf.write(buf, to_int16(wav), sample_rate, subtype="PCM_16", format="FLAC")
        return buf.getvalue()
    return raw_bytes(wav, fmt)


def concat(pieces: list[Tensor]) -> Tensor:
    return torch.cat(pieces) if pieces else torch.zeros(0)
