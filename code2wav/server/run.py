"""Running the app under uvicorn, with the service's shutdown (``code2wav serve`` calls
:func:`serve`).

SIGTERM (or Ctrl+C) starts a bounded drain instead of uvicorn's own shutdown, which stops
accepting connections at once and then waits for work in flight without bound. During the drain
the server keeps listening: new requests get ``503 shutdown`` (``gate``), every WebSocket stream
gets the ``shutdown`` error and close 1012 (``ws``), ``/health`` answers 503, and requests in flight
may finish for up to ``shutdown_timeout`` seconds; those still decoding then end with
``shutdown`` (``Service.drain``). Then uvicorn shuts down (``CLOSE_GRACE_S`` for the last answers)
and the process exits 0. A second signal stops at once (exit 1).

If the engine fails (its worker thread died), the same drain runs at once (everything in flight
has failed with ``engine_failed`` already) and the process exits with ``EXIT_ENGINE_FAILED``, so a
supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import importlib.util
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.config import STARTUP_FAILURE

from code2wav.server.protocol import ServiceError, log
from code2wav.server.service import Service

EXIT_ENGINE_FAILED = 70  # EX_SOFTWARE (sysexits.h): an internal software error
EXIT_FORCED = 1  # a second signal cut the drain short
# After the drain: how long uvicorn waits for the last answers to be written and connections to
# close before it cancels their tasks (its timeout_graceful_shutdown).
CLOSE_GRACE_S = 1.0


class _Server(uvicorn.Server):
    """uvicorn's server, its signal handling replaced by the service's drain."""

    def __init__(self, config: uvicorn.Config, service: Service, shutdown_timeout: float):
        super().__init__(config)
        self.service, self.shutdown_timeout = service, shutdown_timeout
        self.exit_code = 0
        self._stop_requested = False
        self._drain: asyncio.Task | None = None
        service.on_fatal(self._on_fatal)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Runs as a signal handler: it only sets flags, on_tick acts on them. Not uvicorn's own:
        # it stops accepting at once, and re-raises the signal after the shutdown, which would
        # end the process by the signal rather than with exit status 0.
        if self._stop_requested:
            self.exit_code = self.exit_code or EXIT_FORCED
            self.should_exit = self.force_exit = True
        self._stop_requested = True

    def _on_fatal(self, err: ServiceError) -> None:
        log.critical("%s", err.message)
        self.exit_code = EXIT_ENGINE_FAILED
        self._stop_requested = True

    async def on_tick(self, counter: int) -> bool:  # uvicorn's main loop calls it every 0.1 s
        if self._stop_requested and self._drain is None:
            self._drain = asyncio.create_task(self._drain_then_exit())
        return await super().on_tick(counter)

    async def _drain_then_exit(self) -> None:
        state = self.service.state
        log.info("draining (%s): %d requests in flight, up to %s s", "engine failed" if state == "failed" else "shutdown",
                    self.service.requests_in_flight, self.shutdown_timeout)
        if not await self.service.drain(self.shutdown_timeout):
            log.warning("shutdown: requests still in flight after %s s were ended", self.shutdown_timeout)
        self.should_exit = True


LOOPS = ("auto", "asyncio", "uvloop")  # serve --loop


def pick_loop(name: str = "auto") -> str:
    """The event loop ``serve --loop NAME`` runs: ``auto`` is uvloop where it is installed (the
    serve extra installs it; its C loop and transports cost the loop thread less per message),
    else asyncio's own; ``uvloop`` without it installed is a ``ValueError``."""
    if name not in LOOPS:
        raise ValueError(f"unknown event loop {name!r}: expected one of {', '.join(LOOPS)}")
    if name == "asyncio":
        return name
    have = importlib.util.find_spec("uvloop") is not None
    if name == "uvloop" and not have:
        raise ValueError("--loop uvloop: uvloop is not installed (pip install 'code2wav[serve]', or --loop asyncio)")
    return "uvloop" if have else "asyncio"


def http_parser() -> str:
    """The HTTP parser uvicorn picks by itself: httptools where it is installed, else h11."""
    return "httptools" if importlib.util.find_spec("httptools") is not None else "h11"


def serve(app: FastAPI, host: str, port: int, shutdown_timeout: float, ws_max_size: int, log_level: str = "info",
          transport: dict[str, Any] | None = None, loop: str = "auto") -> int:
    """Serve ``app`` (from ``create_app``) until a signal (drained: 0) or an engine failure
    (``EXIT_ENGINE_FAILED``); returns the process's exit status. ``shutdown_timeout``: seconds
    requests in flight may go on after the signal (``serve --shutdown-timeout``); ``ws_max_size``:
    the largest WebSocket message the transport takes (larger ones close it with 1009);
    ``transport``: uvicorn's protocol classes and connection bounds (``connections.uvicorn_settings``);
    ``loop``: the event loop (``pick_loop``)."""
    # No permessage-deflate: PCM barely compresses, and zlib on the event loop caps the
    # service's audio rate far below what the GPU steps make (BENCHMARKS.md, the service).
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, ws_max_size=ws_max_size, ws_per_message_deflate=False,
                            timeout_graceful_shutdown=CLOSE_GRACE_S, loop=pick_loop(loop), **(transport or {}))
    server = _Server(config, app.state.service, shutdown_timeout)
    server.run()
    return server.exit_code if server.started else STARTUP_FAILURE
