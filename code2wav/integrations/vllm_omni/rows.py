"""One runner step's per-request inputs, read into rows (no engine work here).

The runner hands a Code2Wav stage one flat ``input_ids`` for the whole batch, split by
``seq_token_counts``, and one dict per request (``runtime_additional_information``): the
payload the talker sent (``codes.audio``: flat codebook-major codes, authoritative when present,
else the request's own tokens are the codes) and its ``meta``. What a row's meta means here:

- ``left_context_size``: how many leading frames of this row are context, not new. On a
  request's first row they are its reference prefix (ICL: the talker sends the reference codes
  with the first frames and says so with ``ref_context_size`` / ``ref_context_included``; the
  non-streaming payload prepends them and sets ``left_context_size``). On a later row they are
  frames the stream already holds: its state has them, so they are skipped.
- ``finished`` / ``is_segment_finished``: the stream ends after this row (a new segment of the
  same request opens a new stream).
- the request's key: the scheduler's id (the runner's ``request_ids``, or ``req_id`` in the
  runner's per-request buffer), else the payload's ``request_id``. A row with none (a dummy or
  profile run that names none) is decoded as a whole utterance of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass
class Row:
    index: int  # position in the batch (the output list's)
    key: str | None  # the stream's id; None: a one-off utterance
    frames: Tensor | None  # [n, Q] codes, context frames included; None with ``error``
    context: int  # leading frames of ``frames`` that are context (prefix or already decoded)
    finished: bool  # the stream ends after this row (request or segment finished)
    error: str | None = None


def _first(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return value[0] if value else None
    if isinstance(value, Tensor):
        return value.reshape(-1)[0].item() if value.numel() else None
    return value


def _int(value: Any) -> int:
    v = _first(value)
    return int(v) if v is not None else 0


def _bool(value: Any) -> bool:
    return bool(_first(value))


def _str(value: Any) -> str | None:
    v = _first(value)
    return None if v is None else str(v)


def split(input_ids: Tensor | None, counts: list[int] | None, n_infos: int) -> list[Tensor]:
    """``input_ids`` cut into one piece per request (``counts``; else one piece per payload when
    there are several, as far as the ids go)."""
    ids = input_ids.reshape(-1) if input_ids is not None else torch.zeros(0, dtype=torch.long)
    if counts:
        out, at = [], 0
        for c in counts:
            out.append(ids[at : at + int(c)])
            at += int(c)
        return out
    return [ids] + [ids[:0]] * max(0, n_infos - 1)


def _codes(ids: Tensor, info: dict | None) -> Tensor:
    codes = info.get("codes") if isinstance(info, dict) else None
    audio = codes.get("audio") if isinstance(codes, dict) else None
    if isinstance(audio, Tensor) and audio.numel():
        return audio.reshape(-1)
    if isinstance(audio, (list, tuple)) and audio:
        return torch.as_tensor(audio).reshape(-1)
    return ids.reshape(-1)


def read_rows(input_ids: Tensor | None, infos: list | None, counts: list[int] | None,
              request_ids: list | None, num_quantizers: int) -> list[Row]:
    """The batch's rows, one per request, in order. A row whose codes do not form whole frames
    carries an ``error`` and no frames."""
    infos = list(infos or [])
    pieces = split(input_ids, counts, len(infos))
    rows = []
    for i, ids in enumerate(pieces):
        info = infos[i] if i < len(infos) and isinstance(infos[i], dict) else {}
        meta = info.get("meta") if isinstance(info.get("meta"), dict) else {}
        key = None
        if request_ids is not None and i < len(request_ids) and request_ids[i] is not None:
            key = str(request_ids[i])
        key = key or _str(info.get("req_id")) or _str(meta.get("request_id"))
        context = _int(meta.get("left_context_size"))
        if _bool(meta.get("ref_context_included")):
            context = max(context, _int(meta.get("ref_context_size")))
        finished = _bool(meta.get("finished")) or _bool(meta.get("is_segment_finished")) or key is None
        flat = _codes(ids, info).to("cpu", torch.long)
        row = Row(i, key, None, context, finished)
        if flat.numel() % num_quantizers:
            row.error = f"{flat.numel()} codes do not make whole frames of {num_quantizers}"
        else:
            # codebook-major [Q * n] -> [n, Q], the layout code2wav's engine takes
            row.frames = flat.reshape(num_quantizers, -1).T.contiguous()
            if context > row.frames.shape[0]:
                row.error = f"left context of {context} frames but only {row.frames.shape[0]} frames sent"
                row.frames = None
        rows.append(row)
    return rows
