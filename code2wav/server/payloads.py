"""Request payloads: JSON parsed with its nesting bounded (both endpoints), and ``POST /v1/decode``'s
body and query as pydantic models (so ``/openapi.json`` describes them), parsed where a large body
cannot stall the event loop.

``json.loads`` and building an array from its lists hold the GIL for the whole body, so a thread
does not free the event loop: a body over ``INLINE_BODY_BYTES`` is parsed in a worker process
(``BodyParser``), which returns the checked frames as arrays. This module imports neither torch nor
the rest of the server, so such a process loads numpy, pydantic and this module alone.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, WithJsonSchema

from code2wav.codes import CodesError, frames_array

HTTP_FORMATS = ("wav", "flac", "pcm", "f32le")  # audio.HTTP_FORMATS (a test checks they agree)
HttpFormat = Literal[HTTP_FORMATS]  # type: ignore[valid-type]
NPY_TYPES = ("application/octet-stream", "application/x-npy")
# Bodies up to this size are parsed on the event loop (a millisecond or two): the trip to a
# worker process and back costs about as much. Larger ones go to a worker.
INLINE_BODY_BYTES = 64 << 10
# Worker processes parsing large bodies at once; more bodies wait for one (each request holds
# one of ``Limits.max_http_requests`` meanwhile).
PARSE_WORKERS = 2
PARENT_POLL_S = 0.5  # how often a worker checks that the server is still there

_FRAMES = {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0}}}


class PayloadError(ValueError):
    """A payload the protocol refuses: ``code`` is one of its machine codes. Picklable."""

    def __init__(self, code: str, message: str):
        super().__init__(code, message)
        self.code, self.message = code, message

    def __str__(self) -> str:
        return self.message


def parse_json(data: str | bytes, what: str) -> object:
    """``json.loads``, every failure a ``bad_json`` (nesting past the parser's recursion limit too)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise PayloadError("bad_json", f"{what} is nested too deeply to parse") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise PayloadError("bad_json", f"{what} is not JSON ({e})") from None


class DecodeBody(BaseModel):
    """The JSON body of ``POST /v1/decode``. The codes are checked by ``code2wav.codes`` (the one
    place that decides what bad frames are), not element by element here."""

    model_config = ConfigDict(extra="ignore")

    codes: Annotated[Any, WithJsonSchema({**_FRAMES, "description": "[frames, 16] codes; trailing rows whose first code is -1 are padding"})]
    prefix: Annotated[Any, WithJsonSchema({**_FRAMES, "description": "reference (voice-clone) codes, [P, 16]; their audio is not returned"})] = None
    format: HttpFormat | None = Field(None, description="audio format (default: the query's, else wav)")
    stream: StrictBool | None = Field(None, description="send the audio as it decodes (default: the query's, else false)")


class DecodeQuery(BaseModel):
    """The query of ``POST /v1/decode`` (an ``.npy`` body's only options; a JSON body's defaults)."""

    format: HttpFormat | None = Field(None, description="audio format: wav (default), flac, pcm (int16 LE) or f32le")
    stream: bool | None = Field(None, description="send the audio as it decodes (not with flac)")
    prefix_frames: int = Field(0, ge=0, description=".npy body: its first P rows are the reference prefix")


class ErrorBody(BaseModel):
    """Every error's body (``docs/protocol.md``)."""

    type: Literal["error"] = "error"
    code: str
    message: str


@dataclass
class DecodeRequest:
    codes: np.ndarray  # [n, Q] int64, checked
    prefix: np.ndarray | None  # [P, Q] int64, checked
    format: str
    stream: bool


def parse_request(body: bytes, is_json: bool, query: DecodeQuery, num_quantizers: int, codebook_size: int, max_frames: int) -> DecodeRequest:
    """A ``POST /v1/decode`` body (JSON, else ``.npy``) checked in full; raises ``PayloadError``."""
    frames = functools.partial(frames_array, num_quantizers=num_quantizers, codebook_size=codebook_size, padded=True)
    try:
        if is_json:
            obj = parse_json(body, "body")
            if not isinstance(obj, dict):
                raise PayloadError("bad_message", "body must be a JSON object")
            try:
                m = DecodeBody.model_validate(obj)
            except ValidationError as e:
                raise _body_error(e) from None
            if m.codes is None:
                raise PayloadError("bad_message", "codes: missing")
            fmt = m.format or query.format or "wav"
            streaming = m.stream if m.stream is not None else bool(query.stream)
            codes = frames(m.codes, what="codes")
            prefix = None if m.prefix is None else frames(m.prefix, what="prefix", allow_empty=True)
        else:
            arr = _load_npy(body)
            p = query.prefix_frames
            rows = arr.shape[0] if arr.ndim else 0
            if p > rows:
                raise PayloadError("bad_query", f"prefix_frames={p} outside [0, {rows}] (the array's rows)")
            fmt, streaming = query.format or "wav", bool(query.stream)
            prefix = frames(arr[:p], what="prefix", allow_empty=True) if p else None
            codes = frames(arr[p:] if p else arr, what="codes")
    except CodesError as e:
        raise PayloadError(e.code, str(e)) from None
    if streaming and fmt == "flac":
        raise PayloadError("bad_format", "flac cannot be streamed; use wav, pcm or f32le")
    if codes.shape[0] > max_frames:
        raise PayloadError("too_many_frames", f"{codes.shape[0]} frames exceed the limit of {max_frames}")
    return DecodeRequest(codes, prefix, fmt, streaming)


def _load_npy(body: bytes) -> np.ndarray:
    try:
        arr = np.load(io.BytesIO(body), allow_pickle=False)
    except Exception as e:  # numpy raises ValueError, OSError, EOFError, ... for a bad file
        raise PayloadError("bad_npy", f"body is not a readable .npy array ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if not isinstance(arr, np.ndarray):
        raise PayloadError("bad_npy", "body is an .npz archive; send one .npy array")
    return arr


def _body_error(e: ValidationError) -> PayloadError:
    """The protocol's error for a JSON body the model refuses (its first error: fields in order)."""
    err = e.errors(include_url=False)[0]
    field = err["loc"][0] if err["loc"] else "body"
    if field == "codes" and err["type"] == "missing":
        return PayloadError("bad_message", "codes: missing")
    if field == "format":
        return PayloadError("bad_format", f"format {err.get('input')!r}: expected one of {', '.join(HTTP_FORMATS)}")
    if field == "stream":
        return PayloadError("bad_message", "stream must be true or false")
    return PayloadError("bad_message", f"{'.'.join(map(str, err['loc']))}: {err['msg']}")


def _worker_init(server_pid: int) -> None:
    """In a worker: Ctrl-C reaches the whole process group, and the server ends its workers itself.
    A worker also exits once the server has gone, however it went: uvicorn ends a server on SIGTERM
    by raising the signal again, so no exit handler of the server's shuts its pool down."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(server_pid,), name="code2wav-parent-watch", daemon=True).start()


def _exit_with(server_pid: int) -> None:
    while os.getppid() == server_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(0)


class BodyParser:
    """``parse_request`` for the event loop: small bodies at once, large ones in worker processes
    (started on the first large body, ``spawn``ed: the server's threads make ``fork`` unsafe)."""

    def __init__(self, workers: int = PARSE_WORKERS):
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    async def parse(self, body: bytes, is_json: bool, query: DecodeQuery, num_quantizers: int, codebook_size: int, max_frames: int) -> DecodeRequest:
        call = functools.partial(parse_request, body, is_json, query, num_quantizers, codebook_size, max_frames)
        if len(body) <= INLINE_BODY_BYTES:
            return call()
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init,
                                             initargs=(os.getpid(),))
        pool = self._pool
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, call)
        except BrokenProcessPool:  # a worker died (e.g. killed for memory): the next body gets a new pool
            if self._pool is pool:
                self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
            raise PayloadError("internal", "the body parser process died; retry") from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
