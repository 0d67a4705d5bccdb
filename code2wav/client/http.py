"""The clients: :class:`Client` (sync) and :class:`AsyncClient`. Their HTTP endpoints go
through httpx (imported when a client is made); ``stream()`` opens a WebSocket stream (``ws``)."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Iterator, Sequence

import numpy as np

from code2wav.client.common import DEFAULT_URL, ServerError, _codes_list, _headers
from code2wav.client.ws import AsyncConnection, AsyncStream, ConnectionPool, Stream, _ws_url


def _decode_body(codes, prefix, format: str, stream: bool) -> dict:
    body = {"codes": _codes_list(codes), "format": format, "stream": stream}
    if prefix is not None:
        body["prefix"] = _codes_list(prefix)
    return body


def _retry_after(r) -> float | None:
    """A ``Retry-After`` in seconds (the form this server sends; an HTTP date is not read)."""
    try:
        return max(0.0, float(r.headers["retry-after"]))
    except (KeyError, ValueError):
        return None


def _http_error(r) -> ServerError:
    try:
        obj = r.json()
        return ServerError(obj.get("code", "http_error"), obj.get("message", r.text), status=r.status_code, retry_after=_retry_after(r))
    except ValueError:
        return ServerError("http_error", r.text, status=r.status_code, retry_after=_retry_after(r))


def _checked(r):
    """An httpx response, or its :class:`ServerError` if it is not a 200."""
    if r.status_code != 200:
        raise _http_error(r)
    return r


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


class AsyncClient:
    """``keep_connections=N``: :meth:`stream` keeps up to N idle WebSocket connections for the
    next streams (:class:`ConnectionPool`) instead of a connection per stream, whose set-up
    costs the server's event loop as much as a short stream's chunks. 0: a connection each."""

    def __init__(self, base_url: str = DEFAULT_URL, api_key: str | None = None, timeout: float = 60.0, keep_connections: int = 0):
        import httpx

        self.base_url, self.api_key, self.timeout = base_url.rstrip("/"), api_key, timeout
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=_headers(api_key), timeout=timeout)
        self.pool = ConnectionPool(keep_connections) if keep_connections else None

    async def aclose(self) -> None:
        if self.pool is not None:
            await self.pool.aclose()
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
        return AsyncStream(_ws_url(self.base_url), self.api_key, request_id, prefix, format, open_timeout, pool=self.pool)

    def connection(self, open_timeout: float = 10) -> AsyncConnection:
        """A WebSocket connection for streams one after another (``async with``, then its ``stream``)."""
        return AsyncConnection(_ws_url(self.base_url), self.api_key, open_timeout)

    async def stream_decode(self, codes, chunks: Sequence[int] = (25,), prefix=None, format: str = "pcm_s16le", binary: bool = True,
                            request_id: str | None = None):
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
