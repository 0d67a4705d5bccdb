"""The wire protocol's code side (mirrors ``docs/protocol.md``): error codes and their WebSocket
close codes and HTTP statuses, the service's limits, and the mapping of engine and validation
exceptions onto the protocol's errors.

Every error a client sees is ``{"type": "error", "code": <machine code>, "message": <human>}``:
on the WebSocket it is followed by a close with the code's close code (``WS_CLOSE``); over HTTP
it is the body of a response with the code's status (``HTTP_STATUS``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from code2wav.codes import CodesError
from code2wav.stream.pool import PoolFull
from code2wav.stream.rows import StreamError

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
    "engine_failed": 1011,
    "internal": 1011,
}
# Machine code -> HTTP status. Codes not listed answer 500.
HTTP_STATUS = {
    "unauthorized": 401,
    "bad_json": 400,
    "bad_message": 400,
    "bad_query": 400,
    "bad_format": 400,
    "bad_npy": 400,
    "bad_shape": 400,
    "bad_dtype": 400,
    "out_of_range": 400,
    "empty": 400,
    "bad_padding": 400,
    "unsupported_media_type": 415,
    "not_found": 404,
    "method_not_allowed": 405,
    "body_too_big": 413,
    "request_timeout": 408,
    "too_many_frames": 413,
    "prefix_too_long": 413,
    "pool_full": 503,
    "queue_full": 503,
    "busy": 503,
    "shutdown": 503,
    "prefill_failed": 500,
    "non_finite_audio": 500,
    "engine_failed": 503,
    "internal": 500,
}
# Codes whose HTTP answer carries ``Retry-After: Limits.retry_after_s`` (the same request may
# succeed later: a slot frees, the queue drains, or a restarted server answers).
RETRY_AFTER = ("pool_full", "queue_full", "busy", "shutdown", "engine_failed")
# HTTP statuses the framework itself answers (an unknown route, a wrong method) -> machine code.
FRAMEWORK_STATUS = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 413: "body_too_big", 415: "unsupported_media_type"}
# Request ids are the client's; keep them printable and short.
MAX_REQUEST_ID_CHARS = 256


@dataclass
class Limits:
    max_message_bytes: int = 1 << 20  # one WebSocket message (JSON text or binary frames)
    max_stream_frames: int = 45_000  # frames one stream may push (1 hour of audio)
    max_body_bytes: int = 16 << 20  # one POST /v1/decode body
    idle_timeout: float | None = 30.0  # seconds without a client message while nothing is in flight
    http_chunk_frames: int = 25  # POST /v1/decode feeds the engine in chunks of this many frames
    max_http_requests: int = 64  # POST /v1/decode requests in progress at once; more are refused (busy)
    retry_after_s: int = 1  # Retry-After on 503
    # The transport's bounds (server/connections.py; uvicorn has no read deadline of its own).
    # None: no bound.
    read_timeout: float | None = 30.0  # seconds for a whole request (headers and body) to arrive
    send_timeout: float | None = 20.0  # seconds a connection's writes may stay blocked (its client not reading)
    keep_alive_timeout: float = 5.0  # seconds an idle HTTP keep-alive connection stays open
    max_connections: int | None = 1024  # open connections and requests in progress; past it, HTTP 503
    ws_ping_interval: float | None = 20.0  # a WebSocket ping every this many seconds...
    ws_ping_timeout: float | None = 20.0  # ...and the connection dropped if its pong is this late


class ServiceError(Exception):
    """An error the client is told about: ``code`` is one of the protocol's machine codes."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class Disconnected(Exception):
    """The WebSocket client went away."""


def service_error(e: BaseException) -> ServiceError:
    """Map engine/validation exceptions onto the protocol's codes."""
    if isinstance(e, ServiceError):
        return e
    if isinstance(e, PoolFull):
        return ServiceError("pool_full", f"{e}; retry later")
    if isinstance(e, (StreamError, CodesError)):
        return ServiceError(e.code, str(e))
    log.exception("internal error", exc_info=e)
    return ServiceError("internal", f"internal error ({type(e).__name__})")


def framework_error(status: int, detail: object) -> ServiceError:
    """The protocol's error for an HTTP error the framework raised (404 for an unknown route, ...)."""
    code = FRAMEWORK_STATUS.get(status, "internal" if status >= 500 else "bad_message")
    return ServiceError(code, str(detail))


def validation_error(errors: Sequence[Any]) -> ServiceError:
    """The protocol's error for request parameters FastAPI refused (its first error)."""
    err = errors[0] if errors else {}
    loc = tuple(err.get("loc", ()))
    name = ".".join(str(x) for x in loc[1:]) or "request"
    if loc[-1:] == ("format",):
        return ServiceError("bad_format", f"format {err.get('input')!r}: {err.get('msg', 'invalid')}")
    return ServiceError("bad_query" if loc[:1] == ("query",) else "bad_message", f"{name}={err.get('input')!r}: {err.get('msg', 'invalid')}")


def error_body(code: str, message: str) -> dict:
    """The JSON body of every error, on both endpoints."""
    return {"type": "error", "code": code, "message": message}
