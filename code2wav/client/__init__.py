"""Clients for ``code2wav serve`` (protocol: ``docs/protocol.md``): :class:`Client` (sync) and
:class:`AsyncClient`. HTTP goes through httpx, the WebSocket through the ``websockets`` package.

    client = Client("http://127.0.0.1:8091", api_key=None)
    wav_bytes = client.decode(codes, format="wav")
    with client.stream(prefix=ref, format="f32le") as s:
        s.push(codes[:4])
        first = s.recv_audio()          # the 4 frames' audio as soon as it is decoded
        s.push(codes[4:])
        rest, done = s.end()            # the remaining audio, then the "done" message

``AsyncClient(url, keep_connections=N)`` keeps up to N idle WebSocket connections for the next
streams (a talker's many requests), instead of a connection per stream.

Errors the server reports raise :class:`ServerError` with its ``code`` and, on the WebSocket, the
close code (``close_code``) or over HTTP the status (``status``).
"""

from code2wav.client.common import DEFAULT_URL, SAMPLE_DTYPES, ServerError, frames_bytes
from code2wav.client.http import AsyncClient, Client
from code2wav.client.ws import AsyncConnection, AsyncStream, ConnectionPool, Stream

__all__ = ["DEFAULT_URL", "SAMPLE_DTYPES", "AsyncClient", "AsyncConnection", "AsyncStream", "Client", "ConnectionPool", "ServerError", "Stream",
           "frames_bytes"]
