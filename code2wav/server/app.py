"""The HTTP + WebSocket service over an :class:`AsyncEngine` (protocol: ``docs/protocol.md``).

``create_app(engine, api_key, limits)`` returns a FastAPI app. The app starts the engine's
scheduler when it starts and stops it (aborting open streams) when it stops. This module only
wires the pieces: the endpoints are in ``http`` (``POST /v1/decode``) and ``ws``
(``/v1/stream``), the error codes and limits in ``protocol``, the engine behind ``service``, the
drain's and the failure's front door in ``gate``; ``run`` serves it (SIGTERM drains it).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from code2wav.engine.async_engine import AsyncEngine
from code2wav.server.gate import StopGate
from code2wav.server.http import DECODE_ROUTE, decode_endpoint
from code2wav.server.metrics import _Metrics
from code2wav.server.protocol import HTTP_STATUS, RETRY_AFTER, Limits, ServiceError, error_body, framework_error, validation_error
from code2wav.server.service import Service
from code2wav.server.ws import stream_endpoint

__all__ = ["Limits", "create_app"]


def create_app(engine: AsyncEngine, api_key: str | None = None, limits: Limits | None = None) -> FastAPI:
    limits = limits or Limits()
    service = Service(engine)
    metrics = _Metrics(service)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(title="code2wav", lifespan=lifespan)
    app.state.engine, app.state.limits, app.state.metrics, app.state.service = engine, limits, metrics, service

    def authorized(header: str | None) -> bool:
        """``Authorization: Bearer KEY``, the scheme in any case (RFC 7235)."""
        if api_key is None:
            return True
        scheme, _, token = (header or "").strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(token.strip().encode(), api_key.encode())

    def check_auth(request: Request) -> None:
        if not authorized(request.headers.get("authorization")):
            raise ServiceError("unauthorized", "missing or wrong bearer token")

    # Every failure answers the protocol's error body: ours, FastAPI's parameter checks (422),
    # Starlette's unknown route / wrong method (404 / 405) and any unexpected exception (500).
    def error_response(e: ServiceError, headers: Mapping[str, str] | None = None) -> JSONResponse:
        metrics.errors.labels(e.code).inc()
        headers = dict(headers or {})
        if e.code in RETRY_AFTER:
            headers["Retry-After"] = str(limits.retry_after_s)
        if e.code == "unauthorized":
            headers["WWW-Authenticate"] = "Bearer"
        return JSONResponse(error_body(e.code, e.message), status_code=HTTP_STATUS.get(e.code, 500), headers=headers)

    @app.exception_handler(ServiceError)
    async def _on_service_error(request: Request, e: ServiceError):
        return error_response(e)

    @app.exception_handler(RequestValidationError)
    async def _on_bad_parameters(request: Request, e: RequestValidationError):
        return error_response(validation_error(e.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _on_http_error(request: Request, e: StarletteHTTPException):
        return error_response(framework_error(e.status_code, e.detail), e.headers)

    @app.exception_handler(Exception)
    async def _on_internal(request: Request, e: Exception):  # logged with its traceback by the server as well
        return error_response(ServiceError("internal", f"internal error ({type(e).__name__})"))

    @app.get("/health")
    async def health():
        status, body = service.health()  # 503 while draining or failed
        return JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def prometheus(request: Request):
        check_auth(request)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    app.post("/v1/decode", **DECODE_ROUTE)(decode_endpoint(service, limits, metrics, check_auth))
    # Middleware added later wraps the earlier: the token gate, then the stop gate (it counts
    # each connection, a drain waits for them), then the stream route.
    app.add_middleware(_StreamRoute, path="/v1/stream", endpoint=stream_endpoint(service, limits, metrics, authorized))
    app.add_middleware(StopGate, service=service, metrics=metrics, retry_after_s=limits.retry_after_s)
    if api_key is not None:
        app.add_middleware(_TokenGate, authorized=authorized, on_refusal=lambda: metrics.errors.labels("unauthorized").inc())
    return app


class _StreamRoute:
    """The WebSocket endpoint, dispatched in front of FastAPI's routing: a ``/v1/stream``
    connection goes straight to its session. FastAPI's per-request layers (exception handling,
    its exit stack, the router) ran once per connection and did nothing for a WebSocket that the
    session does not do itself (it answers every error with the protocol's message and close
    code). What they cost a short stream: BENCHMARKS.md, "The service"."""

    def __init__(self, app: ASGIApp, path: str, endpoint: Callable[[WebSocket], Awaitable[None]]):
        self.app, self.path, self.endpoint = app, path, endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and scope["path"] == self.path:
            await self.endpoint(WebSocket(scope, receive, send))
            return
        await self.app(scope, receive, send)


class _TokenGate:
    """With an API key, refuses every HTTP request but ``/health`` that lacks the token, before
    routing: so before FastAPI validates a query (401, not 422), before a 404 or 405, and over
    the OpenAPI pages (``/docs``, ``/redoc``, ``/openapi.json``) too. WebSocket handshakes pass:
    the session refuses them with the protocol's ``unauthorized`` message and close 1008."""

    def __init__(self, app: ASGIApp, authorized: Callable[[str | None], bool], on_refusal: Callable[[], None]):
        self.app, self.authorized, self.on_refusal = app, authorized, on_refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health" and not self.authorized(Headers(scope=scope).get("authorization")):
            self.on_refusal()
            refusal = JSONResponse(error_body("unauthorized", "missing or wrong bearer token"), status_code=HTTP_STATUS["unauthorized"],
                                   headers={"WWW-Authenticate": "Bearer"})
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)
