"""The words every part of the engine shares: a stream, a row, and a request's error.

A *stream* is one request's audio, keyed by its request id, holding a state-pool slot from
``open`` to ``finish``/``abort``. A *row* is one chunk of one stream inside the engine: queued,
then decoded in *pieces* of at most the step's frames, its audio collected until the last piece
lands. No torch here: the scheduler works on rows alone and is tested without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from torch import Tensor

Result = Union["Tensor", Exception]  # a row's audio, or the error that rejected it alone
OnReady = Callable[[str, Result], None]  # (request id, its audio or error)


class StreamError(ValueError):
    """A request-level error; ``code`` is machine-readable, the message names the stream."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class Stream:
    request_id: str
    slot: int
    last_active: float = field(default_factory=time.monotonic)
    history: list[Any] = field(default_factory=list)  # codes so far (the baselines re-decode them)
    prefix: Any = None  # reference frames not prefilled yet (the stream's first step does it)
    cached: Any = None  # the prefix's cached state, found when the stream opened (restored before its first step)
    started: bool = False  # a chunk of it has joined a step
    pcm16: bool = False  # its audio comes as int16 samples, quantized where the step ran (code2wav.audio.quantize16)


@dataclass
class Row:
    """One chunk of one stream inside the engine: its frames ([n, Q], anything with ``shape``),
    how many of them are launched, and the audio pieces that came back."""

    stream: Stream
    frames: Any
    first: bool = False  # the stream's first chunk: nothing of it is playing yet
    gathers: bool = False  # a first chunk that may wait for others (SchedulePolicy.first_chunk_wait)
    admitted: float = field(default_factory=time.monotonic)  # joined the queue (first chunks gather by it)
    done: int = 0
    pieces: list[Any] = field(default_factory=list)  # each launch's audio, its valid samples alone
    finite: bool = True  # every piece's audio so far (checked where float16 can overflow)

    @property
    def request_id(self) -> str:
        return self.stream.request_id

    @property
    def slot(self) -> int:
        return self.stream.slot

    def next_piece(self, piece: int) -> int:
        """Frames of this row's next launch: what is left, at most ``piece``."""
        return min(self.frames.shape[0] - self.done, piece)
