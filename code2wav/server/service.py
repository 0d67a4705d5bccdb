"""The service's one view of the engine: :class:`Service` wraps an :class:`AsyncEngine`.

Nothing else in ``code2wav.server`` touches the engine, so a change of the engine's internals
(the wrapped stream engine, its pool, its runner) is a change here alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from code2wav.engine.async_engine import AsyncEngine, Encode, EngineStats
from code2wav.server.protocol import log, service_error
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

    # -- streams ------------------------------------------------------------------------------

    async def open(self, rid: str, prefix: object) -> None:
        """Open a stream; a refusal raises its :class:`ServiceError`."""
        try:
            await self._engine.open(rid, prefix)
        except BaseException as e:
            if isinstance(e, asyncio.CancelledError):
                raise
            raise service_error(e) from None

    def submit(self, rid: str, frames: object, encode: Encode | None = None) -> asyncio.Future:
        """Queue a chunk now (or raise); the future resolves to its audio, or ``encode(audio)``."""
        return self._engine.submit(rid, frames, encode)

    async def push(self, rid: str, frames: object, encode: Encode | None = None) -> Any:
        return await self._engine.push(rid, frames, encode)

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

    def on_step(self, hook: StepHook) -> None:
        """Call ``hook`` on the engine's worker after every step."""
        self._engine.on_step.append(hook)
