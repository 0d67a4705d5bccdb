"""Clients for ``code2wav serve`` (protocol: ``docs/protocol.md``): :class:`Client` (sync) and
:class:`AsyncClient`. HTTP goes through httpx, the WebSocket through the ``websockets`` package.

    client = Client("http://127.0.0.1:8091", api_key=None)
    wav_bytes = client.decode(codes, format="wav")
    with client.stream(prefix=ref, format="f32le") as s:
        s.push(codes[:4])
        first = s.recv_audio()          # the 4 frames' audio as soon as it is decoded
        s.push(codes[4:])
        rest, done = s.end()            # the remaining audio, then the "done" message

Errors the server reports raise :class:`ServerError` with its ``code`` and, on the WebSocket, the
close code (``close_code``) or over HTTP the status (``status``).
"""

from __future__ import annotations

import io
import json
from typing import AsyncIterator, Iterator, Sequence

import numpy as np

DEFAULT_URL = "http://127.0.0.1:8091"
SAMPLE_DTYPES = {"pcm_s16le": np.dtype("<i2"), "f32le": np.dtype("<f4")}


class ServerError(Exception):
    def __init__(self, code: str, message: str, status: int | None = None, close_code: int | None = None):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.status, self.close_code = code, message, status, close_code


def _ws_url(base: str) -> str:
    base = base.rstrip("/")
    if base.startswith("https://"):
        return "wss://" + base[len("https://") :] + "/v1/stream"
    if base.startswith("http://"):
        return "ws://" + base[len("http://") :] + "/v1/stream"
    return base + "/v1/stream"


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def frames_bytes(frames) -> bytes:
    """``[n, 16]`` codes -> the binary push message (int16 little-endian, row-major)."""
    arr = np.asarray(frames)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"codes must be integers, got {arr.dtype}")
    return np.ascontiguousarray(arr.astype("<i2")).tobytes()


def _codes_list(codes) -> list:
    return np.asarray(codes).tolist()


def _decode_body(codes, prefix, format: str, stream: bool) -> dict:
    body = {"codes": _codes_list(codes), "format": format, "stream": stream}
    if prefix is not None:
        body["prefix"] = _codes_list(prefix)
    return body


def _http_error(r) -> ServerError:
    try:
        obj = r.json()
        return ServerError(obj.get("code", "http_error"), obj.get("message", r.text), status=r.status_code)
    except ValueError:
        return ServerError("http_error", r.text, status=r.status_code)


def _error_from_text(text: str) -> ServerError | None:
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if isinstance(obj, dict) and obj.get("type") == "error":
        return ServerError(obj.get("code", "?"), obj.get("message", ""))
    return None


def _checked(r):
    """An httpx response, or its :class:`ServerError` if it is not a 200."""
    if r.status_code != 200:
        raise _http_error(r)
    return r


def _closed_error(e) -> ServerError:
    code = e.rcvd.code if e.rcvd else None
    return ServerError("closed", f"connection closed ({code})", close_code=code)


class _StreamProtocol:
    """What the sync and async streams share: the protocol's messages, without the I/O."""

    def __init__(self, url: str, api_key: str | None, request_id: str | None, prefix, format: str, open_timeout: float):
        self.url, self.api_key, self.request_id, self.prefix, self.format = url, api_key, request_id, prefix, format
        self.open_timeout = open_timeout
        self.dtype = SAMPLE_DTYPES[format]
        self.ws = None
        self.opened: dict | None = None

    def _open_message(self) -> dict:
        msg = {"op": "open", "format": self.format}
        if self.request_id is not None:
            msg["request_id"] = self.request_id
        if self.prefix is not None:
            msg["prefix"] = _codes_list(self.prefix)
        return msg

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
            return (np.concatenate(pieces) if pieces else np.zeros(0, self.dtype)), msg
        raise ServerError("protocol", f"unexpected message {msg!r}")


# -- sync ----------------------------------------------------------------------------------------------


class Stream(_StreamProtocol):
    """One WebSocket stream (sync). Use as a context manager from :meth:`Client.stream`."""

    def __enter__(self) -> "Stream":
        from websockets.sync.client import connect

        # Entered as a context manager: websockets >= 17 warns on a bare connect().
        self.ws = connect(self.url, additional_headers=_headers(self.api_key), open_timeout=self.open_timeout, max_size=None, compression=None).__enter__()
        try:
            self.send_json(self._open_message())
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


class Client:
    def __init__(self, base_url: str = DEFAULT_URL, api_key: str | None = None, timeout: float = 60.0):
        import httpx

        self.base_url, self.api_key, self.timeout = base_url.rstrip("/"), api_key, timeout
        self.http = httpx.Client(base_url=self.base_url, headers=_headers(api_key), timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def health(self) -> dict:
        return _checked(self.http.get("/health")).json()

    def metrics(self) -> str:
        return _checked(self.http.get("/metrics")).text

    def decode(self, codes, prefix=None, format: str = "wav", npy: bool = False) -> bytes:
        """POST /v1/decode; returns the whole body (wav / flac / pcm / f32le bytes)."""
        return _checked(self._post(codes, prefix, format, False, npy)).content

    def decode_stream(self, codes, prefix=None, format: str = "pcm") -> Iterator[bytes]:
        """POST /v1/decode with ``stream=true``; yields body chunks as the server sends them."""
        with self.http.stream("POST", "/v1/decode", json=_decode_body(codes, prefix, format, True)) as r:
            if r.status_code != 200:
                r.read()
                raise _http_error(r)
            yield from r.iter_bytes()

    def _post(self, codes, prefix, format, stream, npy):
        if not npy:
            return self.http.post("/v1/decode", json=_decode_body(codes, prefix, format, stream))
        arr = np.asarray(codes)
        pf = 0
        if prefix is not None:
            arr = np.concatenate([np.asarray(prefix).reshape(-1, arr.shape[1]), arr])
            pf = len(prefix)
        buf = io.BytesIO()
        np.save(buf, arr)
        params = {"format": format, "stream": str(stream).lower(), "prefix_frames": pf}
        return self.http.post("/v1/decode", content=buf.getvalue(), params=params, headers={"content-type": "application/octet-stream"})

    def stream(self, request_id: str | None = None, prefix=None, format: str = "pcm_s16le", open_timeout: float = 10) -> Stream:
        return Stream(_ws_url(self.base_url), self.api_key, request_id, prefix, format, open_timeout)

    def stream_decode(self, codes, chunks: Sequence[int] = (25,), prefix=None, format: str = "pcm_s16le", binary: bool = True, request_id: str | None = None):
        """Stream ``codes`` in chunks (sizes in order, the last repeating), one chunk in flight at
        a time; returns (audio, done)."""
        codes = np.asarray(codes)
        pieces = []
        with self.stream(request_id, prefix, format) as s:
            done_frames, i = 0, 0
            while done_frames < len(codes):
                n = chunks[min(i, len(chunks) - 1)]
                s.push(codes[done_frames : done_frames + n], binary=binary)
                pieces.append(s.recv_audio())
                done_frames += n
                i += 1
            rest, done = s.end()
        pieces.append(rest)
        return np.concatenate(pieces), done


# -- async ---------------------------------------------------------------------------------------------


class AsyncStream(_StreamProtocol):
    """One WebSocket stream (asyncio). Use as an async context manager from :meth:`AsyncClient.stream`."""

    async def __aenter__(self) -> "AsyncStream":
        from websockets.asyncio.client import connect

        self.ws = await connect(self.url, additional_headers=_headers(self.api_key), open_timeout=self.open_timeout, max_size=None, compression=None)
        try:
            await self.send_json(self._open_message())
            self._accept_opened(await self.recv())
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        from websockets.exceptions import ConnectionClosed

        if self.ws is not None:
            try:
                await self.ws.close()
            except (ConnectionClosed, OSError):
                pass

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
            msg = await asyncio.wait_for(self.ws.recv(), timeout)
        except ConnectionClosed as e:
            raise _closed_error(e) from None
        if isinstance(msg, bytes):
            return msg
        err = _error_from_text(msg)
        if err is not None:
            try:
                await asyncio.wait_for(self.ws.recv(), 5)
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


class AsyncClient:
    def __init__(self, base_url: str = DEFAULT_URL, api_key: str | None = None, timeout: float = 60.0):
        import httpx

        self.base_url, self.api_key, self.timeout = base_url.rstrip("/"), api_key, timeout
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=_headers(api_key), timeout=timeout)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def health(self) -> dict:
        return _checked(await self.http.get("/health")).json()

    async def metrics(self) -> str:
        return _checked(await self.http.get("/metrics")).text

    async def decode(self, codes, prefix=None, format: str = "wav") -> bytes:
        return _checked(await self.http.post("/v1/decode", json=_decode_body(codes, prefix, format, False))).content

    async def decode_stream(self, codes, prefix=None, format: str = "pcm") -> AsyncIterator[bytes]:
        async with self.http.stream("POST", "/v1/decode", json=_decode_body(codes, prefix, format, True)) as r:
            if r.status_code != 200:
                await r.aread()
                raise _http_error(r)
            async for part in r.aiter_bytes():
                yield part

    def stream(self, request_id: str | None = None, prefix=None, format: str = "pcm_s16le", open_timeout: float = 10) -> AsyncStream:
        return AsyncStream(_ws_url(self.base_url), self.api_key, request_id, prefix, format, open_timeout)

    async def stream_decode(self, codes, chunks: Sequence[int] = (25,), prefix=None, format: str = "pcm_s16le", binary: bool = True, request_id: str | None = None):
        """Send every chunk at once (pipelined) while reading audio; returns (audio, done)."""
        codes = np.asarray(codes)
        import asyncio

        async with self.stream(request_id, prefix, format) as s:
            reader = asyncio.create_task(s.drain())  # reads while we send: no buffer deadlock
            try:
                done_frames, i = 0, 0
                while done_frames < len(codes):
                    n = chunks[min(i, len(chunks) - 1)]
                    await s.push(codes[done_frames : done_frames + n], binary=binary)
                    done_frames += n
                    i += 1
                await s.send_json({"op": "end"})
                audio, done = await reader
            finally:
                reader.cancel()
        return audio, done
