"""Continuous batching over an engine (a :class:`StreamEngine`), for asyncio callers (the server, the bench).

Streams push chunks at any time. One worker thread (the decoder is not thread-safe, and the
event loop must stay free) takes the oldest pending chunk of every stream into one continuous
decode, whose steps run back to back, each taking the chunks that arrived meanwhile: a new
stream's first chunk waits for one step, not for every other stream's chunks. Each chunk's future
resolves as soon as its row's audio is on the host. One chunk per stream in flight keeps
per-stream order; a stream with too many chunks queued is refused, never buffered without
limit. Opening, finishing and aborting are host bookkeeping on the event loop, never queued
behind a step.

A push wakes the worker directly (a thread event, set only when not set already): on an idle
engine each extra loop iteration or executor round trip on the way would add tens of
microseconds to the first packet. The way back is batched: the worker queues each row's result
and wakes the loop once for everything queued until the loop runs.

A push may carry an ``encode`` function (e.g. audio -> PCM bytes), run on the worker as soon as
the row's audio is ready: per-chunk conversion stays off the event loop, the service's bottleneck.

If the worker's loop fails in any way (an exception outside the per-decode handler, or a
``BaseException`` out of a step), the engine is *failed* for good: every chunk in flight or
queued fails with :class:`EngineFailed` (code ``engine_failed``), every stream is aborted, later
``open``/``submit`` calls raise it, and the ``on_failure`` hooks run on the event loop (the
service turns unhealthy and exits, so that a supervisor restarts it).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from code2wav.stream.lifecycle import Lifecycle
from code2wav.stream.rows import StreamError

log = logging.getLogger("code2wav.engine")


class Backpressure(StreamError):
    """Too many chunks in flight for one stream; retry after its audio arrives."""

    def __init__(self, message: str):
        super().__init__("queue_full", message)


class EngineFailed(StreamError):
    """The worker thread died: nothing more is decoded, by this engine, ever."""

    def __init__(self, message: str):
        super().__init__("engine_failed", message)


@dataclass
class EngineStats:
    steps: int = 0  # batched forwards
    rows: int = 0  # rows over all of them (a chunk cut into pieces counts once per piece)
    chunks: int = 0  # chunks decoded and handed over
    frames: int = 0  # frames in them
    step_seconds: list[float] = field(default_factory=list)  # per batched forward (GPU time on CUDA)
    errors: dict[str, int] = field(default_factory=dict)

    def record_error(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1


Encode = Callable[[Tensor], Any]  # a chunk's audio -> what its future resolves to


class AsyncEngine:
    def __init__(self, engine: Lifecycle, max_pending_chunks: int = 16, batch_wait_s: float = 0.0, keep_step_times: int = 100_000):
        self.engine = engine  # the engine it drives: a StreamEngine (or a BaselineEngine)
        self.max_pending_chunks = max_pending_chunks
        self.batch_wait_s = batch_wait_s  # >0: wait a little for more rows (throughput mode)
        self.stats = EngineStats()
        self.on_step: list[Callable[[float, int, int], None]] = []  # (seconds, rows, padded frames a row) after every step
        self.on_failure: list[Callable[[EngineFailed], None]] = []  # on the event loop, once, when the worker dies
        self.failure: EngineFailed | None = None  # set when the worker died
        self._keep = keep_step_times
        self._pending: dict[str, deque[tuple[object, asyncio.Future, Encode | None]]] = {}
        self._wake = threading.Event()  # set by the loop: chunks are pending, or slots wait to be zeroed
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle_work_queued = False
        self._held: dict[str, asyncio.Future] = {}  # the running decode's chunk futures, by stream (worker-owned)
        # On the worker, before each decode and between its steps: graph captures while serving
        # (engine/warmup.py). ``warmup``: started and stopped with the engine.
        self.between_steps: list[Callable[[], None]] = []
        self.warmup: Any = None
        self._out: list[tuple[asyncio.Future, Any]] = []  # results handed over by the worker, not yet settled on the loop
        self._out_lock = threading.Lock()
        self._out_posted = False  # a _resolve_all is scheduled on the loop

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._thread is None:
            self._loop = asyncio.get_running_loop()
            self._stopping = False
            self.engine.on_step.append(self._on_step)
            self._thread = threading.Thread(target=self._work, name="code2wav-step", daemon=True)
            self._thread.start()
            if self.warmup is not None:
                self.warmup.start()

    async def stop(self) -> None:
        for rid in list(self._pending):  # streams still open are aborted (their chunks fail), their state freed
            await self.abort(rid, StreamError("shutdown", f"stream {rid!r}: engine stopped"))
        if self.warmup is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.warmup.stop)
        if self._thread is not None:
            self._stopping = True
            self._wake.set()
            # A decode still running ends (nothing left to take); joined off the loop, which it may still call back
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
            self._thread = None
            self.engine.on_step.remove(self._on_step)

    async def __aenter__(self) -> "AsyncEngine":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def open(self, request_id: str, prefix: object = None, pcm16: bool = False) -> None:
        """Open a stream: validates the prefix, looks it up in the prefix cache and takes a slot
        (host work, at once, even while a step runs; where a prefix's state goes in: docs/design.md,
        Prefill). ``pcm16``: its audio comes as int16 samples (``Lifecycle.open``)."""
        if self.failure is not None:
            raise EngineFailed(str(self.failure))
        try:
            self.engine.open(request_id, prefix, pcm16=pcm16)
        except Exception as e:
            self.stats.record_error(getattr(e, "code", type(e).__name__))
            raise
        self._pending[request_id] = deque()
        if prefix is not None:  # a cached prefix's state goes in now, not on the first packet
            self._idle_work_later()

    async def push(self, request_id: str, frames: object, encode: Encode | None = None) -> Any:
        """Queue new frames; their audio (or ``encode(audio)``) once their step completes."""
        return await self.submit(request_id, frames, encode)

    def submit(self, request_id: str, frames: object, encode: Encode | None = None) -> asyncio.Future:
        """As :meth:`push`, without a coroutine: queues the chunk now (or raises) and returns the
        future of its result. Cancelling the future drops the chunk if its step has not begun."""
        if self.failure is not None:
            raise EngineFailed(str(self.failure))
        q = self._pending.get(request_id)
        if q is None:
            self.engine.require(request_id)  # raises the precise error (unknown / ended)
            raise StreamError("unknown_request_id", f"no open stream {request_id!r}")
        if len(q) >= self.max_pending_chunks:
            self.stats.record_error("queue_full")
            raise Backpressure(f"stream {request_id!r} has {len(q)} chunks in flight (limit {self.max_pending_chunks})")
        if self._thread is None:
            raise StreamError("not_started", "the engine is not running (use `async with AsyncEngine(...)` or start())")
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        q.append((frames, fut, encode))
        if not self._wake.is_set():  # set already: the worker clears it before it takes, so it sees this chunk
            self._wake.set()
        return fut

    async def finish(self, request_id: str, frames: object = None) -> Tensor:
        """Decode the last frames (if any), wait for every queued chunk, free the stream."""
        audio = torch.zeros(0)
        try:
            if frames is not None and len(frames) > 0:  # type: ignore[arg-type]
                audio = await self.push(request_id, frames)
            else:
                q = self._pending.get(request_id)
                if q:
                    await asyncio.gather(*(f for _, f, _ in q), return_exceptions=True)
        finally:
            if self._pending.pop(request_id, None) is not None:
                self._free(request_id, True, self.engine.finish)  # no frames left: nothing to decode
                self._idle_work_later()
        return audio

    async def abort(self, request_id: str, error: StreamError | None = None) -> None:
        """Drop queued chunks and free the state now (e.g. the client disconnected). A chunk of
        the stream that a running decode holds still decodes; its result is dropped. Queued
        chunks fail with ``error`` (default: ``aborted``); with an ``error`` given, the chunk
        the running decode holds fails with it at once too (a drain that ends a request)."""
        known = request_id in self._pending
        if known:
            self._fail_pending(request_id, error or StreamError("aborted", f"stream {request_id!r} aborted"))
            del self._pending[request_id]
        held = self._held.get(request_id) if error is not None else None
        if held is not None:
            self._settle(held, error)  # type: ignore[arg-type]
        self._free(request_id, known, self.engine.abort)
        self._idle_work_later()

    def _free(self, request_id: str, known: bool, end: Callable[[str], object]) -> None:
        """End the stream in the core (``end``: its abort or finish). One opened here (``known``) the
        core may have ended on its own, even just now (reaped, a failed prefill): nothing left to free."""
        try:
            end(request_id)
        except StreamError:
            if not known:
                raise

    def wake(self) -> None:
        """Wake the worker (from any thread): ``between_steps`` has work."""
        self._wake.set()

    def _between(self) -> None:
        for hook in self.between_steps:
            hook()

    @property
    def streams(self) -> list[str]:
        """The ids of the streams open on this engine."""
        return list(self._pending)

    def _idle_work_later(self) -> None:
        """Zero freed slots and restore cached prefixes of streams just opened, on the worker,
        off the next first packets: one request at a time (a continuous decode may run for as
        long as the load lasts; its admissions do both too)."""
        if not self._idle_work_queued:
            self._idle_work_queued = True
            self._wake.set()

    def _fail_pending(self, rid: str, err: Exception) -> None:
        for _, fut, _ in self._pending.get(rid, ()):
            self._settle(fut, err)

    @staticmethod
    def _settle(fut: asyncio.Future, err: Exception) -> None:
        """Fail a chunk's future (on the loop) unless it is settled already."""
        if not fut.done():
            fut.set_exception(err)
            fut.exception()  # mark retrieved: an abandoned chunk is not an unhandled error

    # -- scheduler --------------------------------------------------------------------------------

    def _take(self, in_flight: set[str], futures: dict[str, asyncio.Future], encoders: dict[str, Encode]) -> dict[str, object]:
        """The oldest pending chunk of every stream with none in flight (on the worker: deque
        ends are thread-safe, the dict is copied)."""
        batch: dict[str, object] = {}
        for rid, q in list(self._pending.items()):
            if rid in in_flight:
                continue
            while q and q[0][1].done():  # cancelled by its caller
                q.popleft()
            if q:
                frames, fut, encode = q.popleft()
                batch[rid], futures[rid] = frames, fut
                in_flight.add(rid)
                if encode is not None:
                    encoders[rid] = encode
        return batch

    def _on_step(self, seconds: float, rows: int, frames: int) -> None:  # on the worker, after each step
        self.stats.steps += 1
        self.stats.rows += rows
        if len(self.stats.step_seconds) < self._keep:
            self.stats.step_seconds.append(seconds)
        for hook in self.on_step:
            hook(seconds, rows, frames)

    def _work(self) -> None:
        """The worker thread's body: :meth:`_steps`; whatever ends it but ``stop()`` fails the engine."""
        try:
            # Nothing on this thread wants autograd: off for its life (grad mode is per thread),
            # so a decode does not enter and leave a no_grad context of its own.
            torch.set_grad_enabled(False)
            self._steps()
        except BaseException as e:  # every failure, SystemExit and the like included: the thread ends here
            self._died(e)

    def _died(self, e: BaseException) -> None:
        """On the dying worker: mark the engine failed at once (later submits raise), then fail
        everything on the event loop."""
        err = EngineFailed(f"the engine's worker failed ({type(e).__name__}: {e}); nothing more is decoded")
        err.__cause__ = e
        self.failure = err
        log.critical("the engine's worker thread failed; the engine is failed", exc_info=e)
        held = list(self._held.values())
        try:
            self._loop.call_soon_threadsafe(self._fail_all, err, held)  # type: ignore[union-attr]
        except RuntimeError:  # the loop is closed: nobody is left to tell
            pass

    def _fail_all(self, err: EngineFailed, held: list[asyncio.Future]) -> None:
        """On the loop, once the worker died: fail every chunk, abort every stream, run ``on_failure``."""
        self.failure = err
        self.stats.record_error(err.code)
        for fut in held:
            self._settle(fut, err)
        for rid in list(self._pending):
            self._fail_pending(rid, err)
            self._pending.pop(rid, None)
            try:
                self.engine.abort(rid)  # host bookkeeping: frees the slot
            except Exception:  # ended meanwhile (a reaper): nothing to free
                pass
        for hook in list(self.on_failure):
            try:
                hook(err)
            except Exception:  # one hook's fault must not hide the failure from the others
                log.exception("an on_failure hook failed")

    def _steps(self) -> None:
        """The worker loop: sleeps until a push (or a freed slot) wakes it, then runs one
        continuous decode over every stream with a chunk pending, until none is left."""
        assert self._loop is not None
        spf = self.engine.cfg.samples_per_frame
        while True:
            self._wake.wait()
            self._wake.clear()  # before taking: a push after this point sets it again
            if self._stopping:
                return
            self._between()
            if self._idle_work_queued:
                self._idle_work_queued = False
                try:
                    self.engine.zero_released()
                    self.engine.restore_opened()
                except Exception:  # a device failure: the next admission does it (or fails its rows)
                    pass
            if self.batch_wait_s > 0:
                time.sleep(self.batch_wait_s)
            # Each entry leaves as its row is handed over.
            in_flight: set[str] = set()
            futures: dict[str, asyncio.Future] = {}
            self._held = futures
            encoders: dict[str, Encode] = {}
            batch = self._take(in_flight, futures, encoders)
            if not batch:
                continue

            def on_ready(rid: str, res: Any, in_flight=in_flight, futures=futures, encoders=encoders) -> None:
                fut, encode = futures.pop(rid, None), encoders.pop(rid, None)
                in_flight.discard(rid)
                if fut is None:
                    return
                if isinstance(res, Tensor):
                    self.stats.chunks += 1
                    self.stats.frames += res.numel() // spf
                    if encode is not None:
                        try:
                            res = encode(res)
                        except Exception as e:  # fails this row alone
                            res = e
                self._hand_over(fut, res)

            def more(in_flight=in_flight, futures=futures, encoders=encoders) -> dict[str, object]:
                self._between()
                return self._take(in_flight, futures, encoders)

            try:
                self.engine.decode(batch, on_ready, more)
            except Exception as e:  # a device failure fails the rows still held, not the worker
                for fut in list(futures.values()):
                    self._hand_over(fut, e)
            if any(self._pending.values()):  # e.g. chunks of a stream whose row was in flight
                self._wake.set()

    def _hand_over(self, fut: asyncio.Future, res: Any) -> None:
        """On the worker: queue a chunk's result for the loop. One loop wake-up carries every
        result queued until the loop runs it (a step's rows land together), instead of one
        ``call_soon_threadsafe`` (a self-pipe write, a loop iteration) per row."""
        with self._out_lock:
            self._out.append((fut, res))
            if self._out_posted:
                return
            self._out_posted = True
        try:
            self._loop.call_soon_threadsafe(self._resolve_all)  # type: ignore[union-attr]
        except RuntimeError:  # the loop is closed: nobody is left to tell
            pass

    def _resolve_all(self) -> None:
        """On the loop: settle every result handed over since the last call."""
        with self._out_lock:
            out, self._out = self._out, []
            self._out_posted = False
        for fut, res in out:
            self._resolve(fut, res)

    def _resolve(self, fut: asyncio.Future, res: Any) -> None:
        """Settle a chunk's future once (a cancelled or already settled one is left alone)."""
        if fut.done():
            return
        if isinstance(res, Exception):
            self.stats.record_error(getattr(res, "code", type(res).__name__))
            fut.set_exception(res)
        else:
            fut.set_result(res)
