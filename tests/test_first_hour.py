"""A new user's first hour (issue 17, items 9-13): what the bench writes, one 16-bit quantizer for
the CLI and the service, one-line errors and back-off in ``bench`` and ``loadtest``, a hub id
that fails fast offline, and the basics (``--version``, LICENSE, ``py.typed``, environment
defaults for ``serve``, ``--threads``, the pcm media type). The service parts run against one
real ``code2wav serve`` process on 127.0.0.1."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from code2wav.cli import build_parser, main
from code2wav.report import Result
from tests.models import one_thread, random_codes
from tests.servers import Server, _free_port

REPO = Path(__file__).resolve().parent.parent
SPF, SR = 1920, 24000
KEY = "first-hour"
BODY_LIMIT = 20_000  # CODE2WAV_MAX_BODY_BYTES of the module's server


@pytest.fixture(autouse=True)
def _threads():
    with one_thread():
        yield


def codes_npy(tmp_path: Path, frames: int, name: str = "c.npy") -> str:
    p = tmp_path / name
    np.save(p, random_codes(frames, seed=4).numpy())
    return str(p)


def one_error_line(err: str) -> str:
    """stderr held exactly one line, a ``code2wav: error:`` one (no traceback); returns it."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("code2wav: error: "), err
    return lines[0]


def bench_args(ckpt: Path, out: Path, *extra: str) -> list[str]:
    return ["bench", "--model", str(ckpt), "--device", "cpu", "--dtype", "float32", "--levels", "1", "--frames", "3", "--chunks", "1,2",
            "--stagger-ms", "0", "--out", str(out), *extra]


# -- 9: what the bench writes ---------------------------------------------------------------------


def _no_nan(text: str) -> object:
    def refuse(name: str):
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_bench_writes_strict_json_and_says_when_the_plot_is_skipped(ckpt, tmp_path, capsys, monkeypatch):
    """results.json is JSON (a figure with no value is null, not NaN), and without matplotlib the
    bench says that plot.png was skipped, why, and what to install."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    out = tmp_path / "out"
    assert main(bench_args(ckpt, out, "--modes", "windowed")) == 0
    captured = capsys.readouterr()
    rows = _no_nan((out / "results.json").read_text())["results"]
    assert rows and rows[0]["padding_pct"] is None and rows[0]["mem_peak_mb"] is None  # no graphs, no CUDA
    for line in captured.out.splitlines():  # the per-row JSON lines too
        if line.startswith("{"):
            _no_nan(line)
    assert not (out / "plot.png").exists()
    assert re.search(r"plot\.png.*skipped.*matplotlib.*code2wav\[bench\]", captured.err), captured.err


def test_bench_plot_has_plain_ticks_units_one_series_per_mode_and_prefix_and_a_title(tmp_path):
    pytest.importorskip("matplotlib")
    from code2wav.report import figure, plot

    fields = {f: 1.0 for f in Result.__dataclass_fields__}
    results = [Result(**fields | {"mode": mode, "concurrency": c, "prefix_frames": p, "throughput_x": 10.0 * c, "ttfp_p50_ms": 2.0 + c})
               for mode in ("exact-eager", "windowed") for p in (0, 72) for c in (1, 4, 16, 64, 256)]
    fig = figure(results, "cpu, float32; 101 frames a stream")
    fig.canvas.draw()
    throughput, ttfp = fig.axes
    for ax in (throughput, ttfp):
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "4", "16", "64", "256"]
        assert ax.get_xlabel() == "concurrent streams"
        labels = [line.get_label() for line in ax.get_lines()]
        assert len(labels) == len(set(labels)) == 4 and any("72" in label for label in labels)
        assert all("$" not in t.get_text() for t in ax.get_yticklabels())  # plain numbers, not 10^k
    assert "real time" in throughput.get_ylabel() and "(ms)" in ttfp.get_ylabel()
    assert "cpu, float32; 101 frames a stream" in fig._suptitle.get_text()
    assert plot(results, tmp_path / "plot.png", "cpu") is None and (tmp_path / "plot.png").stat().st_size > 0


def test_the_bench_extra_brings_matplotlib_and_the_test_extra_installs_it():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("matplotlib") for d in extras["bench"])
    assert any(re.fullmatch(r"code2wav\[([a-z,]*,)?bench(,[a-z,]*)?\]", d) for d in extras["test"]), extras["test"]


# -- 10: one quantizer -------------------------------------------------------------------------------


def test_cli_wav_and_flac_hold_the_services_16_bit_samples(ckpt, tmp_path):
    """The CLI's .wav and .flac samples are the integers the service's encoder makes from the
    same audio (the .npy holds it unquantized), through one quantizer that needs no web stack."""
    from code2wav import audio
    from code2wav.server import audio as service_audio

    assert service_audio.to_int16 is audio.to_int16
    codes = codes_npy(tmp_path, 9)
    for ext in (".npy", ".wav", ".flac"):
        assert main(["decode", codes, "-o", str(tmp_path / f"o{ext}"), "--model", str(ckpt)]) == 0
    samples = torch.from_numpy(np.load(tmp_path / "o.npy"))
    want = audio.to_int16(samples)
    assert np.abs(want).max() > 1000  # audio, not silence
    for fmt in ("wav", "flac"):
        cli, sr = sf.read(tmp_path / f"o.{fmt}", dtype="int16")
        service, _ = sf.read(io.BytesIO(service_audio.encode_file(samples, fmt, SR)), dtype="int16")
        assert sr == SR and np.array_equal(cli, want) and np.array_equal(service, want), fmt
    probe = "import sys, code2wav.audio, code2wav.files; print(sorted(m for m in ('fastapi', 'uvicorn', 'starlette') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO).stdout.strip() == "[]"


# -- 11: bench and loadtest errors ------------------------------------------------------------------

BAD_BENCH = {
    "unknown_mode": (["--modes", "exact"], "unknown mode"),
    "frames": (["--frames", "0"], "--frames"),
    "negative_frames": (["--frames", "-3"], "--frames"),
    "wait": (["--first-chunk-wait-ms", "x"], "--first-chunk-wait-ms"),
    "bad_device": (["--device", "foo"], "--device"),
    "stagger": (["--stagger-ms", "-1"], "--stagger-ms"),
    "seconds": (["--seconds", "-1"], "--seconds"),
    "pace": (["--pace", "-1"], "--pace"),
    "batch": (["--max-batch-frames", "0"], "--max-batch-frames"),
    "graph_on_cpu": (["--modes", "exact-graph"], "CUDA"),
    "threads": (["--threads", "0"], "--threads: expected a positive integer"),
}


@pytest.mark.parametrize("case", list(BAD_BENCH))
def test_bench_bad_arguments_are_one_line_errors(ckpt, tmp_path, capsys, case):
    extra, expect = BAD_BENCH[case]
    assert main(bench_args(ckpt, tmp_path / "out", "--modes", "windowed", *extra)) == 2
    assert expect in one_error_line(capsys.readouterr().err)


def test_bench_out_that_is_a_file_is_a_one_line_error(ckpt, tmp_path, capsys):
    (tmp_path / "taken").write_text("")
    assert main(bench_args(ckpt, tmp_path / "taken", "--modes", "windowed")) == 2
    assert "--out" in one_error_line(capsys.readouterr().err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_bench_on_cpu_skips_exact_graph_and_says_why(ckpt, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(bench_args(ckpt, out, "--modes", "exact-graph,windowed")) == 0
    assert re.search(r"exact-graph.*skipped.*CUDA", capsys.readouterr().err)
    assert {r["mode"] for r in json.loads((out / "results.json").read_text())["results"]} == {"windowed"}
    assert main(bench_args(ckpt, out, "--device", "cuda")) == 2
    assert "CUDA is not available" in one_error_line(capsys.readouterr().err)


@pytest.fixture(scope="module")
def server(ckpt, tmp_path_factory):
    """One slot, a key, and limits from the environment (the flag wins over CODE2WAV_MAX_STREAMS)."""
    s = Server(ckpt, tmp_path_factory.mktemp("logs") / "serve.log", "--max-streams", "1", "--api-key", KEY,
               env={"CODE2WAV_MAX_STREAMS": "7", "CODE2WAV_MAX_BODY_BYTES": str(BODY_LIMIT)})
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def wait_slot_free(url: str) -> None:
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).text
        if re.search(r"^code2wav_pool_slots_in_use 0(\.0)?$", text, re.M):
            return
        time.sleep(0.05)
    raise AssertionError("the slot was not freed")


def test_loadtest_reads_the_key_from_the_environment_and_backs_off_a_full_pool(server, tmp_path, monkeypatch, capsys):
    """Three workers against one slot for 2 s: a refused worker waits the server's Retry-After
    (1 s) before it tries again, so there are at most 3 refusals a worker, not thousands."""
    monkeypatch.setenv("CODE2WAV_API_KEY", KEY)
    summary = tmp_path / "load.json"
    rc = main(["loadtest", "--server", server.url, "--streams", "3", "--seconds", "2", "--frames", "30", "--json", str(summary)])
    res = _no_nan(summary.read_text())
    assert rc in (0, 1) and res["streams_served"] >= 1, capsys.readouterr()
    assert set(res["errors"]) <= {"pool_full"} and res["errors"].get("pool_full", 0) <= 3 * (2 + 1), res["errors"]
    wait_slot_free(server.url)


def test_loadtest_and_bench_report_refused_keys_and_unreachable_servers_in_one_line(server, capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("CODE2WAV_API_KEY", raising=False)
    closed = f"http://127.0.0.1:{_free_port()}"
    cases = [
        (["loadtest", "--server", server.url, "--seconds", "1"], "401"),
        (["loadtest", "--server", server.url, "--seconds", "1", "--api-key", "wrong"], "401"),
        (["bench", "--server", server.url, "--levels", "1", "--out", str(tmp_path)], "401"),
        (["loadtest", "--server", closed, "--seconds", "1"], "cannot reach"),
        (["bench", "--server", closed, "--levels", "1", "--out", str(tmp_path)], "cannot reach"),
        (["loadtest", "--server", "127.0.0.1:8091"], "--server"),
        (["loadtest", "--server", server.url, "--streams", "0"], "--streams"),
        (["loadtest", "--server", server.url, "--seconds", "-1"], "--seconds"),
        (["loadtest", "--server", server.url, "--prefix", "-1"], "--prefix"),
    ]
    for argv, expect in cases:
        assert main(argv) == 2, argv
        line = one_error_line(capsys.readouterr().err)
        assert expect in line, (argv, line)
        if expect == "401":
            assert "CODE2WAV_API_KEY" in line
    wait_slot_free(server.url)


# -- 12: a hub id without network ----------------------------------------------------------------------


@pytest.mark.parametrize("offline", [False, True], ids=["hub-unreachable", "HF_HUB_OFFLINE"])
def test_a_hub_id_without_network_fails_at_once_in_one_line(tmp_path, offline):
    """No retries (huggingface_hub logs "Retrying in Ns" for each), one line that says what
    happened and what to do. Unreachable: a hub endpoint on a closed loopback port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "CODE2WAV_"))}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=f"http://127.0.0.1:{_free_port()}", OMP_NUM_THREADS="1")
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    cmd = [sys.executable, "-m", "code2wav", "decode", codes_npy(tmp_path, 2), "-o", str(tmp_path / "o.wav"), "--model", "someone/no-such-model"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert r.returncode == 2 and "Retrying" not in r.stderr, r.stderr
    line = one_error_line(r.stderr)
    assert "someone/no-such-model" in line and "--model PATH" in line
    assert ("HF_HUB_OFFLINE" if offline else "cannot reach the Hugging Face hub") in line, line


# -- 13: the basics ---------------------------------------------------------------------------------------


def test_version(capsys):
    import importlib.metadata

    import code2wav

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"code2wav {code2wav.__version__}\n"
    try:
        assert importlib.metadata.version("code2wav") == code2wav.__version__  # one version: the package's
    except importlib.metadata.PackageNotFoundError:
        pass


def test_the_package_has_a_license_and_py_typed():
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0" and project["project"]["license-files"] == ["LICENSE"]
    assert (REPO / "code2wav" / "py.typed").is_file() and "py.typed" in project["tool"]["setuptools"]["package-data"]["code2wav"]


def test_the_wheel_ships_the_license_and_py_typed(tmp_path):
    """A wheel built from the package's files holds ``code2wav/py.typed`` and the Apache-2.0
    LICENSE (built offline, without build isolation, from a copy of what the wheel is made of)."""
    pytest.importorskip("setuptools", minversion="77")  # the SPDX license; torch itself needs it
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "code2wav", src / "code2wav", ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(tmp_path / "dist"), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    import zipfile

    (wheel,) = (tmp_path / "dist").glob("code2wav-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (metadata,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        assert "License-Expression: Apache-2.0" in z.read(metadata).decode()
    assert "code2wav/py.typed" in names and any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names


def test_serve_reads_host_port_and_limits_from_the_environment_and_flags_win(monkeypatch, capsys):
    env = {"CODE2WAV_HOST": "0.0.0.0", "CODE2WAV_PORT": "9123", "CODE2WAV_MAX_STREAMS": "3", "CODE2WAV_IDLE_TIMEOUT": "0",
           "CODE2WAV_MAX_MESSAGE_BYTES": "4096", "CODE2WAV_MAX_STREAM_FRAMES": "100", "CODE2WAV_MAX_BODY_BYTES": "2048", "CODE2WAV_THREADS": "2"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    a = build_parser().parse_args(["serve"])
    assert (a.host, a.port, a.max_streams, a.idle_timeout, a.max_message_bytes, a.max_stream_frames, a.max_body_bytes, a.threads) == (
        "0.0.0.0", 9123, 3, 0.0, 4096, 100, 2048, 2)
    a = build_parser().parse_args(["serve", "--host", "127.0.0.2", "--port", "1234", "--max-streams", "5", "--threads", "1"])
    assert (a.host, a.port, a.max_streams, a.threads) == ("127.0.0.2", 1234, 5, 1)
    monkeypatch.setenv("CODE2WAV_PORT", "eighty")
    assert main(["serve"]) == 2
    assert "CODE2WAV_PORT" in one_error_line(capsys.readouterr().err)


def test_a_limit_from_the_environment_reaches_the_service(server):
    import httpx

    health = httpx.get(server.url + "/health", timeout=30).json()
    assert health["max_streams"] == 1  # --max-streams 1 wins over CODE2WAV_MAX_STREAMS=7
    big = {"codes": random_codes(400, seed=2).tolist()}
    assert len(json.dumps(big)) > BODY_LIMIT
    r = httpx.post(server.url + "/v1/decode", json=big, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 413 and r.json()["code"] == "body_too_big"


def test_threads_option_sets_torchs_cpu_threads(ckpt, tmp_path):
    before = torch.get_num_threads()
    try:
        assert main(["decode", codes_npy(tmp_path, 2), "-o", str(tmp_path / "o.npy"), "--model", str(ckpt), "--threads", "2"]) == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert build_parser().parse_args(["bench", "--threads", "3"]).threads == 3


def test_pcm_responses_name_rate_and_channels(server):
    from code2wav.client import Client

    wait_slot_free(server.url)
    codes = random_codes(3, seed=6).numpy()
    with Client(server.url, api_key=KEY) as c:
        for stream in (False, True):
            r = c.http.post("/v1/decode", json={"codes": codes.tolist(), "format": "pcm", "stream": stream})
            assert r.status_code == 200 and r.headers["content-type"] == "audio/L16;rate=24000;channels=1", r.headers
            assert len(r.content) == 3 * SPF * 2
        assert len(c.decode(codes, format="pcm")) == 3 * SPF * 2  # the client still reads it
        assert len(b"".join(c.decode_stream(codes, format="pcm"))) == 3 * SPF * 2
