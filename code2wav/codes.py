"""Validation of codec-frame payloads: the one place that decides what a bad input is.

The checks are numpy alone (``frames_array``), and torch is imported only where a tensor is made
or read, so a process that parses request bodies (``code2wav.server.payloads``) never loads torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor


class CodesError(ValueError):
    """A payload of codec frames is malformed. ``code`` is machine-readable."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code

    def __reduce__(self):  # picklable (its message is its only ``args``)
        return type(self), (self.code, str(self))


def as_frames(
    codes: object, num_quantizers: int, codebook_size: int, what: str = "codes", allow_empty: bool = False
) -> Tensor:
    """Check one stream's frames and return them as a ``[n, num_quantizers]`` int64 CPU tensor.

    Accepts a tensor, numpy array or nested list of integers shaped ``[n, Q]`` (the layout the
    official encoder returns per item). Every code must lie in ``[0, codebook_size)``. The rules
    are ``frames_array``'s.
    """
    import torch

    if type(codes) is torch.Tensor and codes.dtype is torch.int64 and codes.is_cpu:
        # A talker's usual payload, checked with fewer ops (this runs on every chunk's way to a
        # step): anything this does not pass takes the general checks below, which then decide.
        arr = codes.numpy()
        if arr.ndim == 2 and arr.shape[1] == num_quantizers and arr.shape[0] and arr.flags.c_contiguous \
                and int(arr.view(np.uint64).max()) < codebook_size:
            return codes
    if isinstance(codes, torch.Tensor):
        if codes.dtype.is_floating_point or codes.dtype == torch.bool or codes.is_complex():
            raise CodesError("bad_dtype", f"{what}: codes must be integers, got {codes.dtype}")
        codes = (codes if codes.device.type == "cpu" else codes.cpu()).numpy()  # integers: never requires_grad
    return torch.from_numpy(frames_array(codes, num_quantizers, codebook_size, what, allow_empty))


def frames_array(
    codes: object, num_quantizers: int, codebook_size: int, what: str = "codes", allow_empty: bool = False, padded: bool = False
) -> np.ndarray:
    """``as_frames``' checks, in numpy: a numpy array or nested list of integers ``[n, Q]`` as a
    C-contiguous int64 array. ``[]`` is an empty payload (``empty``, or zero frames with
    ``allow_empty``). An integer too large for any numpy integer type is ``out_of_range``, as any
    other code outside ``[0, codebook_size)``.

    ``padded``: the payload may end in official ``-1`` padding (``drop_trailing_padding``); a
    padding row before a real one is ``bad_padding``. Checked in numpy: this runs on every chunk's
    way to the device, where each torch op costs microseconds of dispatch.
    """
    arr, big = _as_array(codes, what)
    if arr.dtype.kind not in "iu" and not big:
        raise CodesError("bad_dtype", f"{what}: codes must be integers, got {arr.dtype}")
    if arr.shape == (0,):  # [] : no frames, whatever their width
        arr = arr.reshape(0, num_quantizers)
    if padded and arr.ndim == 2 and arr.shape[0]:
        arr = drop_trailing_padding(arr)
        if (arr[:, 0] == -1).any():
            raise CodesError("bad_padding", f"{what}: -1 padding must come after every valid frame")
    if arr.ndim != 2 or arr.shape[1] != num_quantizers:
        if not (allow_empty and arr.size == 0):
            raise CodesError("bad_shape", f"{what}: expected shape [frames, {num_quantizers}], got {list(arr.shape)}")
        arr = arr.reshape(0, num_quantizers)
    if arr.shape[0] == 0 and not allow_empty:
        raise CodesError("empty", f"{what}: no frames")
    if big:  # Python ints past int64/uint64: some code is out of range
        values = arr.ravel().tolist()
        lo, hi = min(values), max(values)
        raise CodesError("out_of_range", f"{what}: code {lo if lo < 0 else hi} outside [0, {codebook_size})")
    if arr.size:
        # One reduction for both bounds: as unsigned, a negative int64 is past every valid code.
        as_unsigned = arr.view(np.uint64) if arr.dtype == np.int64 else None
        if as_unsigned is None or int(as_unsigned.max()) >= codebook_size:
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0 or hi >= codebook_size:
                bad = lo if lo < 0 else hi
                raise CodesError("out_of_range", f"{what}: code {bad} outside [0, {codebook_size})")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _as_array(codes: object, what: str) -> tuple[np.ndarray, bool]:
    """``codes`` as an array, and whether it holds Python integers too large for numpy's integer
    types (numpy makes such a list an object array, or float64 when negative codes are mixed in)."""
    if isinstance(codes, np.ndarray):
        return codes, False
    try:
        arr = np.asarray(codes)
    except (ValueError, TypeError) as e:
        raise CodesError("bad_shape", f"{what}: not a rectangular array ({e})") from e
    if arr.dtype.kind in "fO" and arr.size:
        exact = np.asarray(codes, dtype=object)  # the list's own objects
        if all(isinstance(x, int) and not isinstance(x, bool) for x in exact.flat):
            return exact, True
    if arr.dtype == object:
        raise CodesError("bad_shape", f"{what}: not a rectangular array of integers")
    if arr.size == 0 and arr.dtype.kind == "f":
        arr = arr.astype(np.int64)  # [] parses as float64
    return arr, False


def drop_trailing_padding(arr: np.ndarray) -> np.ndarray:
    """The rows of an ``[F, Q]`` array before its trailing run of official ``-1`` padding.

    A row is padding when its codebook-0 code is exactly ``-1`` (the official encoder pads each
    item on the right that way). Only the trailing run is dropped: a ``-1`` row followed by a
    real one stays, for ``as_frames`` to refuse. All padding gives zero rows. A view, not a copy.
    """
    real = np.flatnonzero(arr[:, 0] != -1)
    return arr[: int(real[-1]) + 1 if real.size else 0]


def padded_batch(codes: object, num_quantizers: int, codebook_size: int, lengths: object = None) -> tuple[Tensor, Tensor]:
    """Normalise an offline batch to ``([B, Q, F] int64 with padding clamped to 0, lengths [B])``.

    Input is ``[B, Q, F]`` or one ``[F, Q]`` sequence. Without ``lengths``, the official rule
    applies: an item's length is the number of frames whose codebook-0 code is >= 0, with ``-1``
    as right padding. Frames inside an item's length must be valid codes.
    """
    import torch

    t = codes.detach().cpu() if isinstance(codes, torch.Tensor) else torch.from_numpy(np.asarray(codes))
    if t.dtype.is_floating_point or t.dtype == torch.bool:
        raise CodesError("bad_dtype", f"codes must be integers, got {t.dtype}")
    t = t.to(torch.int64)
    if t.dim() == 2:
        if t.shape[1] != num_quantizers:
            raise CodesError("bad_shape", f"expected one sequence [frames, {num_quantizers}], got {list(t.shape)}")
        t = t.T[None]
    if t.dim() != 3 or t.shape[1] != num_quantizers:
        raise CodesError("bad_shape", f"expected [batch, {num_quantizers}, frames], got {list(t.shape)}")
    B, _, F = t.shape
    if lengths is None:
        lens = (t[:, 0] >= 0).sum(1)
        inside = torch.arange(F)[None] < lens[:, None]
        if not torch.equal(inside, t[:, 0] >= 0):
            raise CodesError("bad_padding", "-1 padding must come after every valid frame")
    else:
        lens = torch.as_tensor(lengths, dtype=torch.int64).reshape(-1)
        if lens.shape[0] != B or bool((lens < 0).any()) or bool((lens > F).any()):
            raise CodesError("bad_lengths", f"lengths must be {B} values in [0, {F}]")
    inside = (torch.arange(F)[None] < lens[:, None])[:, None].expand_as(t)
    valid = t[inside]
    if valid.numel() and (int(valid.min()) < 0 or int(valid.max()) >= codebook_size):
        bad = int(valid.min()) if int(valid.min()) < 0 else int(valid.max())
        raise CodesError("out_of_range", f"code {bad} outside [0, {codebook_size}) inside an item's length")
    return t.clamp(min=0, max=codebook_size - 1) * inside, lens
