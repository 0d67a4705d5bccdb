"""The WebSocket client side of ``/v1/stream``: :class:`Stream` (sync) and :class:`AsyncStream`
(asyncio), through the ``websockets`` package (imported when a stream connects)."""

from __future__ import annotations

import json

import numpy as np

from code2wav.client.common import SAMPLE_DTYPES, ServerError, _codes_list, _headers, frames_bytes


def _ws_url(base: str) -> str:
    base = base.rstrip("/")
    if base.startswith("https://"):
        return "wss://" + base[len("https://") :] + "/v1/stream"
    if base.startswith("http://"):
        return "ws://" + base[len("http://") :] + "/v1/stream"
    return base + "/v1/stream"


def _error_from_text(text: str) -> ServerError | None:
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if isinstance(obj, dict) and obj.get("type") == "error":
        return ServerError(obj.get("code", "?"), obj.get("message", ""))
    return None


async def _connect(url: str, api_key: str | None, open_timeout: float):
    """An asyncio WebSocket connection to ``/v1/stream``: no compression, no message size cap."""
    from websockets.asyncio.client import connect

    return await connect(url, additional_headers=_headers(api_key), open_timeout=open_timeout, max_size=None, compression=None)


async def _close_quietly(ws) -> None:
    """Close ``ws`` (if any); one the server closed or the network dropped is closed already."""
    from websockets.exceptions import ConnectionClosed

    if ws is not None:
        try:
            await ws.close()
        except (ConnectionClosed, OSError):
            pass


def _closed_error(e) -> ServerError:
    code = e.rcvd.code if e.rcvd else None
    return ServerError("closed", f"connection closed ({code})", close_code=code)


def _is_open(ws) -> bool:
    from websockets.protocol import State

    return ws.state is State.OPEN


class ConnectionPool:
    """An :class:`AsyncClient`'s idle connections, kept for its next streams
    (``AsyncClient(keep_connections=N)``): a stream takes one (or connects), opens with
    ``keep_open``, and gives it back once its ``done`` came; a stream that ends any other way
    closes it. At most ``size`` are kept idle; one the server closed meanwhile (its idle
    timeout, a drain) is dropped, and a stream whose ``open`` fails on a kept connection opens
    once more on a new one. Task-safe within one event loop (nothing awaits between a take and
    its use)."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"keep_connections must be >= 1, got {size}")
        self.size = size
        self.idle: list = []  # open connections between streams, the most recently used last
        self.closed = False

    def take(self):
        """An idle open connection, or None."""
        while self.idle:
            ws = self.idle.pop()
            if _is_open(ws):
                return ws
        return None

    async def give_back(self, ws) -> None:
        if self.closed or len(self.idle) >= self.size or not _is_open(ws):
            await _close_quietly(ws)
        else:
            self.idle.append(ws)

    async def aclose(self) -> None:
        self.closed = True
        idle, self.idle = self.idle, []
        for ws in idle:
            await _close_quietly(ws)


class _StreamProtocol:
    """What the sync and async streams share: the protocol's messages, without the I/O."""

    def __init__(self, url: str, api_key: str | None, request_id: str | None, prefix, format: str, open_timeout: float,
                 connection: "AsyncConnection | None" = None, pool: ConnectionPool | None = None):
        self.url, self.api_key, self.request_id, self.prefix, self.format = url, api_key, request_id, prefix, format
        self.open_timeout = open_timeout
        self.dtype = SAMPLE_DTYPES[format]
        self.connection = connection  # a connection that carries streams one after another (async only)
        self.pool = pool  # or the client's kept connections (async only)
        self.ws = connection.ws if connection is not None else None
        self.opened: dict | None = None
        self.done: dict | None = None

    def _open_messages(self) -> list[str | bytes]:
        """The ``open`` message, and a reference prefix as the binary message after it
        (``prefix_frames``: the server reads its bytes instead of parsing rows of JSON)."""
        msg: dict = {"op": "open", "format": self.format}
        if self.connection is not None or self.pool is not None:
            msg["keep_open"] = True
        if self.request_id is not None:
            msg["request_id"] = self.request_id
        if self.prefix is None:
            return [json.dumps(msg)]
        prefix = np.asarray(self.prefix)
        msg["prefix_frames"] = len(prefix)
        return [json.dumps(msg), frames_bytes(prefix)] if len(prefix) else [json.dumps(msg)]

    def _accept_opened(self, reply: bytes | dict) -> None:
        if not isinstance(reply, dict) or reply.get("type") != "opened":
            raise ServerError("protocol", f"expected opened, got {reply!r}")
        self.opened = reply
        self.request_id = reply["request_id"]

    @staticmethod
    def _push_message(frames, binary: bool) -> bytes | str:
        return frames_bytes(frames) if binary else json.dumps({"op": "push", "frames": _codes_list(frames)})

    def _audio(self, msg: bytes | dict) -> np.ndarray:
        if not isinstance(msg, bytes):
            raise ServerError("protocol", f"expected audio, got {msg!r}")
        return np.frombuffer(msg, dtype=self.dtype)

    def _drained(self, pieces: list[np.ndarray], msg: bytes | dict) -> tuple[np.ndarray, dict] | None:
        """Fold one message read while draining: audio is kept, ``done`` ends the drain with
        (all the audio, the message), anything else is a protocol error."""
        if isinstance(msg, bytes):
            pieces.append(np.frombuffer(msg, dtype=self.dtype))
            return None
        if msg.get("type") == "done":
            self.done = msg
            return (np.concatenate(pieces) if pieces else np.zeros(0, self.dtype)), msg
        raise ServerError("protocol", f"unexpected message {msg!r}")


class Stream(_StreamProtocol):
    """One WebSocket stream (sync). Use as a context manager from :meth:`Client.stream`."""

    def __enter__(self) -> "Stream":
        from websockets.sync.client import connect

        # Entered as a context manager: websockets >= 17 warns on a bare connect().
        self.ws = connect(self.url, additional_headers=_headers(self.api_key), open_timeout=self.open_timeout, max_size=None, compression=None).__enter__()
        try:
            for m in self._open_messages():
                self.send_raw(m)
            self._accept_opened(self.recv())
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        from websockets.exceptions import ConnectionClosed

        if self.ws is not None:
            try:
                self.ws.close()
            except (ConnectionClosed, OSError):
                pass  # closed by the server (after an error) or dropped

    # raw access (tests use it to send malformed messages)
    def send_json(self, obj) -> None:
        self.send_raw(json.dumps(obj))

    def send_raw(self, data: bytes | str) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            self.ws.send(data)
        except ConnectionClosed:
            self.recv(timeout=5)  # the server closed first: surface its error message
            raise

    def recv(self, timeout: float | None = 60) -> bytes | dict:
        """Next message: audio bytes or a JSON dict. An error message raises :class:`ServerError`."""
        from websockets.exceptions import ConnectionClosed

        try:
            msg = self.ws.recv(timeout=timeout)
        except ConnectionClosed as e:
            raise _closed_error(e) from None
        if isinstance(msg, bytes):
            return msg
        err = _error_from_text(msg)
        if err is not None:
            try:
                self.ws.recv(timeout=5)
            except ConnectionClosed as e:
                err.close_code = e.rcvd.code if e.rcvd else None
            except TimeoutError:
                pass
            raise err
        return json.loads(msg)

    def push(self, frames, binary: bool = True) -> None:
        """Send new frames; their audio comes back through :meth:`recv_audio`."""
        self.send_raw(self._push_message(frames, binary))

    def recv_audio(self, timeout: float | None = 60) -> np.ndarray:
        return self._audio(self.recv(timeout))

    def end(self, timeout: float | None = 60) -> tuple[np.ndarray, dict]:
        """Send ``end``; returns (the audio not yet received, the ``done`` message)."""
        self.send_json({"op": "end"})
        pieces: list[np.ndarray] = []
        while (result := self._drained(pieces, self.recv(timeout))) is None:
            pass
        return result


class AsyncStream(_StreamProtocol):
    """One WebSocket stream (asyncio). Use as an async context manager from :meth:`AsyncClient.stream`."""

    async def __aenter__(self) -> "AsyncStream":
        from websockets.exceptions import ConnectionClosed

        kept = self.pool.take() if self.pool is not None else None
        if kept is not None:
            self.ws = kept
            try:
                await self._open()
                return self
            except (ServerError, ConnectionClosed, OSError):  # closed by the server as it was taken: once more, anew
                await self.close()
                self.opened = None
        if self.connection is None:
            self.ws = await _connect(self.url, self.api_key, self.open_timeout)
        try:
            await self._open()
        except BaseException:
            await self.close()
            raise
        return self

    async def _open(self) -> None:
        for m in self._open_messages():
            await self.send_raw(m)
        self._accept_opened(await self.recv())

    async def __aexit__(self, *exc) -> None:
        # A stream on a kept connection leaves it open for the next one once its done came;
        # else (an error, an exit mid-stream) the connection goes with it.
        if self.done is None or (self.connection is None and self.pool is None):
            await self.close()
        elif self.pool is not None:
            await self.pool.give_back(self.ws)

    async def close(self) -> None:
        await _close_quietly(self.ws)

    async def send_json(self, obj) -> None:
        await self.send_raw(json.dumps(obj))

    async def send_raw(self, data: bytes | str) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            await self.ws.send(data)
        except ConnectionClosed:
            await self.recv(timeout=5)  # the server closed first: surface its error message
            raise

    async def recv(self, timeout: float | None = 60) -> bytes | dict:
        import asyncio

        from websockets.exceptions import ConnectionClosed

        try:
            async with asyncio.timeout(timeout):  # not wait_for: no task per message
                msg = await self.ws.recv()
        except ConnectionClosed as e:
            raise _closed_error(e) from None
        if isinstance(msg, bytes):
            return msg
        err = _error_from_text(msg)
        if err is not None:
            try:
                async with asyncio.timeout(5):
                    await self.ws.recv()
            except ConnectionClosed as e:
                err.close_code = e.rcvd.code if e.rcvd else None
            except TimeoutError:
                pass
            raise err
        return json.loads(msg)

    async def push(self, frames, binary: bool = True) -> None:
        await self.send_raw(self._push_message(frames, binary))

    async def recv_audio(self, timeout: float | None = 60) -> np.ndarray:
        return self._audio(await self.recv(timeout))

    async def end(self, timeout: float | None = 60) -> tuple[np.ndarray, dict]:
        await self.send_json({"op": "end"})
        return await self.drain(timeout)

    async def drain(self, timeout: float | None = 60) -> tuple[np.ndarray, dict]:
        """Read audio until ``done``; returns (that audio, the ``done`` message)."""
        pieces: list[np.ndarray] = []
        while (result := self._drained(pieces, await self.recv(timeout))) is None:
            pass
        return result


class AsyncConnection:
    """One WebSocket connection that carries streams one after another: each opens with
    ``keep_open``, so the server leaves the connection open after its ``done``, and the next
    stream skips the connection's set-up. A stream that ends any other way (an error, a
    ``with`` block left mid-stream) closes the connection; later streams on it fail. Use as an
    async context manager from :meth:`AsyncClient.connection`; :meth:`stream` as
    :meth:`AsyncClient.stream`."""

    def __init__(self, url: str, api_key: str | None, open_timeout: float):
        self.url, self.api_key, self.open_timeout = url, api_key, open_timeout
        self.ws = None

    async def __aenter__(self) -> "AsyncConnection":
        self.ws = await _connect(self.url, self.api_key, self.open_timeout)
        return self

    async def __aexit__(self, *exc) -> None:
        await _close_quietly(self.ws)

    def stream(self, request_id: str | None = None, prefix=None, format: str = "pcm_s16le") -> AsyncStream:
        return AsyncStream(self.url, self.api_key, request_id, prefix, format, self.open_timeout, connection=self)
