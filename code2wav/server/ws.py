"""The WebSocket endpoint ``/v1/stream``: one :class:`_WsSession` per stream, one stream at a time
per connection (a stream opened with ``keep_open`` leaves its connection open after its
``done``, for the next ``open``). Every WebSocket error ends that connection's stream, frees its
slot and closes the connection; other connections are unaffected. When the service drains
(SIGTERM) or fails, every session ends with that error (``shutdown``: close 1012;
``engine_failed``: 1011)."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Callable

import numpy as np
from fastapi import WebSocket
from torch import Tensor

from code2wav.codes import CodesError, as_frames
from code2wav.server.audio import INT16_FORMATS, RAW_FORMATS, raw_bytes
from code2wav.server.metrics import _Metrics
from code2wav.server.payloads import PayloadError, parse_json
from code2wav.server.protocol import MAX_REQUEST_ID_CHARS, WS_CLOSE, Disconnected, Limits, ServiceError, error_body, service_error
from code2wav.server.service import Service


def stream_endpoint(service: Service, limits: Limits, metrics: _Metrics, authorized: Callable[[str | None], bool]):
    """The ``/v1/stream`` handler: accepts the connection and runs its session."""

    async def ws_stream(ws: WebSocket):
        await ws.accept()
        metrics.connections.inc()
        metrics.stream_requests.inc()
        try:
            later = False
            while True:  # one session a stream; the next only after a keep_open stream's done
                session = _WsSession(ws, service, limits, metrics, authorized, counted=not later)
                await _until_stopped(session, service)
                if not (session.finished and session.keep_open):
                    break
                later = True
        finally:
            metrics.connections.dec()

    return ws_stream


async def _until_stopped(session: _WsSession, service: Service) -> None:
    """Run ``session``; if the service drains or fails first, end it with that error (its slot
    is freed by the session's own cleanup). A session already ending (its error or its ``done``
    on the way) ends by itself. The session runs in this task: a drain cancels it (a hook, not a
    second task per connection waiting for the drain)."""
    task = asyncio.current_task()
    assert task is not None
    stopped: list[ServiceError] = []

    def stop(err: ServiceError) -> None:  # on the loop, once
        if not (session.ending or session.finished):
            stopped.append(err)
            task.cancel()

    take_back = service.on_stop(stop)
    try:
        await session.run()
    except asyncio.CancelledError:
        if not stopped or task.uncancel() > 0:  # cancelled from outside (the server's own shutdown) too
            raise
        await session._fail(stopped[0])
    finally:
        take_back()


class _WsSession:
    """One stream on a WebSocket connection (its first, or the next after a ``keep_open`` one's
    ``done``). A receiver task validates chunks and queues them on
    the engine; a sender task returns each chunk's audio in order. At most the engine's
    ``max_pending_chunks`` chunks are in flight, a chunk counting until its audio is sent; past
    that the receiver stops reading (TCP backpressure instead of an error). So a client that does
    not read stops its stream's decoding, and once the server's writes to it have been blocked
    for ``Limits.send_timeout`` the transport drops the connection (server/connections.py). The
    engine's worker turns each chunk's audio into the stream's wire format, so the event loop
    only moves bytes."""

    def __init__(self, ws: WebSocket, service: Service, limits: Limits, metrics: _Metrics, authorized: Callable[[str | None], bool],
                 counted: bool = True):
        self.ws, self.service, self.limits, self.metrics, self.authorized = ws, service, limits, metrics, authorized
        self.counted = counted  # in the stream requests: a connection's first at its handshake, a later one at its open
        self.Q, self.SIZE = service.num_quantizers, service.codebook_size
        self.rid: str | None = None
        self.opened = self.finished = self.released = False
        self.ending = False  # its error message is being sent
        self.fmt = "pcm_s16le"
        self.keep_open = False  # after done, wait for the next open instead of closing
        self.frames_in = self.frames_out = self.samples = 0
        self.outstanding = 0  # chunks pushed whose audio is not sent yet
        self.encode = None  # audio -> wire bytes, set on open
        self.sample_bytes = 2
        self.queue: asyncio.Queue = asyncio.Queue()  # each chunk's future, in order; None after end
        self.slots = asyncio.Semaphore(max(1, service.max_pending_chunks))
        self.in_flight: set[asyncio.Future] = set()
        self.last_activity = time.monotonic()
        self.t_open = self.t_opened = self.t_first_in = self.t_first_out = None
        self._receiving: asyncio.Task | None = None  # the task waiting in ws.receive(), if one is
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_fired = False

    # -- entry ---------------------------------------------------------------------------------

    async def run(self) -> None:
        tasks: list[asyncio.Task] = []
        if self.limits.idle_timeout:
            self._arm_idle(self.limits.idle_timeout)
        try:
            if not self.authorized(self.ws.headers.get("authorization")):
                raise ServiceError("unauthorized", "missing or wrong bearer token")
            await self._open(await self._recv())
            tasks = [asyncio.create_task(self._receiver()), asyncio.create_task(self._sender())]
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in tasks:  # the receiver's error first: it is the cause when both failed
                if t.done() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        except Disconnected:
            pass
        except asyncio.CancelledError:
            raise
        except Exception as e:
            err = service_error(e)
            await self._release(tasks)  # the slot is free before the client hears of the error
            await self._fail(err)
        finally:
            await self._release(tasks)

    async def _release(self, tasks: list[asyncio.Task]) -> None:
        """Stop the tasks and free the stream's slot (once; a finished stream's is free already)."""
        self._stop_idle()
        for t in tasks:
            t.cancel()
        for f in list(self.in_flight):
            f.cancel()  # drops the chunk if its step has not begun
        if self.opened and not self.finished and not self.released and self.rid is not None:
            self.released = True
            await self.service.abort_quietly(self.rid)

    async def _fail(self, err: ServiceError) -> None:
        self.ending = True
        self.metrics.errors.labels(err.code).inc()
        try:
            await self.ws.send_json(error_body(err.code, err.message))
            await self.ws.close(WS_CLOSE.get(err.code, 1011), reason=err.code)
        except Exception:
            pass  # the client is gone already

    # -- receiving -----------------------------------------------------------------------------

    async def _recv(self) -> tuple[str, object]:
        """Next message as ("text", str) or ("bytes", bytes), under the size and idle limits."""
        self._receiving = asyncio.current_task()
        try:
            msg = await self.ws.receive()
        except asyncio.CancelledError:
            if self._idle_fired and self._receiving is not None and self._receiving.uncancel() == 0:
                raise ServiceError("idle_timeout", f"no message for {self.limits.idle_timeout:g} s") from None
            raise
        finally:
            self._receiving = None
        self.last_activity = time.monotonic()
        if msg["type"] == "websocket.disconnect":
            raise Disconnected()
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

    # Idle: the client has sent nothing for ``idle_timeout`` s since the later of its last message
    # and the last audio sent, with no chunk of its in flight (audio it is still owed is not its
    # silence). One timer per session, not a timeout per receive: when it fires it looks at the
    # deadline, which every message and every audio sent moves, and either sleeps until it (so
    # the bound is exact), or, while a chunk is in flight, looks again a period later (the
    # deadline then moves to the audio's send), or ends the wait for a message with
    # ``idle_timeout``.

    def _arm_idle(self, delay: float) -> None:
        self._idle_timer = asyncio.get_running_loop().call_later(delay, self._idle_check)

    def _stop_idle(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _idle_check(self) -> None:
        idle = self.limits.idle_timeout
        assert idle
        left = self.last_activity + idle - time.monotonic()
        if self.outstanding or self._receiving is None:  # audio owed, or not waiting for a message right now
            self._arm_idle(idle if self.outstanding else max(left, 0.01))
        elif left > 0:
            self._arm_idle(left)
        else:
            self._idle_timer = None
            self._idle_fired = True
            self._receiving.cancel()

    @staticmethod
    def _json(text: str) -> dict:
        try:
            obj = parse_json(text, "message")
        except PayloadError as e:
            raise ServiceError(e.code, e.message) from None
        if not isinstance(obj, dict):
            raise ServiceError("bad_message", "a JSON message must be an object with an \"op\"")
        return obj

    async def _open(self, msg: tuple[str, object]) -> None:
        kind, data = msg
        if not self.counted:
            self.counted = True
            self.metrics.stream_requests.inc()
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
        keep_open = obj.get("keep_open", False)
        if not isinstance(keep_open, bool):
            raise ServiceError("bad_message", "keep_open must be true or false")
        fmt = obj.get("format", "pcm_s16le")
        if fmt not in RAW_FORMATS:
            raise ServiceError("bad_format", f"format {fmt!r}: expected one of {', '.join(RAW_FORMATS)}")
        prefix = await self._prefix(obj)
        self.t_open = time.perf_counter()
        await self.service.open(rid, prefix, pcm16=fmt in INT16_FORMATS)
        self.rid, self.fmt, self.opened, self.keep_open = rid, fmt, True, keep_open
        self.encode = functools.partial(raw_bytes, fmt=fmt)
        self.sample_bytes = 2 if fmt == "pcm_s16le" else 4
        self.t_opened = time.perf_counter()
        await self._send(lambda: self.ws.send_json({"type": "opened", "request_id": rid, "sample_rate": self.service.sample_rate, "format": fmt}))

    async def _prefix(self, obj: dict) -> Tensor | None:
        """The open's reference prefix: its JSON ``prefix``, or with ``prefix_frames`` P > 0 the
        binary message that follows (int16 ``[P, 16]``, as a push's frames: the event loop reads
        P frames' bytes instead of parsing P rows of JSON; bench/prefix_parse.py)."""
        prefix, count = obj.get("prefix"), obj.get("prefix_frames")
        if count is not None:
            if prefix is not None:
                raise ServiceError("bad_message", "give prefix or prefix_frames, not both")
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise ServiceError("bad_message", "prefix_frames must be a non-negative integer")
            if count == 0:
                return None
            kind, data = await self._recv()
            if kind != "bytes":
                raise ServiceError("bad_message", f"expected the prefix's {count} frames as one binary message after open")
            if len(data) != 2 * self.Q * count:  # type: ignore[arg-type]
                raise ServiceError("bad_shape", f"prefix_frames {count}: expected {2 * self.Q * count} bytes of int16 [{count}, {self.Q}], "
                                                f"got {len(data)}")  # type: ignore[arg-type]
            prefix = self._binary(data)  # type: ignore[arg-type]
        if prefix is None:
            return None
        try:
            return as_frames(prefix, self.Q, self.SIZE, "prefix", allow_empty=True)
        except CodesError as e:
            raise ServiceError(e.code, str(e)) from None

    def _binary(self, raw: bytes) -> np.ndarray:
        """Binary frames: int16 little-endian ``[n, Q]``, row-major."""
        if len(raw) % (2 * self.Q):
            raise ServiceError("bad_shape", f"binary frames must be int16 [n, {self.Q}]: {len(raw)} bytes is not a multiple of {2 * self.Q}")
        return np.frombuffer(raw, dtype="<i2").reshape(-1, self.Q).copy()

    def _chunk(self, kind: str, data: object) -> Tensor | None:
        """A push message's frames, or None for ``end``."""
        if kind == "bytes":
            payload: object = self._binary(data)  # type: ignore[arg-type]
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
                self._stop_idle()  # nothing more is read
                self.queue.put_nowait(None)
                return
            self.frames_in += frames.shape[0]
            if self.frames_in > self.limits.max_stream_frames:
                raise ServiceError("too_many_frames", f"stream exceeds the limit of {self.limits.max_stream_frames} frames")
            if self.t_first_in is None:
                self.t_first_in = time.perf_counter()
            await self.slots.acquire()
            try:
                fut = self.service.submit(self.rid, frames, self.encode)  # type: ignore[arg-type]
            except BaseException:
                self.slots.release()
                raise
            self.outstanding += 1
            self.in_flight.add(fut)
            fut.add_done_callback(self._settled)
            self.queue.put_nowait(fut)

    def _settled(self, f: asyncio.Future) -> None:
        self.in_flight.discard(f)
        if not f.cancelled():
            f.exception()  # retrieved: an abandoned chunk's error is not an unhandled one

    # -- sending -------------------------------------------------------------------------------

    async def _send(self, fn) -> None:
        try:
            await fn()
        except Exception as e:  # WebSocketDisconnect, ClientDisconnected, a closed transport
            raise Disconnected() from e

    async def _sender(self) -> None:
        while True:
            fut = await self.queue.get()
            if fut is None:
                break
            try:
                data: bytes = await fut
                await self._send(lambda: self.ws.send_bytes(data))  # noqa: B023  (awaited here, in this iteration)
            finally:
                self.slots.release()  # only once sent: a client that does not read holds its chunks in flight
            self.outstanding -= 1
            self.last_activity = time.monotonic()
            if self.t_first_out is None:
                self.t_first_out = time.perf_counter()
                self.metrics.ttfp_seconds.observe(self.t_first_out - (self.t_first_in or self.t_first_out))
            n = len(data) // self.sample_bytes
            self.frames_out += n // self.service.samples_per_frame
            self.samples += n
        await self.service.finish(self.rid)  # type: ignore[arg-type]
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
        if not self.keep_open:
            await self._send(lambda: self.ws.close(1000))

