"""The HTTP endpoint ``POST /v1/decode``: a whole request's codes (JSON or ``.npy``) in, its audio
out as one file or as a streamed body.

At most ``Limits.max_http_requests`` requests are in progress at once (more are refused with
``busy`` before their body is read). A body is parsed off the event loop (``payloads.BodyParser``).
A request whose client goes away is aborted: its stream's slot is freed and the frames it has not
decoded yet are never decoded.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.requests import ClientDisconnect

from code2wav.codes import CodesError
from code2wav.server.audio import INT16_FORMATS, MEDIA_TYPES, concat, encode_file, media_type, raw_bytes, wav_header
from code2wav.server.metrics import _Metrics
from code2wav.server.payloads import NPY_TYPES, BodyParser, DecodeBody, DecodeQuery, DecodeRequest, ErrorBody, PayloadError
from code2wav.server.protocol import Limits, ServiceError, log, service_error
from code2wav.server.service import Service
from code2wav.stream.pool import PoolFull
from code2wav.stream.rows import StreamError

T = TypeVar("T")
CLIENT_GONE_STATUS = 499  # never reaches the client; the access log's mark of a request it abandoned

# /openapi.json: the body is read by the handler (parsed off the event loop), so it is described
# here; errors are the protocol's body, with 4XX standing for FastAPI's 422 (never answered).
DECODE_ROUTE: dict[str, Any] = {
    "summary": "Decode codes to audio",
    "response_class": Response,
    "responses": {
        200: {"description": "the audio (wav, flac, pcm or f32le), whole or streamed", "content": {m: {} for m in sorted(set(MEDIA_TYPES.values()))}},
        "4XX": {"model": ErrorBody, "description": "a refused request (docs/protocol.md lists the codes)"},
        "5XX": {"model": ErrorBody, "description": "busy, pool_full, queue_full, shutdown (with Retry-After) or a server fault"},
    },
    "openapi_extra": {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": DecodeBody.model_json_schema()},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary", "description": "one integer .npy array [F, 16]"}},
            },
        }
    },
}


class _ClientGone(Exception):
    """The client closed its connection before its response."""


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


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (its body already read, nothing else arrives but that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_gone(gone: asyncio.Future, work: Coroutine[Any, Any, T]) -> T:
    """``await work``, unless the client goes first: then ``work`` is cancelled, and waited for."""
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    if task in done:
        try:
            return task.result()
        finally:  # a raised error's traceback holds this frame: without the task, that is no cycle
            del task, done
    task.cancel()
    await asyncio.wait((task,))
    raise _ClientGone()


class _Streamed(StreamingResponse):
    """A streamed body whose ``on_close`` runs however the response ends: sent in full, cut by the
    client, or cancelled before its first piece."""

    def __init__(self, content: Any, on_close: Callable[[], Awaitable[None]], **kwargs: Any):
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()


def decode_endpoint(service: Service, limits: Limits, metrics: _Metrics, check_auth: Callable[[Request], None]):
    """The ``POST /v1/decode`` handler. Auth is its dependency, so it runs before FastAPI checks the
    query (a request without the token is 401 whatever its query)."""
    Q, SIZE, SPF, SR = service.num_quantizers, service.codebook_size, service.samples_per_frame, service.sample_rate
    parser = BodyParser()
    in_progress = 0

    async def auth(request: Request) -> None:
        check_auth(request)

    def leave() -> None:
        nonlocal in_progress
        in_progress -= 1
        metrics.http_in_progress.dec()

    async def decode(request: Request, query: Annotated[DecodeQuery, Query()], _: None = Depends(auth)) -> Response:
        nonlocal in_progress
        metrics.requests.labels("decode").inc()
        if in_progress >= limits.max_http_requests:
            raise ServiceError("busy", f"{in_progress} requests in progress (--max-http-requests {limits.max_http_requests}); retry later")
        in_progress += 1
        metrics.http_in_progress.inc()
        handed_over = False  # a streamed response's on_close leaves
        try:
            response = await _decode(request, query)
            handed_over = isinstance(response, _Streamed)
            return response
        except (_ClientGone, ClientDisconnect):
            log.info("POST /v1/decode: the client went away; its request was aborted")
            return Response(status_code=CLIENT_GONE_STATUS)
        finally:
            if not handed_over:
                leave()

    async def _decode(request: Request, query: DecodeQuery) -> Response:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json" and ctype not in NPY_TYPES:
            raise ServiceError("unsupported_media_type", f"content-type {ctype or '(none)'}: send application/json or application/octet-stream (.npy)")
        body = await read_body(request, limits.max_body_bytes)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            try:
                req = await _unless_gone(gone, parser.parse(body, ctype == "application/json", query, Q, SIZE, limits.max_stream_frames))
            except PayloadError as e:
                raise ServiceError(e.code, e.message) from None
            del body
            return await _respond(req, gone)
        finally:
            gone.cancel()

    async def _respond(req: DecodeRequest, gone: asyncio.Future) -> Response:
        frames, fmt, n, step = req.codes, req.format, req.codes.shape[0], limits.http_chunk_frames
        rid = f"http-{uuid.uuid4().hex}"
        headers = {"X-Request-Id": rid, "X-Sample-Rate": str(SR), "X-Frames": str(n)}
        finished = False

        async def decode_all() -> list:
            nonlocal finished
            try:
                out = [await service.push(rid, frames[s : s + step]) for s in range(0, n, step)]
                await service.finish(rid)
                finished = True
                return out
            except (StreamError, CodesError, PoolFull) as e:
                raise service_error(e) from None

        async def pieces():
            nonlocal finished
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

        async def on_close() -> None:  # the streamed response's end, however it ends
            leave()
            if not finished:
                await service.abort_quietly(rid)

        await service.open(rid, req.prefix, pcm16=fmt in INT16_FORMATS)
        if req.stream:
            gone.cancel()  # the streamed response watches for the client itself
            return _Streamed(pieces(), on_close, media_type=media_type(fmt, SR), headers=headers)
        try:
            out = await _unless_gone(gone, decode_all())
        finally:
            if not finished:
                await service.abort_quietly(rid)
        # Off the event loop: an hour of audio takes a while to quantize (and longer to FLAC-encode).
        data = await asyncio.to_thread(lambda: encode_file(concat(out), fmt, SR))
        return Response(data, media_type=media_type(fmt, SR), headers=headers)

    return decode
