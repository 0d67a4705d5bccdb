"""Two first-hour failures of issue 17, measured on any source tree (this one, or an older
checkout for the figures before a fix), all on 127.0.0.1:

1. A hub id with the hub unreachable (``HF_ENDPOINT`` at a closed loopback port, an empty
   Hugging Face cache): seconds until ``code2wav decode`` gives up, its exit status, how many
   "Retrying" lines huggingface_hub logged, and the error line.
2. ``code2wav loadtest`` with N workers for S seconds against a 1-slot ``code2wav serve`` (a
   small random checkpoint): streams served and ``pool_full`` refusals.

python bench/first_hour.py [--tree DIR] [--streams 3] [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.models import write_checkpoint  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(tree: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "CODE2WAV_"))}
    return {**env, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", **extra}


def hub_unreachable(tree: Path, tmp: Path) -> dict:
    codes = tmp / "codes.npy"
    np.save(codes, np.zeros((2, 16), dtype=np.int64))
    env = env_for(tree, HF_HOME=str(tmp / "hf"), HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "code2wav", "decode", str(codes), "-o", str(tmp / "o.wav"), "--model", "someone/no-such-model"],
                       capture_output=True, text=True, env=env, cwd=tree, timeout=600)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    return {"seconds": round(time.perf_counter() - t0, 1), "exit": r.returncode, "retrying_lines": r.stderr.count("Retrying"),
            "stderr_lines": len(lines), "last_line": lines[-1] if lines else ""}


def loadtest_one_slot(tree: Path, tmp: Path, streams: int, seconds: float) -> dict:
    ckpt = write_checkpoint(tmp / "tokenizer")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp / "serve.log", "wb")
    server = subprocess.Popen([sys.executable, "-m", "code2wav.cli", "serve", "--model", str(ckpt), "--port", str(port), "--max-streams", "1",
                               "--dtype", "float32", "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT, env=env_for(tree), cwd=tree)
    try:
        import httpx

        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("server did not start: " + (tmp / "serve.log").read_text())
            time.sleep(0.1)
        out = tmp / "load.json"
        r = subprocess.run([sys.executable, "-m", "code2wav", "loadtest", "--server", url, "--streams", str(streams), "--seconds", str(seconds),
                            "--frames", "30", "--json", str(out)], capture_output=True, text=True, env=env_for(tree), cwd=tree, timeout=600)
        res = json.loads(out.read_text()) if out.exists() else {}
        return {"exit": r.returncode, "streams_served": res.get("streams_served"), "errors": res.get("errors"), "seconds": res.get("seconds")}
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", type=Path, default=REPO, help="the source tree to run (default: this one)")
    p.add_argument("--streams", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3.0)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        print(json.dumps({"tree": str(a.tree), "hub_unreachable": hub_unreachable(a.tree.resolve(), tmp),
                          "loadtest_one_slot": loadtest_one_slot(a.tree.resolve(), tmp, a.streams, a.seconds)}, indent=2))


if __name__ == "__main__":
    main()
