"""The HTTP endpoint ``POST /v1/decode``: a whole request's codes (JSON or ``.npy``) in, its audio
out as one file or as a streamed body."""

from __future__ import annotations

import functools
import io
import json
import time
import uuid
from collections.abc import Callable

import numpy as np
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from torch import Tensor

from code2wav.codes import CodesError, as_frames, drop_trailing_padding
from code2wav.server.audio import HTTP_FORMATS, concat, encode_file, media_type, raw_bytes, wav_header
from code2wav.server.metrics import _Metrics
from code2wav.server.protocol import Limits, ServiceError, log, service_error
from code2wav.server.service import Service
from code2wav.stream.pool import PoolFull
from code2wav.stream.rows import StreamError


def request_frames(obj: object, what: str, num_quantizers: int, codebook_size: int, allow_empty: bool = False) -> Tensor:
    """As ``as_frames``, after dropping trailing official ``-1`` padding rows."""
    if obj is None:
        raise ServiceError("bad_message", f"{what}: missing")
    try:
        arr = np.asarray(obj)
    except (ValueError, TypeError):
        arr = None
    if arr is not None and arr.ndim == 2 and arr.dtype.kind in "iu" and arr.shape[0]:
        obj = drop_trailing_padding(arr)
    try:
        return as_frames(obj, num_quantizers, codebook_size, what, allow_empty)
    except CodesError as e:
        raise ServiceError(e.code, str(e)) from None


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request's body, refused past ``max_bytes`` (declared or received)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise ServiceError("body_too_big", f"body of {declared} bytes exceeds the limit of {max_bytes}")
    buf = bytearray()
    async for part in request.stream():
        buf += part
        if len(buf) > max_bytes:
            raise ServiceError("body_too_big", f"body exceeds the limit of {max_bytes} bytes")
    return bytes(buf)


def decode_endpoint(service: Service, limits: Limits, metrics: _Metrics, check_auth: Callable[[Request], None]):
    """The ``POST /v1/decode`` handler (its query parameters are the handler's keywords)."""
    Q, SIZE, SPF, SR = service.num_quantizers, service.codebook_size, service.samples_per_frame, service.sample_rate
    frames_of = functools.partial(request_frames, num_quantizers=Q, codebook_size=SIZE)

    async def decode(request: Request, format: str | None = None, stream: bool | None = None, prefix_frames: int = 0):
        check_auth(request)
        metrics.requests.labels("decode").inc()
        body = await read_body(request, limits.max_body_bytes)
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype == "application/json":
            try:
                obj = json.loads(body)
            except (ValueError, UnicodeDecodeError) as e:
                raise ServiceError("bad_json", f"body is not JSON ({e})") from None
            if not isinstance(obj, dict):
                raise ServiceError("bad_message", "body must be a JSON object")
            fmt = obj.get("format", format or "wav")
            streaming = obj.get("stream", bool(stream))
            frames = frames_of(obj.get("codes"), "codes")
            prefix = frames_of(obj["prefix"], "prefix", allow_empty=True) if obj.get("prefix") is not None else None
        elif ctype in ("application/octet-stream", "application/x-npy"):
            try:
                arr = np.load(io.BytesIO(body), allow_pickle=False)
            except Exception as e:
                raise ServiceError("bad_npy", f"body is not a readable .npy array ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
            if not isinstance(arr, np.ndarray):
                raise ServiceError("bad_npy", "body is an .npz archive; send one .npy array")
            fmt, streaming = format or "wav", bool(stream)
            if prefix_frames < 0 or (arr.ndim >= 1 and prefix_frames > arr.shape[0]):
                raise ServiceError("bad_message", f"prefix_frames={prefix_frames} outside [0, {arr.shape[0] if arr.ndim else 0}]")
            prefix = frames_of(arr[:prefix_frames], "prefix", allow_empty=True) if prefix_frames else None
            frames = frames_of(arr[prefix_frames:], "codes")
        else:
            raise ServiceError("unsupported_media_type", f"content-type {ctype or '(none)'}: send application/json or application/octet-stream (.npy)")
        if fmt not in HTTP_FORMATS:
            raise ServiceError("bad_format", f"format {fmt!r}: expected one of {', '.join(HTTP_FORMATS)}")
        if not isinstance(streaming, bool):
            raise ServiceError("bad_message", "stream must be true or false")
        if streaming and fmt == "flac":
            raise ServiceError("bad_format", "flac cannot be streamed; use wav, pcm or f32le")
        n = frames.shape[0]
        if n > limits.max_stream_frames:
            raise ServiceError("too_many_frames", f"{n} frames exceed the limit of {limits.max_stream_frames}")
        rid = f"http-{uuid.uuid4().hex}"
        step = limits.http_chunk_frames
        headers = {"X-Request-Id": rid, "X-Sample-Rate": str(SR), "X-Frames": str(n)}
        await service.open(rid, prefix)

        if not streaming:
            finished = False
            try:
                pieces = [await service.push(rid, frames[s : s + step]) for s in range(0, n, step)]
                await service.finish(rid)
                finished = True
            except (StreamError, CodesError, PoolFull) as e:
                raise service_error(e) from None
            finally:
                if not finished:
                    await service.abort_quietly(rid)
            return Response(encode_file(concat(pieces), fmt, SR), media_type=media_type(fmt, SR), headers=headers)

        async def body_iter():
            finished = False
            t0 = time.perf_counter()
            encode = functools.partial(raw_bytes, fmt="pcm" if fmt == "wav" else fmt)  # runs on the engine's worker
            try:
                if fmt == "wav":
                    yield wav_header(n * SPF, SR)
                for i, s in enumerate(range(0, n, step)):
                    data = await service.push(rid, frames[s : s + step], encode)
                    if i == 0:
                        metrics.ttfp_seconds.observe(time.perf_counter() - t0)
                    yield data
                await service.finish(rid)
                finished = True
            except (StreamError, CodesError) as e:  # headers are gone: the body ends short
                metrics.errors.labels(e.code).inc()
                log.warning("stream %s ended early: %s", rid, e)
            finally:
                if not finished:
                    await service.abort_quietly(rid)

        return StreamingResponse(body_iter(), media_type=media_type(fmt, SR), headers=headers)

    return decode
