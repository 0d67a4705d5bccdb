"""The service's front door once it stops taking work: a pure ASGI middleware in front of every
route. While the service is ok it only counts the requests (and WebSocket connections) in
flight, which a drain waits for (``/health`` and ``/metrics`` are not counted). Once it drains (SIGTERM) or failed (the engine's worker died),
a new HTTP request is answered at once with that error (``shutdown`` or ``engine_failed``, 503
with ``Retry-After``), its body unread; ``/health`` and ``/metrics`` still answer, so a probe sees
the state and a scrape the last figures. A WebSocket goes on to its endpoint, which ends it with
the error message and its close code (``ws.stream_endpoint``)."""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from code2wav.server.metrics import _Metrics
from code2wav.server.protocol import HTTP_STATUS, RETRY_AFTER, error_body
from code2wav.server.service import Service

OPEN_PATHS = ("/health", "/metrics")  # answered in every state


class StopGate:
    def __init__(self, app: ASGIApp, service: Service, metrics: _Metrics, retry_after_s: int):
        self.app, self.service, self.metrics, self.retry_after_s = app, service, metrics, retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("path") in OPEN_PATHS:  # lifespan, probes, scrapes
            await self.app(scope, receive, send)
            return
        err = self.service.stop_error
        if err is not None and scope["type"] == "http":
            self.metrics.errors.labels(err.code).inc()
            headers = {"Retry-After": str(self.retry_after_s)} if err.code in RETRY_AFTER else {}
            await JSONResponse(error_body(err.code, err.message), status_code=HTTP_STATUS.get(err.code, 500), headers=headers)(scope, receive, send)
            return
        with self.service.request():
            await self.app(scope, receive, send)
