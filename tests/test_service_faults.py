"""The service under faults (issue 17): the engine's worker dies, and SIGTERM. Against real server
processes on 127.0.0.1; each server test ends its process, so each has its own (all three start
together). The worker failure is injected by ``tests/fault_server.py`` (``code2wav serve``'s own
code path plus one step hook), which nothing in the package can reach."""

from __future__ import annotations

import asyncio
import io
import json
import re
import signal
import socket
import subprocess
import threading
import time
from urllib.parse import urlsplit

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("websockets")
pytest.importorskip("httpx")

import httpx  # noqa: E402
import torch  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from code2wav.engine.async_engine import AsyncEngine, EngineFailed  # noqa: E402
from code2wav.stream.engine import StreamEngine  # noqa: E402
from tests.models import SMALL, model, one_thread, random_codes  # noqa: E402
from tests.servers import Server  # noqa: E402

EXIT_ENGINE_FAILED = 70  # code2wav.server.run.EXIT_ENGINE_FAILED (docs/protocol.md)
DEADLINE = 60  # seconds: generous bounds for events that take well under a second unloaded
FAULT = ("-m", "tests.fault_server")


@pytest.fixture(scope="module")
def servers(ckpt, tmp_path_factory):
    """Started together (their start is mostly importing torch); each test below ends one.
    ``failing``: the worker dies at its 2nd step. ``draining``: a plain ``code2wav serve`` whose
    drain lasts as long as a request stays in flight. ``bounded``: steps of at least 0.1 s, so a
    long decode outlasts its 1 s drain."""
    d = tmp_path_factory.mktemp("logs")
    started = {
        "failing": Server(ckpt, d / "failing.log", "--shutdown-timeout", str(DEADLINE), entry=(*FAULT, "die_after_steps=2")),
        "draining": Server(ckpt, d / "draining.log", "--shutdown-timeout", str(DEADLINE)),
        "bounded": Server(ckpt, d / "bounded.log", "--shutdown-timeout", "1", entry=(*FAULT, "slow_steps=0.1")),
    }
    try:
        for s in started.values():
            s.wait_ready()
        yield started
    finally:
        for s in started.values():
            if s.proc.poll() is None:
                s.proc.kill()
            s.stop()


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=DEADLINE).text
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} not in metrics"
    return float(m.group(1))


def wait_for(cond, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < DEADLINE, f"not within {DEADLINE} s: {what}"
        time.sleep(0.05)


def exit_code(s: Server) -> int:
    try:
        return s.proc.wait(DEADLINE)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server did not exit within {DEADLINE} s:\n{s.log.read_text()}")


class HeldPost:
    """A ``POST /v1/decode`` whose body stays half sent until :meth:`release`: a request in
    flight for exactly as long as the test wants (the server's drain waits for it)."""

    def __init__(self, url: str, codes: np.ndarray):
        u = urlsplit(url)
        body = json.dumps({"codes": codes.tolist()}).encode()
        self.sock = socket.create_connection((u.hostname, u.port), timeout=DEADLINE)
        head = (f"POST /v1/decode HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        self.sock.sendall(head + body[: len(body) // 2])
        self.rest = body[len(body) // 2 :]

    def release(self) -> tuple[int, dict[str, str], bytes]:
        """Send the rest of the body; the response's status, headers and body."""
        self.sock.sendall(self.rest)
        data = b""
        while chunk := self.sock.recv(1 << 16):  # the server closes after its answer (Connection: close)
            data += chunk
        self.sock.close()
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        return int(lines[0].split()[1]), headers, body


def ws_connect(url: str):
    return connect(url.replace("http", "ws") + "/v1/stream", open_timeout=DEADLINE)


def opened(ws):
    ws.send(json.dumps({"op": "open"}))
    assert json.loads(ws.recv(timeout=DEADLINE))["type"] == "opened"
    return ws


def error_then_close(ws) -> tuple[dict, int]:
    """Read (skipping audio) up to the stream's error message; it and the close code that follows."""
    for _ in range(100):
        msg = ws.recv(timeout=DEADLINE)
        if isinstance(msg, str):
            break
    else:
        pytest.fail("no error message")
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=DEADLINE)
    return json.loads(msg), closed.value.rcvd.code


def frames_bytes(n: int, seed: int = 1) -> bytes:
    return random_codes(n, seed=seed).numpy().astype("<i2").tobytes()


# -- item 2: the engine's worker dies ---------------------------------------------------------------


def test_a_dead_worker_fails_every_request_turns_health_unhealthy_and_ends_the_process(servers):
    s = servers["failing"]
    with ws_connect(s.url) as ws:
        _dead_worker(s, opened(ws))


def _dead_worker(s: Server, ws) -> None:
    held = HeldPost(s.url, random_codes(5, seed=2).numpy())
    wait_for(lambda: metric(s.url, "code2wav_requests_in_flight") == 2, "the held request in flight")
    assert httpx.get(s.url + "/health").status_code == 200
    ws.send(frames_bytes(3))
    assert len(ws.recv(timeout=DEADLINE)) == 3 * 1920 * 2  # step 1: audio
    ws.send(frames_bytes(3))  # step 2: the worker dies
    err, code = error_then_close(ws)
    assert (err["type"], err["code"], code) == ("error", "engine_failed", 1011)

    r = httpx.get(s.url + "/health")  # the stream's error came after the failure was known
    body = r.json()
    assert r.status_code == 503 and (body["status"], body["code"]) == ("failed", "engine_failed")
    assert body["active_streams"] == 0  # the stream's slot is free
    assert metric(s.url, "code2wav_pool_slots_in_use") == 0
    r = httpx.post(s.url + "/v1/decode", json={"codes": random_codes(2).tolist()})
    assert r.status_code == 503 and r.json()["code"] == "engine_failed" and r.headers["retry-after"] == "1"
    with ws_connect(s.url) as late:
        assert error_then_close(late)[0]["code"] == "engine_failed"

    status, headers, raw = held.release()  # the process waited for it: it is answered, not cut
    assert status == 503 and json.loads(raw)["code"] == "engine_failed"
    assert exit_code(s) == EXIT_ENGINE_FAILED  # non-zero: a supervisor restarts it
    assert "InjectedFault" in s.log.read_text()  # the cause is logged


def test_a_failed_worker_loop_fails_queued_chunks_and_every_later_call():
    """In process, a failure outside the decode's own handler (here the take of pending chunks):
    the chunk queued fails, the slot is freed, the hook runs, later calls raise at once."""
    m = model(SMALL, torch.float32)

    async def go():
        core = StreamEngine(m, max_streams=2)
        async with AsyncEngine(core) as eng:
            failures: list[EngineFailed] = []
            eng.on_failure.append(failures.append)

            def broken(*args):
                raise RuntimeError("bug in the scheduler")

            eng._take = broken  # type: ignore[method-assign]
            await eng.open("a")
            fut = eng.submit("a", random_codes(3))
            with pytest.raises(EngineFailed) as e:
                await asyncio.wait_for(fut, DEADLINE)
            assert e.value.code == "engine_failed" and "RuntimeError: bug in the scheduler" in str(e.value)
            assert [f.code for f in failures] == ["engine_failed"] and core.active == 0
            assert eng.stats.errors.get("engine_failed") == 1
            with pytest.raises(EngineFailed):
                await eng.open("b")
            with pytest.raises(EngineFailed):
                eng.submit("a", random_codes(3))

    with one_thread():
        asyncio.run(go())


# -- item 7: SIGTERM ---------------------------------------------------------------------------------


def test_sigterm_ends_streams_with_shutdown_answers_503_while_draining_and_exits_0(servers):
    """A stream in flight and a kept connection waiting for its next ``open`` both hear
    ``shutdown`` (close 1012); an HTTP request in flight is served in full; exit 0."""
    s = servers["draining"]
    with ws_connect(s.url) as ws, ws_connect(s.url) as kept:
        kept.send(json.dumps({"op": "open", "keep_open": True}))
        assert json.loads(kept.recv(timeout=DEADLINE))["type"] == "opened"
        kept.send(json.dumps({"op": "end"}))
        assert json.loads(kept.recv(timeout=DEADLINE))["type"] == "done"  # now between streams
        _drain(s, opened(ws), connections=2)
        err, code = error_then_close(kept)
        assert (err["type"], err["code"], code) == ("error", "shutdown", 1012)


def _drain(s: Server, ws, connections: int = 1) -> None:
    ws.send(frames_bytes(2))
    assert len(ws.recv(timeout=DEADLINE)) == 2 * 1920 * 2
    held = HeldPost(s.url, random_codes(5, seed=3).numpy())
    wait_for(lambda: metric(s.url, "code2wav_requests_in_flight") == connections + 1, "the held request in flight")

    s.proc.send_signal(signal.SIGTERM)
    err, code = error_then_close(ws)
    assert (err["type"], err["code"], code) == ("error", "shutdown", 1012)
    r = httpx.get(s.url + "/health")  # still listening: the drain waits for the held request
    assert r.status_code == 503 and (r.json()["status"], r.json()["code"]) == ("draining", "shutdown")
    r = httpx.post(s.url + "/v1/decode", json={"codes": random_codes(2).tolist()})
    assert r.status_code == 503 and r.json()["code"] == "shutdown" and r.headers["retry-after"] == "1"
    with ws_connect(s.url) as late:
        err, code = error_then_close(late)
        assert (err["code"], code) == ("shutdown", 1012)

    status, headers, raw = held.release()  # a request in flight when the signal came is served in full
    assert status == 200 and headers["x-frames"] == "5" and len(raw) == 44 + 5 * 1920 * 2
    assert exit_code(s) == 0  # a clean drain


def test_sigterm_ends_a_decode_that_outlasts_the_shutdown_timeout_and_exits_0(servers):
    s = servers["bounded"]
    buf = io.BytesIO()
    np.save(buf, random_codes(4000, seed=4).numpy().astype(np.int16))  # 160 chunks of >= 0.1 s steps
    answer: dict = {}

    def post():
        answer["r"] = httpx.post(s.url + "/v1/decode", content=buf.getvalue(), headers={"Content-Type": "application/x-npy"}, timeout=DEADLINE)

    t = threading.Thread(target=post)
    t.start()
    try:
        wait_for(lambda: metric(s.url, "code2wav_active_streams") == 1, "the decode running")
        s.proc.send_signal(signal.SIGTERM)
    finally:
        t.join(DEADLINE)
    r = answer["r"]
    assert r.status_code == 503 and r.json()["code"] == "shutdown" and r.headers["retry-after"] == "1"
    assert exit_code(s) == 0


def test_stop_hooks_run_once_on_drain_and_at_once_after_it():
    """``Service.on_stop``: a hook runs once, on the drain, with its error; one taken back does
    not run; one added after the drain runs at once (a session that connects while the service
    drains ends at once, as one waiting on ``stopping()`` did)."""
    from code2wav.server.service import Service

    async def main():
        core = StreamEngine(model(SMALL, torch.float32), max_streams=1)
        service = Service(AsyncEngine(core))
        seen: list[tuple[str, str]] = []
        service.on_stop(lambda e: seen.append(("a", e.code)))
        take_back = service.on_stop(lambda e: seen.append(("b", e.code)))
        take_back()
        service.begin_drain()
        service.begin_drain()  # a second signal: the hooks do not run again
        service.on_stop(lambda e: seen.append(("c", e.code)))
        assert (await service.stopping()).code == "shutdown"
        return seen

    assert asyncio.run(main()) == [("a", "shutdown"), ("c", "shutdown")]


def test_a_stream_the_engine_ended_on_its_own_neither_breaks_a_drain_nor_the_engines_stop():
    """The core may end a stream its caller still holds (reaped for idling, a failed prefill).
    Aborting it then is a no-op; a drain (SIGTERM's path) still ends every other stream; the
    engine's stop frees the rest and stops its worker. Before: the first such abort raised
    ``stream_ended`` out of the drain and the stop, leaving the other streams and the worker."""
    from code2wav.server.service import Service

    async def main():
        core = StreamEngine(model(SMALL, torch.float32), max_streams=3, idle_timeout=60.0)
        eng = AsyncEngine(core)
        async with eng:
            for rid in ("reaped", "open", "also_reaped"):
                await eng.open(rid)
            for rid in ("reaped", "also_reaped"):
                core._streams[rid].last_active -= 3600  # idle for an hour: the next reap ends them
            assert sorted(core.reap_idle()) == ["also_reaped", "reaped"] and eng.streams == ["reaped", "open", "also_reaped"]
            await eng.abort("reaped")  # the caller's own abort, after the reaper's: nothing left to do
            assert await Service(eng).drain(timeout=0) and core.active == 0 and eng.streams == []
            await eng.open("late")
            core._streams["late"].last_active -= 3600
            assert core.reap_idle() == ["late"]
        assert eng._thread is None and core.active == 0 and core.pool.in_use == 0  # the stop ran to its end

    with one_thread():
        asyncio.run(main())


def test_a_finish_racing_the_reaper_neither_raises_nor_leaks():
    """The worker's reaper may end an idle stream between the caller's last look at it and its
    finish. The finish then frees nothing, raises nothing and leaves no slot held, as when the
    reaper came first. (Made deterministic: the core's finish reaps before it runs.)"""

    async def main():
        core = StreamEngine(model(SMALL, torch.float32), max_streams=2, idle_timeout=60.0)
        finish = core.finish

        def reaped_first(rid, frames=None):
            core._streams[rid].last_active -= 3600
            assert core.reap_idle() == [rid]
            return finish(rid, frames)

        core.finish = reaped_first
        async with AsyncEngine(core) as eng:
            await eng.open("a")
            await eng.push("a", torch.zeros(2, core.cfg.num_quantizers, dtype=torch.long))
            assert (await eng.finish("a")).numel() == 0
            assert eng.streams == [] and core.active == 0 and core.pool.in_use == 0
            await eng.open("b")  # the engine goes on
            assert (await eng.push("b", torch.zeros(1, core.cfg.num_quantizers, dtype=torch.long))).numel() > 0

    with one_thread():
        asyncio.run(main())
