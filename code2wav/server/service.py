"""The service's one view of the engine: :class:`Service` wraps an :class:`AsyncEngine`.

Nothing else in ``code2wav.server`` touches the engine, so a change of the engine's internals
(the wrapped stream engine, its pool, its runner) is a change here alone.

It also holds the service's state: *ok*; *draining* (a SIGTERM: new requests are refused with
``shutdown``, WebSocket streams are ended, requests in flight may finish for a bounded time, see
:meth:`Service.drain`); *failed* (the engine's worker died: everything fails with
``engine_failed`` and the process exits, see ``code2wav.server.run``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from code2wav.engine.async_engine import AsyncEngine, Encode, EngineFailed, EngineStats
from code2wav.server.protocol import HTTP_STATUS, ServiceError, error_body, log, service_error
from code2wav.stream.lifecycle import Lifecycle
from code2wav.stream.rows import StreamError

StepHook = Callable[[float, int, int], None]  # (seconds, rows, padded frames a row) after every step


class Service:
    """The engine calls and figures the endpoints and the metrics need."""

    def __init__(self, engine: AsyncEngine):
        self._engine = engine
        cfg = self._core.cfg
        self.sample_rate: int = cfg.sample_rate
        self.num_quantizers: int = cfg.num_quantizers
        self.codebook_size: int = cfg.codebook_size
        self.samples_per_frame: int = cfg.samples_per_frame
        self.max_streams: int = self._core.max_streams
        self.precision = self._core.model.precision()  # dtypes by name, auto's probe peak
        self._stop: ServiceError | None = None  # why new work is refused: shutdown (a drain) or engine_failed
        self._closed = False  # the drain is over (or the engine failed): streams may no longer open or push
        self._stopping = asyncio.Event()  # set with _stop
        self._in_flight = 0  # HTTP requests and WebSocket connections being handled (see request())
        self._idle = asyncio.Event()  # set while _in_flight == 0
        self._idle.set()
        self._fatal: list[Callable[[ServiceError], None]] = []
        self._stop_hooks: set[Callable[[ServiceError], None]] = set()  # see on_stop
        engine.on_failure.append(self._engine_failed)

    @property
    def _core(self) -> Lifecycle:
        """The engine the async engine drives: every read of it goes through here."""
        return self._engine.engine

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        await self._engine.start()

    async def stop(self) -> None:
        """Stop the scheduler; streams still open are aborted."""
        await self._engine.stop()

    # -- state: ok, draining, failed ----------------------------------------------------------

    @property
    def state(self) -> str:
        """``ok``, ``draining`` (shutting down) or ``failed`` (the engine's worker died)."""
        if self._stop is None:
            return "ok"
        return "failed" if self._stop.code == "engine_failed" else "draining"

    @property
    def stop_error(self) -> ServiceError | None:
        """The error new requests get (``shutdown`` or ``engine_failed``), or None while ok."""
        return self._stop

    def on_fatal(self, hook: Callable[[ServiceError], None]) -> None:
        """Call ``hook(error)`` on the event loop when the engine fails (the process should exit)."""
        self._fatal.append(hook)

    def begin_drain(self) -> None:
        """Refuse new work with ``shutdown`` from now on (requests in flight go on)."""
        if self._stop is None:
            self._stop = ServiceError("shutdown", "the server is shutting down; retry later")
        self._set_stopping()

    def _engine_failed(self, err: EngineFailed) -> None:
        self._stop = ServiceError("engine_failed", f"{err}; the server exits (to be restarted)")
        self._closed = True
        self._set_stopping()
        for hook in list(self._fatal):
            hook(self._stop)

    def _set_stopping(self) -> None:
        if self._stopping.is_set():
            return
        self._stopping.set()
        hooks, self._stop_hooks = self._stop_hooks, set()
        for hook in hooks:
            hook(self._stop)  # type: ignore[arg-type]

    async def stopping(self) -> ServiceError:
        """Wait until the service drains or fails; returns the error that ends open streams."""
        await self._stopping.wait()
        return self._stop  # type: ignore[return-value]

    def on_stop(self, hook: Callable[[ServiceError], None]) -> Callable[[], None]:
        """Call ``hook(error)`` on the event loop once, when the service drains or fails (at once
        if it has already); returns the function that takes the hook back. What a WebSocket
        session uses instead of a task waiting on :meth:`stopping` per connection."""
        if self._stopping.is_set():
            hook(self._stop)  # type: ignore[arg-type]
            return _nothing
        self._stop_hooks.add(hook)
        return functools.partial(self._stop_hooks.discard, hook)

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """Counts one request (or connection) in flight while the block runs: a drain waits for them."""
        self._in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    @property
    def requests_in_flight(self) -> int:
        return self._in_flight

    async def drain(self, timeout: float) -> bool:
        """Shut down gracefully: refuse new work (``begin_drain``), wait up to ``timeout`` seconds
        for the requests in flight to end, then end the streams still decoding (their chunks
        fail with the stop error, ``shutdown``). True if everything ended within ``timeout``."""
        self.begin_drain()
        clean = True
        if self._in_flight:
            try:
                await asyncio.wait_for(self._idle.wait(), timeout)
            except TimeoutError:
                clean = False
        self._closed = True
        for rid in self._engine.streams:
            await self._engine.abort(rid, self._closed_error())
        return clean

    def _closed_error(self) -> StreamError:
        """A fresh error for a chunk refused or ended once the service is closed."""
        stop = self._stop or ServiceError("shutdown", "the server is shutting down")
        return StreamError(stop.code, stop.message)

    def health(self) -> tuple[int, dict]:
        """``GET /health``'s status and body: 200 while ok; the stop error's status and body (with
        ``status`` ``draining`` or ``failed``) otherwise."""
        figures = {"active_streams": self.active_streams, "max_streams": self.max_streams, "sample_rate": self.sample_rate,
                   "precision": self.precision}
        warmup = self._engine.warmup
        if warmup is not None:  # graphs captured while serving: "warming" (steps partly eager), then "ready"
            figures["graphs"] = warmup.status()
        if self._stop is None:
            return 200, {"status": "ok", **figures}
        return HTTP_STATUS[self._stop.code], {**error_body(self._stop.code, self._stop.message), "status": self.state, **figures}

    # -- streams ------------------------------------------------------------------------------

    async def open(self, rid: str, prefix: object, pcm16: bool = False) -> None:
        """Open a stream; a refusal raises its :class:`ServiceError`. ``pcm16``: its audio is
        returned in a 16-bit format, so the engine quantizes it on the device."""
        if self._closed:
            err = self._closed_error()
            raise ServiceError(err.code, str(err))
        try:
            await self._engine.open(rid, prefix, pcm16=pcm16)
        except BaseException as e:
            if isinstance(e, asyncio.CancelledError):
                raise
            raise service_error(e) from None

    def submit(self, rid: str, frames: object, encode: Encode | None = None) -> asyncio.Future:
        """Queue a chunk now (or raise); the future resolves to its audio, or ``encode(audio)``."""
        if self._closed:
            raise self._closed_error()
        return self._engine.submit(rid, frames, encode)

    async def push(self, rid: str, frames: object, encode: Encode | None = None) -> Any:
        return await self.submit(rid, frames, encode)

    async def finish(self, rid: str) -> None:
        """Wait for the stream's queued chunks, then free it."""
        await self._engine.finish(rid)

    async def abort(self, rid: str) -> None:
        await self._engine.abort(rid)

    async def abort_quietly(self, rid: str) -> None:
        """Free a stream's slot even while the caller is being cancelled."""
        try:
            await asyncio.shield(self._engine.abort(rid))
        except (StreamError, asyncio.CancelledError):
            pass
        except Exception:  # pragma: no cover - logged, never raised into a cleanup path
            log.exception("abort of %s failed", rid)

    # -- figures ------------------------------------------------------------------------------

    @property
    def max_pending_chunks(self) -> int:
        """Chunks one stream may have in flight."""
        return self._engine.max_pending_chunks

    @property
    def active_streams(self) -> int:
        return self._core.active

    @property
    def slots_in_use(self) -> int:
        """State-pool slots in use (the streams, for a mode without a pool)."""
        return self._core.slots_in_use

    @property
    def stats(self) -> EngineStats:
        return self._engine.stats

    def graph_stats(self) -> dict | None:
        """The CUDA graph runner's counters, or None for a runner without graphs (the eager one)."""
        return self._core.runner_stats()

    def prefix_cache_stats(self) -> dict[str, int] | None:
        """The prefix cache's counters, or None without a cache."""
        return self._core.prefix_cache_stats()

    def on_step(self, hook: StepHook) -> None:
        """Call ``hook`` on the engine's worker after every step."""
        self._engine.on_step.append(hook)


def _nothing() -> None:
    pass
