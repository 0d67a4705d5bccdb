"""The HTTP + WebSocket service over an :class:`AsyncEngine` (protocol: ``docs/protocol.md``).

``create_app(engine, api_key, limits)`` returns a FastAPI app. The app starts the engine's
scheduler when it starts and stops it (aborting open streams) when it stops.

Every error a client sees is ``{"type": "error", "code": <machine code>, "message": <human>}``:
on the WebSocket it is followed by a close with the code's close code (``WS_CLOSE``); over HTTP
it is the body of a response with the code's status (``HTTP_STATUS``). Every WebSocket error
ends that connection's stream and frees its slot; other connections are unaffected.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import io
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass

import numpy as np
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from torch import Tensor

from code2wav.codes import CodesError, as_frames
from code2wav.engine.async_engine import AsyncEngine
from code2wav.server.audio import HTTP_FORMATS, MEDIA_TYPES, RAW_FORMATS, concat, encode_file, raw_bytes, wav_header
from code2wav.stream.rows import StreamError
from code2wav.stream.pool import PoolFull

log = logging.getLogger("code2wav.server")

# Machine code -> WebSocket close code. Codes not listed close with 1011 (internal).
WS_CLOSE = {
    "unauthorized": 1008,
    "duplicate_request_id": 1008,
    "not_open": 1008,
    "already_open": 1008,
    "idle_timeout": 1008,
    "bad_json": 1003,
    "bad_message": 1003,
    "unknown_op": 1003,
    "bad_format": 1003,
    "bad_request_id": 1003,
    "bad_shape": 1003,
    "bad_dtype": 1003,
    "out_of_range": 1003,
    "empty": 1003,
    "bad_padding": 1003,
    "message_too_big": 1009,
    "too_many_frames": 1009,
    "prefix_too_long": 1009,
    "pool_full": 1013,
    "queue_full": 1013,
    "shutdown": 1012,
    "prefill_failed": 1011,
    "non_finite_audio": 1011,
    "internal": 1011,
}
# Machine code -> HTTP status. Codes not listed answer 500.
HTTP_STATUS = {
    "unauthorized": 401,
    "bad_json": 400,
    "bad_message": 400,
    "bad_format": 400,
    "bad_npy": 400,
    "bad_shape": 400,
    "bad_dtype": 400,
    "out_of_range": 400,
    "empty": 400,
    "bad_padding": 400,
    "unsupported_media_type": 415,
    "body_too_big": 413,
    "too_many_frames": 413,
    "prefix_too_long": 413,
    "pool_full": 503,
    "queue_full": 503,
    "shutdown": 503,
    "prefill_failed": 500,
    "non_finite_audio": 500,
    "internal": 500,
}
# Request ids are the client's; keep them printable and short.
MAX_REQUEST_ID_CHARS = 256


@dataclass
class Limits:
    max_message_bytes: int = 1 << 20  # one WebSocket message (JSON text or binary frames)
    max_stream_frames: int = 45_000  # frames one stream may push (1 hour of audio)
    max_body_bytes: int = 16 << 20  # one POST /v1/decode body
    idle_timeout: float | None = 30.0  # seconds without a client message while nothing is in flight
    http_chunk_frames: int = 25  # POST /v1/decode feeds the engine in chunks of this many frames
    retry_after_s: int = 1  # Retry-After on 503


class ServiceError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class _Disconnected(Exception):
    """The WebSocket client went away."""


def _service_error(e: BaseException) -> ServiceError:
    """Map engine/validation exceptions onto the protocol's codes."""
    if isinstance(e, ServiceError):
        return e
    if isinstance(e, PoolFull):
        return ServiceError("pool_full", f"{e}; retry later")
    if isinstance(e, (StreamError, CodesError)):
        return ServiceError(e.code, str(e))
    log.exception("internal error", exc_info=e)
    return ServiceError("internal", f"internal error ({type(e).__name__})")


def error_body(code: str, message: str) -> dict:
    return {"type": "error", "code": code, "message": message}


class _Metrics:
    def __init__(self, engine: AsyncEngine):
        self.engine = engine
        self.registry = CollectorRegistry()
        self.registry.register(self)  # the engine-derived gauges/counters below, read at scrape time
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes etc., for load tests
        self.step_seconds = Histogram(
            "code2wav_step_seconds",
            "Time of one batched forward (GPU time on CUDA, wall time on CPU)",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
            registry=self.registry,
        )
        self.ttfp_seconds = Histogram(
            "code2wav_ttfp_seconds",
            "Time to first audio packet: first chunk received -> its audio sent",
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0),
            registry=self.registry,
        )
        self.errors = Counter("code2wav_errors", "Errors returned to clients, by code", ["code"], registry=self.registry)
        self.connections = Gauge("code2wav_websocket_connections", "Open WebSocket connections", registry=self.registry)
        self.requests = Counter("code2wav_requests", "Requests by endpoint", ["endpoint"], registry=self.registry)
        engine.on_step.append(lambda seconds, rows, frames: self.step_seconds.observe(seconds))

    def collect(self):
        core, stats = self.engine.engine, self.engine.stats
        in_use = core.slots_in_use
        yield GaugeMetricFamily("code2wav_active_streams", "Streams open in the engine", value=core.active)
        yield GaugeMetricFamily("code2wav_pool_slots_in_use", "State-pool slots in use", value=in_use)
        yield GaugeMetricFamily("code2wav_pool_slots_total", "State-pool slots in all", value=core.max_streams)
        yield CounterMetricFamily("code2wav_steps", "Batched forwards (one group of rows each)", value=stats.steps)
        yield CounterMetricFamily("code2wav_step_rows", "Rows over all batched forwards", value=stats.rows)
        yield CounterMetricFamily("code2wav_chunks", "Stream chunks decoded and handed over", value=stats.chunks)
        yield CounterMetricFamily("code2wav_decoded_frames", "Frames decoded", value=stats.frames)
        yield _by_label("code2wav_engine_errors", "Errors raised inside the engine, by code", "code", stats.errors)
        g = core.runner_stats()  # a GraphRunner's (CUDA); the eager runner has none
        if g is not None:
            yield CounterMetricFamily("code2wav_graph_replays", "Batched forwards and prefill passes replayed from CUDA graphs", value=g["hits"])
            yield _by_label("code2wav_graph_fallbacks", "Passes run eagerly for want of a captured graph, by reason", "reason", g["fallbacks"])
            yield CounterMetricFamily("code2wav_graph_frames", "Real frames in replayed step graphs", value=g["frames"])
            yield CounterMetricFamily("code2wav_graph_padded_frames", "Rows x frames of replayed step graphs, padding included",
                                      value=g["padded_frames"])
            yield GaugeMetricFamily("code2wav_graph_pool_bytes", "Memory of the CUDA graphs' shared pool, after capture", value=g["pool_bytes"])

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _by_label(name: str, doc: str, label: str, counts: dict) -> CounterMetricFamily:
    """A counter family with one sample per key of ``counts``."""
    c = CounterMetricFamily(name, doc, labels=[label])
    for key, n in sorted(counts.items()):
        c.add_metric([str(key)], n)
    return c


def create_app(engine: AsyncEngine, api_key: str | None = None, limits: Limits | None = None) -> FastAPI:
    limits = limits or Limits()
    metrics = _Metrics(engine)
    cfg = engine.engine.cfg
    Q, SIZE, SPF, SR = cfg.num_quantizers, cfg.codebook_size, cfg.samples_per_frame, cfg.sample_rate

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await engine.start()
        try:
            yield
        finally:
            await engine.stop()

    app = FastAPI(title="code2wav", lifespan=lifespan)
    app.state.engine, app.state.limits, app.state.metrics = engine, limits, metrics

    def authorized(header: str | None) -> bool:
        if api_key is None:
            return True
        if not header or not header.startswith("Bearer "):
            return False
        return hmac.compare_digest(header[len("Bearer ") :].strip().encode(), api_key.encode())

    def check_auth(request: Request) -> None:
        if not authorized(request.headers.get("authorization")):
            raise ServiceError("unauthorized", "missing or wrong bearer token")

    async def abort_quietly(rid: str) -> None:
        """Free a stream's slot even while the caller is being cancelled."""
        try:
            await asyncio.shield(engine.abort(rid))
        except (StreamError, asyncio.CancelledError):
            pass
        except Exception:  # pragma: no cover - logged, never raised into a cleanup path
            log.exception("abort of %s failed", rid)

    async def open_stream(rid: str, prefix: object) -> None:
        try:
            await engine.open(rid, prefix)
        except BaseException as e:
            if isinstance(e, asyncio.CancelledError):
                raise
            raise _service_error(e) from None

    @app.exception_handler(ServiceError)
    async def _on_service_error(request: Request, e: ServiceError):
        metrics.errors.labels(e.code).inc()
        headers = {}
        if e.code in ("pool_full", "queue_full", "shutdown"):
            headers["Retry-After"] = str(limits.retry_after_s)
        if e.code == "unauthorized":
            headers["WWW-Authenticate"] = "Bearer"
        return JSONResponse(error_body(e.code, e.message), status_code=HTTP_STATUS.get(e.code, 500), headers=headers)

    # -- plain endpoints ---------------------------------------------------------------------------

    @app.get("/health")
    async def health():
        core = engine.engine
        return {"status": "ok", "active_streams": core.active, "max_streams": core.max_streams, "sample_rate": SR}

    @app.get("/metrics")
    async def prometheus(request: Request):
        check_auth(request)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # -- POST /v1/decode ---------------------------------------------------------------------------

    def request_frames(obj: object, what: str, allow_empty: bool = False) -> Tensor:
        """As ``as_frames``, after dropping trailing official ``-1`` padding rows."""
        if obj is None:
            raise ServiceError("bad_message", f"{what}: missing")
        try:
            arr = np.asarray(obj)
        except (ValueError, TypeError):
            arr = None
        if arr is not None and arr.ndim == 2 and arr.dtype.kind in "iu" and arr.shape[0]:
            keep = int(np.flatnonzero(arr[:, 0] != -1)[-1]) + 1 if (arr[:, 0] != -1).any() else 0
            obj = arr[:keep]
        try:
            return as_frames(obj, Q, SIZE, what, allow_empty)
        except CodesError as e:
            raise ServiceError(e.code, str(e)) from None

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limits.max_body_bytes:
            raise ServiceError("body_too_big", f"body of {declared} bytes exceeds the limit of {limits.max_body_bytes}")
        buf = bytearray()
        async for part in request.stream():
            buf += part
            if len(buf) > limits.max_body_bytes:
                raise ServiceError("body_too_big", f"body exceeds the limit of {limits.max_body_bytes} bytes")
        return bytes(buf)

    @app.post("/v1/decode")
    async def decode(request: Request, format: str | None = None, stream: bool | None = None, prefix_frames: int = 0):
        check_auth(request)
        metrics.requests.labels("decode").inc()
        body = await read_body(request)
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
            frames = request_frames(obj.get("codes"), "codes")
            prefix = request_frames(obj["prefix"], "prefix", allow_empty=True) if obj.get("prefix") is not None else None
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
            prefix = request_frames(arr[:prefix_frames], "prefix", allow_empty=True) if prefix_frames else None
            frames = request_frames(arr[prefix_frames:], "codes")
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
        await open_stream(rid, prefix)

        if not streaming:
            finished = False
            try:
                pieces = [await engine.push(rid, frames[s : s + step]) for s in range(0, n, step)]
                await engine.finish(rid)
                finished = True
            except (StreamError, CodesError, PoolFull) as e:
                raise _service_error(e) from None
            finally:
                if not finished:
                    await abort_quietly(rid)
            return Response(encode_file(concat(pieces), fmt, SR), media_type=MEDIA_TYPES[fmt], headers=headers)

        async def body_iter():
            finished = False
            t0 = time.perf_counter()
            encode = functools.partial(raw_bytes, fmt="pcm" if fmt == "wav" else fmt)  # runs on the engine's worker
            try:
                if fmt == "wav":
                    yield wav_header(n * SPF, SR)
                for i, s in enumerate(range(0, n, step)):
                    data = await engine.push(rid, frames[s : s + step], encode)
                    if i == 0:
                        metrics.ttfp_seconds.observe(time.perf_counter() - t0)
                    yield data
                await engine.finish(rid)
                finished = True
            except (StreamError, CodesError) as e:  # headers are gone: the body ends short
                metrics.errors.labels(e.code).inc()
                log.warning("stream %s ended early: %s", rid, e)
            finally:
                if not finished:
                    await abort_quietly(rid)

        return StreamingResponse(body_iter(), media_type=MEDIA_TYPES[fmt], headers=headers)

    # -- WebSocket /v1/stream ----------------------------------------------------------------------

    @app.websocket("/v1/stream")
    async def ws_stream(ws: WebSocket):
        await ws.accept()
        metrics.connections.inc()
        metrics.requests.labels("stream").inc()
        try:
            await _WsSession(ws, engine, limits, metrics, authorized, abort_quietly, open_stream).run()
        finally:
            metrics.connections.dec()

    return app


class _WsSession:
    """One WebSocket connection = one stream. A receiver task validates chunks and queues them on
    the engine; a sender task returns each chunk's audio in order. At most the engine's
    ``max_pending_chunks`` chunks are in flight; past that the receiver stops reading (TCP
    backpressure instead of an error). The engine's worker turns each chunk's audio into the
    stream's wire format, so the event loop only moves bytes."""

    def __init__(self, ws: WebSocket, engine: AsyncEngine, limits: Limits, metrics: _Metrics, authorized, abort_quietly, open_stream):
        self.ws, self.engine, self.limits, self.metrics = ws, engine, limits, metrics
        self.authorized, self.abort_quietly, self.open_stream = authorized, abort_quietly, open_stream
        cfg = engine.engine.cfg
        self.Q, self.SIZE = cfg.num_quantizers, cfg.codebook_size
        self.rid: str | None = None
        self.opened = self.finished = False
        self.fmt = "pcm_s16le"
        self.frames_in = self.frames_out = self.samples = 0
        self.outstanding = 0  # chunks pushed whose audio is not sent yet
        self.encode = None  # audio -> wire bytes, set on open
        self.sample_bytes = 2
        self.queue: asyncio.Queue = asyncio.Queue()  # each chunk's future, in order; None after end
        self.slots = asyncio.Semaphore(max(1, engine.max_pending_chunks))
        self.in_flight: set[asyncio.Future] = set()
        self.last_activity = time.monotonic()
        self.t_open = self.t_opened = self.t_first_in = self.t_first_out = None

    # -- entry ---------------------------------------------------------------------------------

    async def run(self) -> None:
        tasks: list[asyncio.Task] = []
        try:
            if not self.authorized(self.ws.headers.get("authorization")):
                raise ServiceError("unauthorized", "missing or wrong bearer token")
            await self._open(await self._recv())
            tasks = [asyncio.create_task(self._receiver()), asyncio.create_task(self._sender())]
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in tasks:  # the receiver's error first: it is the cause when both failed
                if t.done() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        except _Disconnected:
            pass
        except asyncio.CancelledError:
            raise
        except Exception as e:
            err = _service_error(e)
            for t in tasks:
                t.cancel()
            await self._fail(err)
        finally:
            for t in tasks:
                t.cancel()
            for f in list(self.in_flight):
                f.cancel()  # drops the chunk if its step has not begun
            if self.opened and not self.finished and self.rid is not None:
                await self.abort_quietly(self.rid)

    async def _fail(self, err: ServiceError) -> None:
        self.metrics.errors.labels(err.code).inc()
        try:
            await self.ws.send_json(error_body(err.code, err.message))
            await self.ws.close(WS_CLOSE.get(err.code, 1011), reason=err.code)
        except Exception:
            pass  # the client is gone already

    # -- receiving -----------------------------------------------------------------------------

    async def _recv(self) -> tuple[str, object]:
        """Next message as ("text", str) or ("bytes", bytes), under the size and idle limits."""
        task = asyncio.ensure_future(self.ws.receive())
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.limits.idle_timeout)
                if done:
                    break
                if self.outstanding == 0 and time.monotonic() - self.last_activity >= (self.limits.idle_timeout or 0):
                    raise ServiceError("idle_timeout", f"no message for {self.limits.idle_timeout} s")
        except BaseException:
            task.cancel()
            raise
        msg = task.result()
        self.last_activity = time.monotonic()
        if msg["type"] == "websocket.disconnect":
            raise _Disconnected()
        data = msg.get("bytes")
        if data is not None:
            if len(data) > self.limits.max_message_bytes:
                raise ServiceError("message_too_big", f"message of {len(data)} bytes exceeds the limit of {self.limits.max_message_bytes}")
            return "bytes", data
        text = msg.get("text") or ""
        size = len(text.encode())
        if size > self.limits.max_message_bytes:
            raise ServiceError("message_too_big", f"message of {size} bytes exceeds the limit of {self.limits.max_message_bytes}")
        return "text", text

    @staticmethod
    def _json(text: str) -> dict:
        try:
            obj = json.loads(text)
        except ValueError as e:
            raise ServiceError("bad_json", f"message is not JSON ({e})") from None
        if not isinstance(obj, dict):
            raise ServiceError("bad_message", "a JSON message must be an object with an \"op\"")
        return obj

    async def _open(self, msg: tuple[str, object]) -> None:
        kind, data = msg
        if kind == "bytes":
            raise ServiceError("not_open", "send {\"op\":\"open\"} before any frames")
        obj = self._json(data)  # type: ignore[arg-type]
        op = obj.get("op")
        if op in ("push", "end"):
            raise ServiceError("not_open", f"op {op!r} before {{\"op\":\"open\"}}")
        if op != "open":
            raise ServiceError("unknown_op", f"unknown op {op!r}; expected open")
        rid = obj.get("request_id")
        if rid is None:
            rid = f"ws-{uuid.uuid4().hex}"
        if not isinstance(rid, str) or not rid or len(rid) > MAX_REQUEST_ID_CHARS:
            raise ServiceError("bad_request_id", f"request_id must be a non-empty string of at most {MAX_REQUEST_ID_CHARS} characters")
        fmt = obj.get("format", "pcm_s16le")
        if fmt not in RAW_FORMATS:
            raise ServiceError("bad_format", f"format {fmt!r}: expected one of {', '.join(RAW_FORMATS)}")
        prefix = obj.get("prefix")
        if prefix is not None:
            try:
                prefix = as_frames(prefix, self.Q, self.SIZE, "prefix", allow_empty=True)
            except CodesError as e:
                raise ServiceError(e.code, str(e)) from None
        self.t_open = time.perf_counter()
        await self.open_stream(rid, prefix)
        self.rid, self.fmt, self.opened = rid, fmt, True
        self.encode = functools.partial(raw_bytes, fmt=fmt)
        self.sample_bytes = 2 if fmt == "pcm_s16le" else 4
        self.t_opened = time.perf_counter()
        await self._send(lambda: self.ws.send_json({"type": "opened", "request_id": rid, "sample_rate": self.engine.engine.cfg.sample_rate, "format": fmt}))

    def _chunk(self, kind: str, data: object) -> Tensor | None:
        """A push message's frames, or None for ``end``."""
        if kind == "bytes":
            raw: bytes = data  # type: ignore[assignment]
            if len(raw) % (2 * self.Q):
                raise ServiceError("bad_shape", f"binary frames must be int16 [n, {self.Q}]: {len(raw)} bytes is not a multiple of {2 * self.Q}")
            payload: object = np.frombuffer(raw, dtype="<i2").reshape(-1, self.Q).copy()
        else:
            obj = self._json(data)  # type: ignore[arg-type]
            op = obj.get("op")
            if op == "end":
                return None
            if op == "open":
                raise ServiceError("already_open", "this connection's stream is already open")
            if op != "push":
                raise ServiceError("unknown_op", f"unknown op {op!r}; expected push or end")
            if "frames" not in obj:
                raise ServiceError("bad_message", "push needs \"frames\"")
            payload = obj["frames"]
        try:
            return as_frames(payload, self.Q, self.SIZE, "frames")
        except CodesError as e:
            raise ServiceError(e.code, str(e)) from None

    async def _receiver(self) -> None:
        while True:
            frames = self._chunk(*await self._recv())
            if frames is None:
                await self.queue.put(None)
                return
            self.frames_in += frames.shape[0]
            if self.frames_in > self.limits.max_stream_frames:
                raise ServiceError("too_many_frames", f"stream exceeds the limit of {self.limits.max_stream_frames} frames")
            if self.t_first_in is None:
                self.t_first_in = time.perf_counter()
            await self.slots.acquire()
            try:
                fut = self.engine.submit(self.rid, frames, self.encode)  # type: ignore[arg-type]
            except BaseException:
                self.slots.release()
                raise
            self.outstanding += 1
            self.in_flight.add(fut)
            fut.add_done_callback(_discard_from(self.in_flight))
            self.queue.put_nowait(fut)

    # -- sending -------------------------------------------------------------------------------

    async def _send(self, fn) -> None:
        try:
            await fn()
        except Exception as e:  # WebSocketDisconnect, ClientDisconnected, a closed transport
            raise _Disconnected() from e

    async def _sender(self) -> None:
        while True:
            fut = await self.queue.get()
            if fut is None:
                break
            try:
                data: bytes = await fut
            finally:
                self.slots.release()
            await self._send(lambda: self.ws.send_bytes(data))
            self.outstanding -= 1
            self.last_activity = time.monotonic()
            if self.t_first_out is None:
                self.t_first_out = time.perf_counter()
                self.metrics.ttfp_seconds.observe(self.t_first_out - (self.t_first_in or self.t_first_out))
            n = len(data) // self.sample_bytes
            self.frames_out += n // self.engine.engine.cfg.samples_per_frame
            self.samples += n
        await self.engine.finish(self.rid)  # type: ignore[arg-type]
        self.finished = True
        t = time.perf_counter()
        ms = lambda a, b: None if a is None or b is None else round((b - a) * 1000, 3)  # noqa: E731
        done = {
            "type": "done",
            "request_id": self.rid,
            "frames": self.frames_out,
            "samples": self.samples,
            "timings": {
                "open_ms": ms(self.t_open, self.t_opened),
                "ttfp_ms": ms(self.t_first_in, self.t_first_out),
                "total_ms": ms(self.t_open, t),
            },
        }
        await self._send(lambda: self.ws.send_json(done))
        await self._send(lambda: self.ws.close(1000))


def _discard_from(s: set):
    def cb(f: asyncio.Future) -> None:
        s.discard(f)
        if not f.cancelled():
            f.exception()  # retrieved: an abandoned chunk's error is not an unhandled one

    return cb
