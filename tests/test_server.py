"""``code2wav serve`` end to end: a real server process on 127.0.0.1 with a shrunk random
checkpoint, driven through ``code2wav.client`` (and raw messages for the error paths)."""

from __future__ import annotations

import asyncio
import io
import json
import re
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("websockets")
pytest.importorskip("httpx")
pytest.importorskip("prometheus_client")

import httpx  # noqa: E402
import soundfile as sf  # noqa: E402
import torch  # noqa: E402

from code2wav import offline  # noqa: E402
from code2wav.client import AsyncClient, Client, ServerError, frames_bytes  # noqa: E402
from code2wav.model.loading import load_decoder  # noqa: E402
from code2wav.server.audio import to_int16  # noqa: E402
from code2wav.stream.engine import StreamEngine  # noqa: E402
from tests.models import one_thread, random_codes  # noqa: E402
from tests.servers import Server  # noqa: E402

SPF, SR = 1920, 24000
KEY = "s3cret"
MAIN_MAX_MESSAGE = 200_000
MAIN_MAX_FRAMES = 2_000


@pytest.fixture(scope="module")
def servers(ckpt, tmp_path_factory):
    """Both servers start together (their startup is mostly importing torch)."""
    d = tmp_path_factory.mktemp("logs")
    main = Server(
        ckpt, d / "main.log", "--max-streams", "24", "--max-message-bytes", str(MAIN_MAX_MESSAGE), "--max-stream-frames", str(MAIN_MAX_FRAMES),
        "--set", "prefix_cache_bytes=100000000",  # every prefixed stream here goes through the cache (exact, hit or miss)
    )
    limited = Server(ckpt, d / "limited.log", "--max-streams", "2", "--api-key", KEY, "--idle-timeout", "1")
    try:
        main.wait_ready()
        limited.wait_ready()
        yield main, limited
    finally:
        main.stop()
        limited.stop()


@pytest.fixture(scope="module")
def server(servers) -> Server:
    return servers[0]


@pytest.fixture(scope="module")
def limited(servers) -> Server:
    return servers[1]


@pytest.fixture(scope="module")
def client(server):
    with Client(server.url) as c:
        yield c


@pytest.fixture(scope="module")
def model32(ckpt):
    return load_decoder(ckpt, dtype=torch.float32)


def codes_of(frames: int, seed: int = 1) -> np.ndarray:
    return random_codes(frames, seed=seed).numpy()


def reference(model, codes: np.ndarray, prefix: np.ndarray | None, schedule) -> np.ndarray:
    """In-process float32 streaming decode, one thread (as the server runs)."""
    with one_thread():
        eng = StreamEngine(model, max_streams=1)
        eng.open("ref", prefix)
        out, done, i = [], 0, 0
        while done < len(codes):
            n = schedule[min(i, len(schedule) - 1)]
            out.append(eng.push("ref", codes[done : done + n]))
            done, i = done + n, i + 1
        eng.finish("ref")
    return torch.cat(out).numpy().astype("<f4")


def offline_ref(model, codes: np.ndarray, prefix: np.ndarray | None) -> np.ndarray:
    full = codes if prefix is None else np.concatenate([prefix, codes])
    with one_thread():
        wav = offline.decode(model, torch.from_numpy(full))[0].numpy()
    return wav[(0 if prefix is None else len(prefix)) * SPF :]


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} not in metrics"
    return float(m.group(1))


def wait_slots_free(c: Client, timeout: float = 60) -> None:  # a deadline for the event, generous for a loaded machine
    t0 = time.monotonic()
    while True:
        text = c.metrics()
        if metric(text, "code2wav_pool_slots_in_use") == 0 and metric(text, "code2wav_active_streams") == 0:
            return
        assert time.monotonic() - t0 < timeout, "stream slots not freed:\n" + text
        time.sleep(0.05)


# -- round trips ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", [(1, 4, 8, 25), (7,)], ids=["1-4-8-25", "7"])
@pytest.mark.parametrize("prefix_frames", [0, 20])
def test_ws_round_trip_is_exact(client, model32, schedule, prefix_frames):
    codes = codes_of(45, seed=3)
    prefix = codes_of(prefix_frames, seed=4) if prefix_frames else None
    audio, done = client.stream_decode(codes, chunks=schedule, prefix=prefix, format="f32le", binary=schedule != (7,))
    ref = reference(model32, codes, prefix, schedule)
    assert audio.tobytes() == ref.tobytes()  # bit-identical float32
    off = offline_ref(model32, codes, prefix)
    assert np.abs(audio - off).max() <= 1e-4 * np.abs(off).max()  # and equal to the offline decode
    assert done["frames"] == 45 and done["samples"] == 45 * SPF
    assert set(done["timings"]) >= {"open_ms", "ttfp_ms", "total_ms"}


def test_ws_pcm_and_async_pipelined(server, model32):
    codes, prefix = codes_of(40, seed=5), codes_of(10, seed=6)

    async def go():
        async with AsyncClient(server.url) as c:
            return await c.stream_decode(codes, chunks=(3, 9), prefix=prefix, format="pcm_s16le")

    audio, done = asyncio.run(go())
    assert audio.dtype == np.dtype("<i2") and done["samples"] == 40 * SPF
    np.testing.assert_array_equal(audio, to_int16(torch.from_numpy(reference(model32, codes, prefix, (3, 9)))))


def test_clients_do_not_ask_for_compression(client, server):
    """permessage-deflate of PCM saves ~1% of the bytes and costs the server ~7 ms of event-loop
    time per 25-frame chunk (it capped the service at a quarter of the engine's throughput)."""
    with client.stream() as s:
        assert s.ws.protocol.extensions == []

    async def go():
        async with AsyncClient(server.url) as c:
            async with c.stream() as s:
                return s.ws.protocol.extensions

    assert asyncio.run(go()) == []


def test_server_declines_compression(server):
    """Any client (browsers, a default ``websockets`` client) offers permessage-deflate; the
    server must not accept it, for the same reason."""
    from websockets.sync.client import connect

    with connect(server.url.replace("http", "ws") + "/v1/stream") as ws:
        assert "permessage-deflate" in ws.request.headers.get("Sec-WebSocket-Extensions", "")
        assert ws.protocol.extensions == []
        assert "Sec-WebSocket-Extensions" not in ws.response.headers


def test_http_decode_formats(client, model32):
    codes, prefix = codes_of(60, seed=7), codes_of(12, seed=8)
    ref = reference(model32, codes, prefix, (25,))  # the server feeds 25-frame chunks
    f32 = np.frombuffer(client.decode(codes, prefix=prefix, format="f32le"), "<f4")
    assert f32.tobytes() == ref.tobytes()
    pcm = np.frombuffer(client.decode(codes, prefix=prefix, format="pcm"), "<i2")
    np.testing.assert_array_equal(pcm, to_int16(torch.from_numpy(ref)))
    for fmt in ("wav", "flac"):
        data, sr = sf.read(io.BytesIO(client.decode(codes, prefix=prefix, format=fmt)), dtype="int16")
        assert sr == SR
        np.testing.assert_array_equal(data, pcm)
    npy = np.frombuffer(client.decode(codes, prefix=prefix, format="f32le", npy=True), "<f4")
    assert npy.tobytes() == ref.tobytes()
    streamed = b"".join(client.decode_stream(codes, prefix=prefix, format="pcm"))
    assert streamed == pcm.tobytes()
    wav_stream = b"".join(client.decode_stream(codes, prefix=prefix, format="wav"))
    np.testing.assert_array_equal(sf.read(io.BytesIO(wav_stream), dtype="int16")[0], pcm)
    # official -1 padding at the end of an .npy is dropped
    padded = np.concatenate([codes, np.full((3, 16), -1)])
    assert client.decode(padded, format="f32le", npy=True) == client.decode(codes, format="f32le", npy=True)


# -- errors ----------------------------------------------------------------------------------------------

BAD_AFTER_OPEN = {
    "malformed_json": ("{not json", "bad_json", 1003),
    "json_not_object": ("[1, 2]", "bad_message", 1003),
    "float_codes": (json.dumps({"op": "push", "frames": [[0.5] * 16]}), "bad_dtype", 1003),
    "json_wrong_shape": (json.dumps({"op": "push", "frames": [[1] * 15]}), "bad_shape", 1003),
    "binary_wrong_length": (b"\x00" * 30, "bad_shape", 1003),
    "json_out_of_range": (json.dumps({"op": "push", "frames": [[2048] * 16]}), "out_of_range", 1003),
    "binary_negative": (frames_bytes(np.full((2, 16), -1)), "out_of_range", 1003),
    "empty_binary": (b"", "empty", 1003),
    "unknown_op": (json.dumps({"op": "fly"}), "unknown_op", 1003),
    "second_open": (json.dumps({"op": "open"}), "already_open", 1008),
    "oversize": (b"\x00" * (MAIN_MAX_MESSAGE + 32), "message_too_big", 1009),
    "too_many_frames": (frames_bytes(np.zeros((MAIN_MAX_FRAMES + 1, 16), np.int16)), "too_many_frames", 1009),
}


def _expect_error(fn, code: str, close: int) -> ServerError:
    with pytest.raises(ServerError) as ei:
        fn()
    assert (ei.value.code, ei.value.close_code) == (code, close), ei.value
    return ei.value


@pytest.mark.parametrize("case", list(BAD_AFTER_OPEN))
def test_ws_errors_after_open(client, case):
    msg, code, close = BAD_AFTER_OPEN[case]
    codes = codes_of(10, seed=9)
    with client.stream(format="f32le") as healthy:  # a concurrent stream that must not notice
        healthy.push(codes[:4])
        first = healthy.recv_audio()
        with client.stream() as bad:
            bad.push(codes[:2])
            bad.recv_audio()
            bad.send_raw(msg)
            _expect_error(bad.recv, code, close)
        healthy.push(codes[4:])
        rest = healthy.recv_audio()
        tail, done = healthy.end()
    assert len(first) + len(rest) + len(tail) == 10 * SPF and done["frames"] == 10
    wait_slots_free(client)


BAD_OPEN = {
    "binary_first": (b"\x00" * 32, "not_open", 1008),
    "push_first": (json.dumps({"op": "push", "frames": [[0] * 16]}), "not_open", 1008),
    "malformed_json": ("nope", "bad_json", 1003),
    "unknown_op": (json.dumps({"op": "hello"}), "unknown_op", 1003),
    "bad_format": (json.dumps({"op": "open", "format": "mp3"}), "bad_format", 1003),
    "bad_request_id": (json.dumps({"op": "open", "request_id": 7}), "bad_request_id", 1003),
    "bad_keep_open": (json.dumps({"op": "open", "keep_open": "yes"}), "bad_message", 1003),
    "prefix_out_of_range": (json.dumps({"op": "open", "prefix": [[5000] * 16]}), "out_of_range", 1003),
    "prefix_wrong_shape": (json.dumps({"op": "open", "prefix": [[1, 2]]}), "bad_shape", 1003),
    "prefix_and_prefix_frames": (json.dumps({"op": "open", "prefix": [[1] * 16], "prefix_frames": 1}), "bad_message", 1003),
    "bad_prefix_frames": (json.dumps({"op": "open", "prefix_frames": "2"}), "bad_message", 1003),
    "negative_prefix_frames": (json.dumps({"op": "open", "prefix_frames": -1}), "bad_message", 1003),
    # prefix_frames P: the next message is the prefix, P frames of binary int16
    "prefix_frames_then_text": ((json.dumps({"op": "open", "prefix_frames": 2}), json.dumps({"op": "push", "frames": [[0] * 16]})),
                                "bad_message", 1003),
    "prefix_frames_wrong_size": ((json.dumps({"op": "open", "prefix_frames": 2}), b"\x00" * 32), "bad_shape", 1003),
    "binary_prefix_out_of_range": ((json.dumps({"op": "open", "prefix_frames": 1}), frames_bytes(np.full((1, 16), 5000))), "out_of_range", 1003),
}


@pytest.mark.parametrize("case", list(BAD_OPEN))
def test_ws_errors_at_open(server, client, case):
    from websockets.sync.client import connect

    msgs, code, close = BAD_OPEN[case]
    with connect(server.url.replace("http", "ws") + "/v1/stream") as ws:
        for msg in msgs if isinstance(msgs, tuple) else (msgs,):
            ws.send(msg)
        err = json.loads(ws.recv(timeout=30))
        assert (err["type"], err["code"]) == ("error", code) and err["message"]
        with pytest.raises(Exception) as ei:
            ws.recv(timeout=30)
        assert ei.value.rcvd.code == close
    wait_slots_free(client)


def test_a_binary_prefix_is_the_json_prefix(server, client):
    """The prefix as ``prefix_frames`` and a binary message (what ``code2wav.client`` sends) and
    as JSON rows in the ``open`` give the same stream: the same audio, bit for bit."""
    from websockets.sync.client import connect

    codes, prefix = codes_of(6, seed=60), codes_of(9, seed=61)
    with client.stream(prefix=prefix, format="f32le") as s:
        s.push(codes)
        binary = s.recv_audio()
        s.end()
    with connect(server.url.replace("http", "ws") + "/v1/stream") as ws:
        ws.send(json.dumps({"op": "open", "prefix": prefix.tolist(), "format": "f32le"}))
        assert json.loads(ws.recv(timeout=30))["type"] == "opened"
        ws.send(frames_bytes(codes))
        rows = np.frombuffer(ws.recv(timeout=30), "<f4")
    assert binary.size == 6 * SPF and binary.tobytes() == rows.tobytes()
    wait_slots_free(client)


# -- a connection that carries streams one after another (open with keep_open) ------------------------


def test_streams_one_after_another_on_a_kept_connection_are_exact(server, client, model32):
    """Each stream of a kept connection is its own stream: its own id and ``done``, with or
    without a prefix, in either format, its audio the engine's; the connection stays open after
    each ``done``, and each stream counts once in the stream requests."""
    jobs = [(codes_of(30, seed=21), None, "f32le", (1, 25)), (codes_of(26, seed=22), codes_of(12, seed=23), "pcm_s16le", (5, 9)),
            (codes_of(3, seed=24), None, "f32le", (3,))]
    before = metric(client.metrics(), 'code2wav_requests_total{endpoint="stream"}')

    async def go():
        out = []
        async with AsyncClient(server.url) as c, c.connection() as conn:
            for codes, prefix, fmt, chunks in jobs:
                async with conn.stream(prefix=prefix, format=fmt) as s:
                    pieces, at, i = [], 0, 0
                    while at < len(codes):
                        n = chunks[min(i, len(chunks) - 1)]
                        await s.push(codes[at : at + n])
                        pieces.append(await s.recv_audio())
                        at, i = at + n, i + 1
                    rest, done = await s.end()
                    out.append((np.concatenate(pieces + [rest]), done, s.request_id))
                assert conn.ws.state.name == "OPEN"  # left open for the next one
        return out

    got = asyncio.run(go())
    for (codes, prefix, fmt, chunks), (audio, done, rid) in zip(jobs, got):
        ref = reference(model32, codes, prefix, chunks)
        if fmt == "f32le":
            assert audio.tobytes() == ref.tobytes()
        else:
            np.testing.assert_array_equal(audio, to_int16(torch.from_numpy(ref)))
        assert done["request_id"] == rid and done["frames"] == len(codes)
    assert len({rid for _, _, rid in got}) == 3
    wait_slots_free(client)
    assert metric(client.metrics(), 'code2wav_requests_total{endpoint="stream"}') == before + 3


def test_a_kept_connection_is_bounded_by_the_idle_timeout_between_streams(limited):
    """After a kept stream's ``done`` the connection waits for the next ``open`` no longer than
    a new connection would: ``idle_timeout``, close 1008, and no slot held meanwhile."""
    from websockets.sync.client import connect

    url = limited.url.replace("http://", "ws://") + "/v1/stream"
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, compression=None) as ws:
        ws.send(json.dumps({"op": "open", "keep_open": True}))
        assert json.loads(ws.recv(timeout=30))["type"] == "opened"
        ws.send(json.dumps({"op": "end"}))
        assert json.loads(ws.recv(timeout=30))["type"] == "done"
        with Client(limited.url, api_key=KEY) as c:
            wait_slots_free(c)  # between streams, the connection holds no slot
        err = json.loads(ws.recv(timeout=30))
        assert (err["type"], err["code"]) == ("error", "idle_timeout"), err
        with pytest.raises(Exception) as ei:
            ws.recv(timeout=30)
        assert ei.value.rcvd.code == 1008


def test_a_pooled_client_runs_concurrent_streams_on_its_kept_connections(server, client, model32):
    """``AsyncClient(keep_connections=2)``: three streams at once, then three more. Each stream's
    audio is the stream's own (to float32 rounding: the server batches them); after the first three two connections are kept (the third, over the bound,
    closed), and two of the next three streams run on them."""

    async def go():
        async with AsyncClient(server.url, keep_connections=2) as c:

            async def one(i: int):
                codes = codes_of(7, seed=40 + i)
                async with c.stream(format="f32le") as s:
                    await s.push(codes[:3])
                    first = await s.recv_audio()
                    await s.push(codes[3:])
                    second = await s.recv_audio()
                    rest, done = await s.end()
                assert done["frames"] == 7
                return codes, np.concatenate([first, second, rest]), s.ws

            before = await asyncio.gather(*(one(i) for i in range(3)))
            kept = list(c.pool.idle)
            after = await asyncio.gather(*(one(i) for i in range(3, 6)))
            return before, kept, after, len(c.pool.idle)

    before, kept, after, idle = asyncio.run(go())
    assert len(kept) == 2 and idle == 2
    assert len({id(ws) for *_, ws in after} & {id(ws) for ws in kept}) == 2
    for codes, audio, _ in before + after:  # batched with each other: float32 rounding apart
        ref = reference(model32, codes, None, (3, 4))
        assert audio.shape == ref.shape and np.abs(audio - ref).max() <= 1e-4 * np.abs(ref).max()
    wait_slots_free(client)


def test_a_pooled_connection_the_server_closed_is_not_used_again(limited, monkeypatch):
    """A kept connection the server closed (its idle timeout) is dropped when a stream takes
    it; one that still looks open as it is taken fails the ``open``, and the stream opens once
    more on a new connection. A stream that ends in an error gives its connection back to no
    one."""
    from code2wav.client import ws as client_ws

    codes = codes_of(2, seed=50)

    async def one(c: AsyncClient):
        async with c.stream() as s:
            await s.push(codes)
            audio = await s.recv_audio()
            await s.end()
        return audio, s.ws

    async def go():
        async with AsyncClient(limited.url, api_key=KEY, keep_connections=1) as c:
            _, old = await one(c)
            assert c.pool.idle == [old]
            await asyncio.wait_for(old.wait_closed(), 30)  # the server's idle timeout (1 s) closed it
            audio, new = await one(c)
            assert new is not old and audio.size == 2 * SPF
            await asyncio.wait_for(new.wait_closed(), 30)
            monkeypatch.setattr(client_ws, "_is_open", lambda ws: True)  # taken as if open: its open fails
            c.pool.idle = [new]
            audio, newer = await one(c)
            assert newer is not new and audio.size == 2 * SPF
            with pytest.raises(ServerError):
                async with c.stream() as s:
                    await s.push(np.zeros((1, 3), dtype=np.int16))  # the wrong shape: the stream's error
                    await s.recv_audio()
            return c.pool.idle

    assert asyncio.run(go()) == []


def test_an_error_ends_a_kept_connection_and_its_later_streams_fail(server, client):
    """A stream on a kept connection that ends in an error closes the connection, as on a
    connection of its own; the next stream on it fails at once, and no slot is left held."""

    async def go():
        async with AsyncClient(server.url) as c, c.connection() as conn:
            async with conn.stream() as s:
                await s.push(codes_of(2))
                await s.recv_audio()
                await s.end()
            with pytest.raises(ServerError) as first:
                async with conn.stream() as s:
                    await s.send_raw(b"\x00" * 7)  # not a whole number of frames
                    await s.recv_audio()
            with pytest.raises(ServerError):  # the connection is closed
                async with conn.stream() as s:
                    await s.push(codes_of(2))
                    await s.recv_audio()
            return first.value.code

    assert asyncio.run(go()) == "bad_shape"
    wait_slots_free(client)


def test_ws_duplicate_request_id(client):
    with client.stream(request_id="dup") as first:
        _expect_error(lambda: client.stream(request_id="dup").__enter__(), "duplicate_request_id", 1008)
        first.push(codes_of(3))
        assert len(first.recv_audio()) == 3 * SPF
        first.end()
    with client.stream(request_id="dup") as again:  # the id is free once its stream ended
        again.end()
    wait_slots_free(client)


def test_http_errors(client, server):
    post = client.http.post
    cases = [
        (post("/v1/decode", content=b"{x", headers={"content-type": "application/json"}), 400, "bad_json"),
        (post("/v1/decode", json={"codes": [[4096] * 16]}), 400, "out_of_range"),
        (post("/v1/decode", json={"codes": [[1] * 15]}), 400, "bad_shape"),
        (post("/v1/decode", json={"codes": [[0.5] * 16]}), 400, "bad_dtype"),
        (post("/v1/decode", json={"codes": [[1] * 16], "format": "mp3"}), 400, "bad_format"),
        (post("/v1/decode", json={"codes": [[1] * 16], "format": "flac", "stream": True}), 400, "bad_format"),
        (post("/v1/decode", content=b"garbage", headers={"content-type": "application/octet-stream"}), 400, "bad_npy"),
        (post("/v1/decode", content=b"x", headers={"content-type": "text/plain"}), 415, "unsupported_media_type"),
        (post("/v1/decode", json={"codes": np.zeros((MAIN_MAX_FRAMES + 1, 16), int).tolist()}), 413, "too_many_frames"),
    ]
    for r, status, code in cases:
        assert r.status_code == status, (code, r.text)
        assert r.json()["type"] == "error" and r.json()["code"] == code
    assert len(client.decode(codes_of(2), format="pcm")) == 2 * SPF * 2  # still serving
    text = client.metrics()
    assert 'code2wav_errors_total{code="bad_json"}' in text
    wait_slots_free(client)


# -- the limited server: auth, pool full, idle timeout ------------------------------------------------------


def test_auth(limited):
    assert httpx.get(limited.url + "/health").status_code == 200  # no token needed
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.get(limited.url + "/metrics", headers=headers)
        assert r.status_code == 401 and r.json()["code"] == "unauthorized"
        r = httpx.post(limited.url + "/v1/decode", json={"codes": [[1] * 16]}, headers=headers)
        assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    with Client(limited.url, api_key=KEY) as good:
        with good.stream() as held:  # a concurrent, authorized stream keeps working
            for key in (None, "wrong"):
                with Client(limited.url, api_key=key) as bad:
                    _expect_error(lambda: bad.stream().__enter__(), "unauthorized", 1008)
            held.push(codes_of(2))
            assert len(held.recv_audio()) == 2 * SPF
            held.end()
        assert len(good.decode(codes_of(2), format="pcm")) == 2 * SPF * 2
        wait_slots_free(good)


def test_pool_full(limited):
    with Client(limited.url, api_key=KEY) as c:
        with c.stream() as a, c.stream() as b:
            _expect_error(lambda: c.stream().__enter__(), "pool_full", 1013)
            r = c.http.post("/v1/decode", json={"codes": [[1] * 16]})
            assert r.status_code == 503 and r.json()["code"] == "pool_full" and r.headers["retry-after"]
            for s in (a, b):
                s.push(codes_of(2))
                assert len(s.recv_audio()) == 2 * SPF
        wait_slots_free(c)
        with c.stream() as again:  # slots are reusable
            again.end()
        assert 'code2wav_errors_total{code="pool_full"} 2.0' in c.metrics()


def test_idle_timeout(limited):
    with Client(limited.url, api_key=KEY) as c:
        with c.stream() as s:
            s.push(codes_of(2))
            s.recv_audio()
            time.sleep(1.5)
            _expect_error(s.recv, "idle_timeout", 1008)
        wait_slots_free(c)


def test_idle_timeout_before_open(limited):
    """A connection that never sends ``open`` is bounded by the idle timeout too."""
    from websockets.sync.client import connect

    url = limited.url.replace("http://", "ws://") + "/v1/stream"
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, compression=None) as ws:
        err = json.loads(ws.recv(timeout=30))
        assert (err["type"], err["code"]) == ("error", "idle_timeout"), err


# -- disconnects and load --------------------------------------------------------------------------------


def test_disconnect_mid_stream_frees_the_slot(client):
    codes = codes_of(100, seed=11)
    for in_flight in (False, True):
        s = client.stream().__enter__()
        s.push(codes[:4])
        s.recv_audio()
        if in_flight:  # chunks still queued or decoding when the client vanishes
            for k in range(4):
                s.push(codes[4 + 20 * k : 24 + 20 * k])
        s.ws.socket.close() if in_flight else s.close()  # abrupt drop / close without end
        wait_slots_free(client)
    assert len(client.decode(codes_of(2), format="pcm")) == 2 * SPF * 2


def test_load_many_concurrent_streams(server, client, model32):
    n_streams, frames = 16, 50
    before = client.metrics()

    async def one(c: AsyncClient, i: int):
        codes = codes_of(frames, seed=100 + i)
        async with c.stream(format="f32le") as s:
            got = []
            for k in range(0, frames, 5):
                await s.push(codes[k : k + 5])
                got.append(await s.recv_audio())
                await asyncio.sleep(0.01 * (i % 3))
            tail, done = await s.end()
        return codes, np.concatenate(got + [tail]), done

    async def go():
        async with AsyncClient(server.url) as c:
            return await asyncio.gather(*(one(c, i) for i in range(n_streams)))

    t0 = time.monotonic()
    results = asyncio.run(go())
    elapsed = time.monotonic() - t0
    for codes, audio, done in results:
        assert done["frames"] == frames and len(audio) == frames * SPF
        off = offline_ref(model32, codes, None)
        assert np.abs(audio - off).max() <= 1e-4 * np.abs(off).max()
    wait_slots_free(client)
    after = client.metrics()
    errors = lambda t: sum(float(v) for v in re.findall(r"^code2wav_errors_total\{[^}]*\} ([0-9.e+-]+)$", t, re.M))  # noqa: E731
    assert errors(after) == errors(before)
    assert metric(after, "code2wav_steps_total") > metric(before, "code2wav_steps_total")
    assert metric(after, "code2wav_ttfp_seconds_count") >= metric(before, "code2wav_ttfp_seconds_count") + n_streams
    print(f"{n_streams} streams x {frames} frames in {elapsed:.2f} s")


@pytest.mark.parametrize("reuse", [[], ["--reuse-connections"]], ids=["a-connection-each", "kept-connections"])
def test_loadtest_command_bounded_run(server, client, tmp_path, capsys, reuse):
    """``code2wav loadtest``: 8 workers for 2 s against the live server, each stream on its own
    connection or one after another on the worker's: streams served, no errors, every slot free
    again, and the server's memory reported at start and end."""
    from code2wav.cli import main

    out = tmp_path / "load.json"
    rc = main(["loadtest", "--server", server.url, "--streams", "8", "--seconds", "2", "--frames", "12", "--chunks", "1,5", "--json", str(out),
               *reuse])
    summary = json.loads(out.read_text())
    assert rc == 0 and summary["errors"] == {}
    assert summary["streams_served"] >= 8
    assert summary["audio_s"] == pytest.approx(summary["streams_served"] * 12 * SPF / SR)
    assert summary["ttfp_p50_ms"] <= summary["ttfp_p99_ms"]
    assert summary["server_before"]["process_resident_memory_bytes"] > 0
    assert summary["server_after"]["process_resident_memory_bytes"] > 0
    rates = summary["server"]  # the server's own counters over the run: its steps carried the streams' chunks
    assert rates["steps_per_s"] * summary["seconds"] >= summary["streams_served"] * 3 / 8  # 3 chunks a stream, at most 8 rows a step
    assert 1 <= rates["rows_per_step"] <= 8
    assert 0 < rates["device_busy_pct"] <= 110  # steps run one at a time: their sum fits in the wall (the window's edges aside)
    wait_slots_free(client)
    out = capsys.readouterr().out
    assert "streams served" in out and "rows a step" in out


def test_loadtest_voices_repeat_so_the_prefix_cache_hits(server, client, tmp_path):
    """``code2wav loadtest --prefix 4 --voices 2``: every stream's prefix is one of two
    references (the same in every loadtest process), so the server's prefix cache misses only
    while a voice is not in it yet, and every other stream's state comes from it."""
    from code2wav.cli import main

    def counts() -> tuple[float, float]:
        text = client.metrics()
        return metric(text, "code2wav_prefix_cache_hits_total"), metric(text, "code2wav_prefix_cache_misses_total")

    hits0, misses0 = counts()
    out = tmp_path / "load.json"
    rc = main(["loadtest", "--server", server.url, "--streams", "3", "--seconds", "3", "--frames", "6", "--chunks", "3", "--prefix", "4",
               "--voices", "2", "--json", str(out)])
    summary = json.loads(out.read_text())
    hits, misses = (a - b for a, b in zip(counts(), (hits0, misses0)))
    assert rc == 0 and summary["errors"] == {} and summary["streams_served"] >= 3
    assert hits + misses == summary["streams_served"]
    # A voice misses until its state is in: at most once per worker whose stream of it joined
    # the same admission as the voice's first (3 workers, 2 voices).
    assert misses <= 6 and hits >= summary["streams_served"] - 6
    assert hits > 0, summary["streams_served"]
    wait_slots_free(client)


def test_bench_through_the_service(server, tmp_path):
    """``code2wav bench --server``: the bench workload over WebSocket, TTFP measured at the client."""
    from code2wav.cli import main

    rc = main(["bench", "--server", server.url, "--levels", "1,4", "--frames", "11", "--chunks", "1,5", "--prefix", "0,3", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "results.json").read_text())["results"]
    assert rc == 0 and len(rows) == 4
    for r in rows:
        assert r["streams_served"] == r["concurrency"] and r["errors"] == {}
        assert r["audio_s"] == pytest.approx(r["concurrency"] * 11 * SPF / SR)


def test_metrics_show_the_graph_runner(ckpt):
    """With a graph runner (CUDA), ``/metrics`` adds its replays, fallbacks by reason, padded
    work and pool size; the counters follow what the runner did. (In-process, with a stand-in
    for the runner's bookkeeping: graphs need CUDA.)"""
    from code2wav.engine.async_engine import AsyncEngine
    from code2wav.server.metrics import _Metrics
    from code2wav.server.service import Service
    from code2wav.stream.pool import StatePool
    from code2wav.stream.runner import EagerRunner

    model = load_decoder(ckpt, device="cpu", dtype=torch.float32)

    class Graphs(EagerRunner):  # the GraphRunner bookkeeping the service reads
        hits = padded = frames = 0

        def __call__(self, codes, slots, n_new):
            self.hits += 1
            self.padded += 2 * 8  # as if padded up to a (2 rows, 8 frames) bucket
            self.frames += int(n_new.sum())
            return super().__call__(codes, slots, n_new)

        def stats(self):
            return {"hits": self.hits, "fallbacks": {"no bucket": 3}, "frames": self.frames, "padded_frames": self.padded,
                    "pool_bytes": 1234}

    core = StreamEngine(model, runner=Graphs(model, StatePool(model, 2)), max_step_frames=8, max_batch_frames=16)

    async def go() -> str:
        async with AsyncEngine(core) as eng:
            await eng.open("a")
            await eng.push("a", torch.from_numpy(codes_of(5)))
            await eng.finish("a")
            return _Metrics(Service(eng)).render().decode()

    text = asyncio.run(go())
    assert metric(text, "code2wav_graph_replays_total") == 1
    assert metric(text, "code2wav_graph_padded_frames_total") == 16
    assert metric(text, "code2wav_graph_frames_total") == 5  # 5 of the 16 padded frames were real
    assert 'code2wav_graph_fallbacks_total{reason="no bucket"} 3.0' in text
    assert metric(text, "code2wav_graph_pool_bytes") == 1234
    eager = StreamEngine(model, max_streams=1)
    assert "code2wav_graph" not in asyncio.run(_render(eager))  # the eager runner: no graph metrics


async def _render(core) -> str:
    from code2wav.engine.async_engine import AsyncEngine
    from code2wav.server.metrics import _Metrics
    from code2wav.server.service import Service

    async with AsyncEngine(core) as eng:
        return _Metrics(Service(eng)).render().decode()
