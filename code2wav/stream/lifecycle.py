"""Streams keyed by request id: open, push, finish, abort, idle reaping. Shared by every engine.

Contract (delta input): ``open(id, prefix)`` once, with an optional voice-clone reference prefix
``[P, 16]``; each ``push`` carries only newly generated frames ``[n, 16]`` and returns exactly
their ``n * 1920`` samples; ``finish`` decodes what it is given and frees the stream; ``abort``
frees it at once. An engine subclass adds ``decode`` (its steps) and where a stream's slot and
prefix go (``_take_slot``, ``_give_slot``, ``_keep_prefix``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from code2wav.codes import as_frames
from code2wav.model.decoder import Decoder
from code2wav.stream.pool import PoolFull
from code2wav.stream.rows import OnReady, Result, Stream, StreamError

ENDED_IDS_KEPT = 4096  # recently ended ids remembered, so a late push gets "stream_ended", not "unknown"
StepHook = Callable[[float, int, int], None]  # (seconds of one step, rows, padded frames a row)


class Lifecycle:
    def __init__(self, model: Decoder, max_streams: int, idle_timeout: float | None, max_prefix_frames: int):
        self.model = model
        self.cfg = model.config
        self.max_streams = max_streams
        self.idle_timeout = idle_timeout
        self.max_prefix_frames = max_prefix_frames
        p = next(model.parameters())
        self.device, self.dtype = p.device, model.dtype  # the audio's dtype (the conv stack's)
        self.on_step: list[StepHook] = []
        self._streams: dict[str, Stream] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()  # recently ended id -> "finished"/"aborted"/...
        # open/finish/abort may come from another thread than the one running steps (the async
        # engine opens on its event loop while a continuous decode runs on its worker).
        self._lock = threading.RLock()

    # -- what an engine provides -------------------------------------------------------------------

    def decode(self, chunks: Mapping[str, object], on_ready: OnReady | None = None,
               more: Callable[[], Mapping[str, object]] | None = None) -> dict[str, Result]:
        raise NotImplementedError

    def _take_slot(self) -> int:
        raise NotImplementedError

    def _give_slot(self, slot: int) -> None:
        raise NotImplementedError

    def _keep_prefix(self, st: Stream, prefix: Tensor) -> None:
        raise NotImplementedError

    def zero_released(self) -> None:
        """Zero the state of slots given back since the last step (where there is state)."""

    def restore_opened(self) -> None:
        """Start streams opened since the last call from cached prefix state, ahead of their
        first chunk (where the engine keeps such a cache)."""

    @property
    def slots_in_use(self) -> int:
        return len(self._streams)

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def active(self) -> int:
        return len(self._streams)

    def is_open(self, request_id: str) -> bool:
        """Whether the stream is open (not finished, aborted or reaped for idling)."""
        return request_id in self._streams

    def require(self, request_id: str) -> None:
        """Raise the precise ``StreamError`` unless the stream is open (unknown, or how it ended)."""
        self._get(request_id)

    def open(self, request_id: str, prefix: object = None, pcm16: bool = False) -> None:
        """Start a stream; ``prefix`` is ``[P, 16]`` reference codes (P may be 0) or None.
        ``pcm16``: its audio comes as int16 samples (``code2wav.audio.to_int16``'s rule), where
        the engine can quantize them on the device; an engine that cannot returns float samples
        (``to_int16`` takes either)."""
        with self._lock:
            self.reap_idle()
            if not isinstance(request_id, str) or not request_id:
                raise StreamError("bad_request_id", f"request id must be a non-empty string, got {request_id!r}")
            if request_id in self._streams:
                raise StreamError("duplicate_request_id", f"stream {request_id!r} is already open")
            pre = self._frames(prefix, f"stream {request_id!r} prefix", allow_empty=True) if prefix is not None else None
            if pre is not None and pre.shape[0] > self.max_prefix_frames:
                raise StreamError("prefix_too_long", f"stream {request_id!r} prefix has {pre.shape[0]} frames, limit {self.max_prefix_frames}")
            try:
                slot = self._take_slot()
            except PoolFull as e:
                raise PoolFull(f"cannot open stream {request_id!r}: {e}") from None
            st = Stream(request_id, slot, pcm16=pcm16)
            self._streams[request_id] = st
            self._ended.pop(request_id, None)
            if pre is not None and pre.shape[0]:
                self._keep_prefix(st, pre)

    def push(self, request_id: str, frames: object) -> Tensor:
        """Decode one stream's new frames; returns their audio (``n * 1920`` samples)."""
        out = self.decode({request_id: frames})[request_id]
        if isinstance(out, Exception):
            raise out
        return out

    def finish(self, request_id: str, frames: object = None) -> Tensor:
        """Decode the last frames (if any) and free the stream. Nothing is held back: the decoder
        has no lookahead, so every pushed frame was already returned in full."""
        self._get(request_id)
        audio = torch.zeros(0, dtype=self.dtype)
        has_frames = frames is not None and not (hasattr(frames, "__len__") and len(frames) == 0)  # type: ignore[arg-type]
        try:
            if has_frames:
                audio = self.push(request_id, frames)
        finally:
            with self._lock:
                if request_id in self._streams:
                    self._release(self._streams[request_id], "finished")
        return audio

    def abort(self, request_id: str) -> None:
        """Free the stream's state at once (client gone, request cancelled). Safe while a step
        runs on another thread: a row of the stream not yet launched is dropped, and the slot
        is zeroed before anyone else's first pass over it."""
        with self._lock:
            self._release(self._get(request_id), "aborted")

    def reap_idle(self, now: float | None = None) -> list[str]:
        """Abort streams idle longer than ``idle_timeout``; returns their ids."""
        if self.idle_timeout is None:
            return []
        now = time.monotonic() if now is None else now
        with self._lock:
            stale = [rid for rid, s in self._streams.items() if now - s.last_active > self.idle_timeout]
            for rid in stale:
                self._release(self._streams[rid], "timed out")
        return stale

    def state_bytes(self) -> dict[str, int]:
        return {"per_stream": 0, "pool": 0}

    def runner_stats(self) -> dict[str, object] | None:
        """What its runner counted (graph replays, fallbacks, padded work); None: nothing."""
        return None

    def prefix_cache_stats(self) -> dict[str, int] | None:
        """The prefix cache's hits, misses, evictions, entries and bytes, and how many cached states
        went into their slots as a step's restore pairs (``restored_in_step``) or by a launch of
        their own (``restored_alone``); None: no cache."""
        return None

    # -- helpers -----------------------------------------------------------------------------------

    def _frames(self, payload: object, what: str, allow_empty: bool = False) -> Tensor:
        return as_frames(payload, self.cfg.num_quantizers, self.cfg.codebook_size, what, allow_empty)

    def _live(self, st: Stream) -> bool:
        """Whether ``st`` is still the open stream of its id (not ended, not replaced)."""
        return self._streams.get(st.request_id) is st

    def _get(self, request_id: str) -> Stream:
        st = self._streams.get(request_id)
        if st is None:
            how = self._ended.get(request_id)
            if how is not None:
                raise StreamError("stream_ended", f"stream {request_id!r} already {how}")
            raise StreamError("unknown_request_id", f"no open stream {request_id!r}")
        return st

    def _release(self, st: Stream, how: str) -> None:
        with self._lock:
            del self._streams[st.request_id]
            self._give_slot(st.slot)
            self._ended[st.request_id] = how
            while len(self._ended) > ENDED_IDS_KEPT:
                self._ended.popitem(last=False)
