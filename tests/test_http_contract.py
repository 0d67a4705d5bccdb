"""``POST /v1/decode`` under dropped clients, concurrent requests and malformed input, against a
real ``code2wav serve`` process on 127.0.0.1: a dropped request is aborted (its slot freed, its
frames no longer decoded), requests past ``--max-http-requests`` are refused ``busy``, and every
malformed input, over HTTP and the WebSocket, gets the documented status, code and error body."""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("websockets")
pytest.importorskip("httpx")

import httpx  # noqa: E402

from tests.models import random_codes  # noqa: E402
from tests.servers import Server  # noqa: E402

KEY = "k3y"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_HTTP = 2
SPF = 1920


@pytest.fixture(scope="module")
def server(ckpt, tmp_path_factory):
    s = Server(ckpt, tmp_path_factory.mktemp("logs") / "server.log", "--max-streams", "4", "--api-key", KEY, "--max-http-requests", str(MAX_HTTP))
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
        yield c


def metric(http: httpx.Client, name: str) -> float:
    text = http.get("/metrics").text
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} not in metrics"
    return float(m.group(1))


def wait_for(cond, what: str, timeout: float = 60) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"not within {timeout} s: {what}"
        time.sleep(0.02)


def idle(http: httpx.Client) -> bool:
    return all(metric(http, m) == 0 for m in ("code2wav_pool_slots_in_use", "code2wav_active_streams", "code2wav_http_requests_in_progress"))


def raw_post(server: Server, body: bytes, ctype: str = "application/json", length: int | None = None) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port))
    head = (f"POST /v1/decode HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n\r\n")
    s.sendall(head.encode() + body)
    return s


def npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


# -- item 1: a client that goes away ----------------------------------------------------------------


def test_a_dropped_post_is_aborted_and_frees_its_slot(server, http):
    """Plain and streamed: the client closes its socket early; the slot is freed and decoding
    stops well short of the request's frames (through /metrics)."""
    n = 2000
    for streamed in (False, True):
        body = json.dumps({"codes": random_codes(n, seed=5).tolist(), "format": "pcm", "stream": streamed}).encode()
        before = metric(http, "code2wav_decoded_frames_total")
        s = raw_post(server, body)
        if streamed:
            assert s.recv(64).startswith(b"HTTP/1.1 200"), "streamed response did not start"
        else:
            wait_for(lambda: metric(http, "code2wav_decoded_frames_total") > before, "decoding started")  # noqa: B023
        s.close()
        wait_for(lambda: metric(http, "code2wav_pool_slots_in_use") == 0, "the dropped request's slot freed")
        # A request decoded after the drop has waited for any step that held the dropped one's row.
        assert http.post("/v1/decode", json={"codes": random_codes(2).tolist(), "format": "pcm"}).status_code == 200
        decoded = metric(http, "code2wav_decoded_frames_total") - before - 2
        assert decoded < n / 2, f"{'streamed' if streamed else 'plain'}: {decoded:.0f} of {n} frames decoded after the client left"
        wait_for(lambda: idle(http), "nothing left in progress")


# -- item 3: concurrent requests are bounded ------------------------------------------------------


def test_requests_past_the_limit_are_refused_busy(server, http):
    held = [raw_post(server, b'{"codes": ', length=10_000) for _ in range(MAX_HTTP)]  # bodies never finished
    try:
        wait_for(lambda: metric(http, "code2wav_http_requests_in_progress") == MAX_HTTP, "both requests admitted")
        r = http.post("/v1/decode", json={"codes": random_codes(2).tolist(), "format": "pcm"})
        assert r.status_code == 503 and r.headers["retry-after"], r.text
        assert r.json() == {"type": "error", "code": "busy", "message": r.json()["message"]} and "max-http-requests" in r.json()["message"]
    finally:
        for s in held:
            s.close()
    wait_for(lambda: idle(http), "the held requests ended")
    assert len(http.post("/v1/decode", json={"codes": random_codes(2).tolist(), "format": "pcm"}).content) == 2 * SPF * 2
    assert 'code2wav_errors_total{code="busy"} 1.0' in http.get("/metrics").text


def test_a_large_body_parsed_off_the_loop_decodes_as_a_small_one(http):
    codes = random_codes(300, seed=9).numpy()
    small = http.post("/v1/decode?format=f32le", content=npy(codes.astype(np.int16)), headers={"content-type": "application/octet-stream"})
    large = json.dumps({"codes": codes.tolist(), "format": "f32le"}, indent=8).encode()  # over the inline size: a worker parses it
    assert len(large) > 64 << 10
    r = http.post("/v1/decode", content=large, headers={"content-type": "application/json"})
    assert small.status_code == r.status_code == 200 and r.content == small.content and len(r.content) == 300 * SPF * 4
    bad = codes.copy()
    bad[123, 4] = 4096
    r = http.post("/v1/decode", content=json.dumps({"codes": bad.tolist()}, indent=8).encode(), headers={"content-type": "application/json"})
    assert (r.status_code, r.json()["code"]) == (400, "out_of_range") and "4096" in r.json()["message"]


# -- item 5: the error contract ------------------------------------------------------------------------

ROW = [1] * 16
PADDED_INSIDE = np.array([ROW, [-1] * 16, ROW, [-1] * 16])  # a padding row before a real one
HTTP_CASES = {
    "deep_json_small": (dict(content=b'{"codes": ' + b"[" * 5000 + b"]" * 5000 + b"}"), 400, "bad_json"),
    "deep_json_large": (dict(content=b'{"codes": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), 400, "bad_json"),
    "npy_0d": (dict(content=npy(np.array(5)), ctype="application/octet-stream"), 400, "bad_shape"),
    "code_2**64": (dict(json={"codes": [[2**64] * 16]}), 400, "out_of_range"),
    "code_-2**64": (dict(json={"codes": [ROW, [-(2**64)] + ROW[1:]]}), 400, "out_of_range"),
    "codes_past_int64_both_ways": (dict(json={"codes": [ROW, [2**63] + ROW[1:], [5, -1] + ROW[2:]]}), 400, "out_of_range"),
    "npy_padding_inside": (dict(content=npy(PADDED_INSIDE), ctype="application/octet-stream"), 400, "bad_padding"),
    "json_padding_inside": (dict(json={"codes": PADDED_INSIDE.tolist()}), 400, "bad_padding"),
    "json_codes_empty": (dict(json={"codes": []}), 400, "empty"),
    "query_prefix_frames_not_int": (dict(json={"codes": [ROW]}, query="?prefix_frames=abc"), 400, "bad_query"),
    "query_prefix_frames_negative": (dict(content=npy(np.array([ROW])), ctype="application/octet-stream", query="?prefix_frames=-1"), 400, "bad_query"),
    "query_prefix_frames_past_rows": (dict(content=npy(np.array([ROW])), ctype="application/octet-stream", query="?prefix_frames=5"), 400, "bad_query"),
    "query_stream_not_bool": (dict(json={"codes": [ROW]}, query="?stream=maybe"), 400, "bad_query"),
    "query_format_unknown": (dict(content=npy(np.array([ROW])), ctype="application/octet-stream", query="?format=mp3"), 400, "bad_format"),
    "json_format_unknown": (dict(json={"codes": [ROW], "format": 3}), 400, "bad_format"),
    "json_stream_not_bool": (dict(json={"codes": [ROW], "stream": "yes"}), 400, "bad_message"),
    "json_codes_missing": (dict(json={"format": "wav"}), 400, "bad_message"),
}


def _post(http: httpx.Client, content: bytes | None = None, json: object = None, ctype: str = "application/json", query: str = ""):
    if json is not None:
        return http.post("/v1/decode" + query, json=json)
    return http.post("/v1/decode" + query, content=content, headers={"content-type": ctype})


def _documented(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, (code, r.status_code, r.text[:300])
    assert r.headers["content-type"] == "application/json", r.headers["content-type"]
    body = r.json()
    assert set(body) == {"type", "code", "message"} and (body["type"], body["code"]) == ("error", code) and body["message"], body


@pytest.mark.parametrize("case", list(HTTP_CASES))
def test_malformed_http_input_gets_its_documented_error(http, case):
    kwargs, status, code = HTTP_CASES[case]
    _documented(_post(http, **kwargs), status, code)


def test_unknown_routes_and_methods_get_the_documented_error(server, http):
    _documented(http.get("/nope"), 404, "not_found")
    _documented(http.get("/v1/decode"), 405, "method_not_allowed")
    _documented(httpx.delete(server.url + "/health"), 405, "method_not_allowed")
    text = http.get("/metrics").text
    assert 'code2wav_errors_total{code="not_found"}' in text and 'code2wav_errors_total{code="method_not_allowed"}' in text


def test_auth_is_checked_before_the_query(server):
    r = httpx.post(server.url + "/v1/decode?prefix_frames=abc", json={"codes": [ROW]})
    _documented(r, 401, "unauthorized")


WS_CASES = {
    "deep_json": ('{"op": "push", "frames": ' + "[" * 100_000 + "]" * 100_000 + "}", "bad_json"),
    "code_2**64": (json.dumps({"op": "push", "frames": [[2**64] * 16]}), "out_of_range"),
    "frames_empty": (json.dumps({"op": "push", "frames": []}), "empty"),
}


@pytest.mark.parametrize("case", list(WS_CASES))
def test_malformed_ws_input_gets_its_documented_error(server, http, case):
    from websockets.sync.client import connect

    msg, code = WS_CASES[case]
    with connect(server.url.replace("http", "ws") + "/v1/stream", additional_headers=AUTH, max_size=None) as ws:
        ws.send(json.dumps({"op": "open"}))
        assert json.loads(ws.recv(timeout=30))["type"] == "opened"
        ws.send(msg)
        err = json.loads(ws.recv(timeout=30))
        assert set(err) == {"type", "code", "message"} and (err["type"], err["code"]) == ("error", code), err
        with pytest.raises(Exception) as ei:
            ws.recv(timeout=30)
        assert ei.value.rcvd.code == 1003
    wait_for(lambda: idle(http), "the stream's slot freed")


# -- the models behind it ------------------------------------------------------------------------------


def test_openapi_describes_the_body_and_query(ckpt):
    from code2wav.engine.build import EngineConfig, build_async_engine
    from code2wav.server.app import create_app

    app = create_app(build_async_engine(EngineConfig(model=str(ckpt), max_streams=1, graphs=False)))
    op = app.openapi()["paths"]["/v1/decode"]["post"]
    body = op["requestBody"]["content"]
    assert set(body["application/json"]["schema"]["properties"]) >= {"codes", "prefix", "format", "stream"}
    assert body["application/json"]["schema"]["required"] == ["codes"] and "application/octet-stream" in body
    assert {p["name"] for p in op["parameters"] if p["in"] == "query"} == {"format", "stream", "prefix_frames"}
    assert "422" not in op["responses"]  # validation failures answer the protocol's 400s


@pytest.mark.filterwarnings("ignore:Using `httpx`")  # starlette's test client, not the service
def test_16_bit_formats_are_quantized_by_the_engine(ckpt, monkeypatch):
    """A 16-bit format's stream (``pcm_s16le`` on the WebSocket; ``pcm``, ``wav``, ``flac`` over
    HTTP) opens with ``pcm16``, so the engine quantizes its audio where the step ran and the
    worker only copies bytes; an ``f32le`` stream gets float samples."""
    from starlette.testclient import TestClient

    from code2wav.engine.build import EngineConfig, build_async_engine
    from code2wav.server.app import create_app
    from code2wav.stream.lifecycle import Lifecycle

    seen: list[bool] = []
    real = Lifecycle.open

    def spy(self, request_id, prefix=None, pcm16=False):
        seen.append(pcm16)
        return real(self, request_id, prefix, pcm16=pcm16)

    monkeypatch.setattr(Lifecycle, "open", spy)
    frames = [[k % 7] * 16 for k in range(3)]
    with TestClient(create_app(build_async_engine(EngineConfig(model=str(ckpt), max_streams=1, graphs=False)))) as c:
        for fmt, width in (("pcm_s16le", 2), ("f32le", 4)):
            with c.websocket_connect("/v1/stream") as ws:
                ws.send_json({"op": "open", "format": fmt})
                assert ws.receive_json()["type"] == "opened"
                ws.send_json({"op": "push", "frames": frames})
                assert len(ws.receive_bytes()) == 3 * 1920 * width
                ws.send_json({"op": "end"})
                assert ws.receive_json()["type"] == "done"
        for fmt in ("pcm", "wav", "flac", "f32le"):
            assert c.post(f"/v1/decode?format={fmt}", json={"codes": frames}).status_code == 200, fmt
    assert seen == [True, False, True, True, True, False]


@pytest.mark.filterwarnings("ignore:Using `httpx`")  # starlette's test client, not the service
def test_the_stream_route_is_counted_by_the_gate_and_other_websocket_paths_are_refused(ckpt):
    """``/v1/stream`` is dispatched ahead of FastAPI's router, inside the stop gate: its
    connections count as requests in flight (a drain waits for them); a WebSocket to any other
    path is refused at its handshake."""
    from starlette.testclient import TestClient
    from starlette.websockets import WebSocketDisconnect

    from code2wav.engine.build import EngineConfig, build_async_engine
    from code2wav.server.app import create_app

    app = create_app(build_async_engine(EngineConfig(model=str(ckpt), max_streams=1, graphs=False)))
    service = app.state.service
    with TestClient(app) as c:
        with c.websocket_connect("/v1/stream") as ws:
            ws.send_json({"op": "open"})
            assert ws.receive_json()["type"] == "opened"
            assert service.requests_in_flight == 1
            ws.send_json({"op": "end"})
            assert ws.receive_json()["type"] == "done"
        with pytest.raises(WebSocketDisconnect):
            with c.websocket_connect("/v1/streams"):
                pass
    assert service.requests_in_flight == 0


def test_the_body_parser_loads_neither_torch_nor_the_web_stack():
    from code2wav.server.audio import HTTP_FORMATS
    from code2wav.server.payloads import HTTP_FORMATS as PARSED_FORMATS

    assert PARSED_FORMATS == HTTP_FORMATS
    code = "import sys, code2wav.server.payloads; print(sorted({'torch', 'fastapi', 'starlette'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_serve_refuses_a_non_positive_request_limit(capsys):
    from code2wav.cli import main

    assert main(["serve", "--max-http-requests", "0"]) == 2
    assert "--max-http-requests must be positive" in capsys.readouterr().err


def _children(pid: int) -> set[int]:
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        return b"multiprocessing" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_the_body_parsing_processes_end_with_their_server(ckpt, tmp_path):
    """uvicorn ends on SIGTERM by raising it again (no exit handler runs): the workers go anyway."""
    s = Server(ckpt, tmp_path / "server.log")
    try:
        s.wait_ready()
        large = json.dumps({"codes": random_codes(300).tolist(), "format": "pcm"}, indent=8).encode()
        assert httpx.post(s.url + "/v1/decode", content=large, headers={"content-type": "application/json"}, timeout=60).status_code == 200
        workers = {p for p in _children(s.proc.pid) if _alive(p)}
        assert workers, "no body-parsing process started"
    finally:
        s.stop()
    wait_for(lambda: not any(_alive(p) for p in workers), f"the workers {sorted(workers)} ended", timeout=30)
