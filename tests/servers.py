"""A real ``code2wav serve`` process on 127.0.0.1 for the service tests: started on a free port
with a checkpoint and extra CLI options, waited for through ``/health``, stopped with SIGTERM.
``entry`` replaces ``-m code2wav.cli`` (e.g. the fault-injecting ``tests/fault_server.py``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``env``: environment variables for the server (e.g. ``CODE2WAV_MAX_BODY_BYTES``); the
    caller's own ``CODE2WAV_*`` settings are not passed on (the cache's location aside).
    ``entry``: how Python starts the server (a test's own entry may wrap ``serve``)."""

    def __init__(self, ckpt: Path, log: Path, *extra: str, env: dict[str, str] | None = None,
                 entry: Sequence[str] = ("-m", "code2wav.cli")):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        base = {k: v for k, v in os.environ.items() if not k.startswith("CODE2WAV_") or k == "CODE2WAV_CACHE"}
        env = {**base, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "MKL_NUM_THREADS": "1", **(env or {})}
        self.log = log
        self._logf = open(log, "wb")
        cmd = [sys.executable, *entry, "serve", "--model", str(ckpt), "--port", str(self.port), "--dtype", "float32",
               "--log-level", "warning", *extra]
        self.proc = subprocess.Popen(cmd, stdout=self._logf, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout: float = 90) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.log.read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._logf.close()
