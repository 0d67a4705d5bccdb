"""What the HTTP and WebSocket clients share: the server's error, the default address, the
sample types of the raw audio formats, and the encodings of codes and headers."""

from __future__ import annotations

import numpy as np

DEFAULT_URL = "http://127.0.0.1:8091"
SAMPLE_DTYPES = {"pcm_s16le": np.dtype("<i2"), "f32le": np.dtype("<f4")}


class ServerError(Exception):
    """An error the server reported: its ``code``, and the HTTP ``status`` or WebSocket ``close_code``;
    ``retry_after``: the seconds of an HTTP ``Retry-After`` that came with it (``pool_full``)."""

    def __init__(self, code: str, message: str, status: int | None = None, close_code: int | None = None, retry_after: float | None = None):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.status, self.close_code = code, message, status, close_code
        self.retry_after = retry_after


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def frames_bytes(frames) -> bytes:
    """``[n, 16]`` codes -> the binary push message (int16 little-endian, row-major)."""
    arr = np.asarray(frames)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"codes must be integers, got {arr.dtype}")
    return np.ascontiguousarray(arr.astype("<i2")).tobytes()


def _codes_list(codes) -> list:
    return np.asarray(codes).tolist()
