"""The transport's bounds on slow, idle and non-reading clients, and the uvicorn settings that
carry them (``uvicorn_settings``; documented in ``docs/protocol.md``, "Connections").

uvicorn bounds an idle keep-alive connection (``timeout_keep_alive``) and the number of
connections (``limit_concurrency``), but it waits for a request's headers and body without a
deadline, and a client that stops reading blocks the server's writes to it for as long as the
client stays. Two mixins over the protocol classes uvicorn would pick itself add the missing
bounds:

- ``_ReadDeadline`` (HTTP, ``Limits.read_timeout``): a request must arrive whole within the bound;
- ``_SendDeadline`` (HTTP and WebSocket, ``Limits.send_timeout``): a connection whose writes stay
  blocked for the bound is dropped, which fails its pending sends at once, so its stream ends
  and frees its slot.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol
from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol

from code2wav.server.protocol import Limits, error_body, log

__all__ = ["uvicorn_settings"]


class _SendDeadline:
    """Drops the connection once its writes have been blocked for ``send_timeout`` seconds
    without a break: the transport paused writing (its buffer is over the high-water mark)
    because the client does not read. ``abort``, not ``close``: a close waits for the buffer to
    drain, which it never will, and the connection would stay open as long as the client."""

    send_timeout: float | None = None
    _send_timer: asyncio.TimerHandle | None = None
    transport: asyncio.Transport

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self.send_timeout and self._send_timer is None:
            self._send_timer = asyncio.get_running_loop().call_later(self.send_timeout, self._send_timed_out)

    def resume_writing(self) -> None:
        self._cancel_send_deadline()
        super().resume_writing()  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_send_deadline()
        super().connection_lost(exc)  # type: ignore[misc]

    def _cancel_send_deadline(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_timed_out(self) -> None:
        self._send_timer = None
        log.warning("dropping the connection of %s: its writes were blocked for %g s, its client not reading (--send-timeout)",
                    self.transport.get_extra_info("peername"), self.send_timeout)
        self.transport.abort()


class _ReadDeadline:
    """A request must arrive whole (headers and body) within ``read_timeout`` seconds of the
    connection opening, or, on a kept-alive connection, of the request's first byte (the wait
    before that byte is ``timeout_keep_alive``'s). Otherwise the server closes the connection,
    first answering 408 ``request_timeout`` if the client sent part of a request and no
    response has begun (a connection that sent nothing, as a browser's preconnect, is closed
    quietly). The clock restarts while the server itself holds off reading a body (the app is
    not ready for more of it): that wait is not the client's."""

    read_timeout: float | None = None
    _read_timer: asyncio.TimerHandle | None = None
    _upgraded = False
    _bytes_seen = False
    transport: asyncio.Transport
    cycle: Any  # uvicorn's RequestResponseCycle of the current (or last) request; None before the first
    flow: Any  # uvicorn's FlowControl

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_read_deadline()

    def data_received(self, data: bytes) -> None:
        self._bytes_seen = True
        super().data_received(data)  # type: ignore[misc]
        if self._upgraded:
            return
        if self._request_arrived():
            self._cancel_read_deadline()
        elif self._read_timer is None:
            self._arm_read_deadline()  # the first bytes of a next request on a kept-alive connection

    def handle_websocket_upgrade(self, *args: Any) -> None:
        # The connection is the WebSocket protocol's from here (its bounds: --idle-timeout, --send-timeout).
        self._upgraded = True
        self._cancel_read_deadline()
        self._cancel_send_deadline()  # type: ignore[attr-defined]
        super().handle_websocket_upgrade(*args)  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_read_deadline()
        super().connection_lost(exc)  # type: ignore[misc]

    def _request_arrived(self) -> bool:
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete and not cycle.more_body

    def _arm_read_deadline(self) -> None:
        if self.read_timeout:
            self._read_timer = asyncio.get_running_loop().call_later(self.read_timeout, self._read_timed_out)

    def _cancel_read_deadline(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self._upgraded or self.transport.is_closing() or self._request_arrived():
            return
        cycle = self.cycle
        in_body = cycle is not None and not cycle.response_complete
        if in_body and self.flow.read_paused:
            self._arm_read_deadline()
            return
        log.info("closing the connection of %s: no whole request within %g s (--read-timeout)",
                 self.transport.get_extra_info("peername"), self.read_timeout)
        if self._bytes_seen and not (in_body and cycle.response_started):
            self.transport.write(_timeout_response(self.read_timeout))  # the app writes nothing after: the connection is gone
        self.transport.close()


def _timeout_response(seconds: float | None) -> bytes:
    body = json.dumps(error_body("request_timeout", f"the request did not arrive whole within {seconds:g} s")).encode()
    head = f"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    return head.encode() + body


def ws_protocol(name: str = "auto") -> type | None:
    """uvicorn's WebSocket protocol class called ``name`` (its ``--ws`` names: ``auto``,
    ``websockets-sansio``, ``websockets``, ``wsproto``); None for ``auto`` without a library."""
    if name == "auto":
        return AutoWebSocketsProtocol  # type: ignore[return-value]
    if name == "websockets-sansio":
        from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

        return WebSocketsSansIOProtocol
    if name == "websockets":
        from uvicorn.protocols.websockets.websockets_impl import WebSocketProtocol

        return WebSocketProtocol
    if name == "wsproto":
        from uvicorn.protocols.websockets.wsproto_impl import WSProtocol

        return WSProtocol
    raise ValueError(f"unknown WebSocket implementation {name!r}")


def uvicorn_settings(limits: Limits, ws: str = "auto") -> dict[str, Any]:
    """``uvicorn.run`` keyword arguments for ``limits``' transport bounds; ``ws``: the WebSocket
    implementation (``ws_protocol``)."""
    http = type("BoundedHTTPProtocol", (_ReadDeadline, _SendDeadline, AutoHTTPProtocol),
                {"read_timeout": limits.read_timeout, "send_timeout": limits.send_timeout})
    settings: dict[str, Any] = {
        "http": http,
        "limit_concurrency": limits.max_connections,
        "timeout_keep_alive": limits.keep_alive_timeout,
        "ws_ping_interval": limits.ws_ping_interval,
        "ws_ping_timeout": limits.ws_ping_timeout,
    }
    proto = ws_protocol(ws)
    if proto is not None:  # None: no WebSocket library installed (uvicorn then refuses upgrades)
        settings["ws"] = type("BoundedWebSocketProtocol", (_SendDeadline, proto), {"send_timeout": limits.send_timeout})
    return settings
