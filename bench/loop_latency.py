"""The service's event-loop latency while clients post large JSON bodies to ``POST /v1/decode``.

Starts ``code2wav serve`` from a checkout (``--tree``, default this one) on 127.0.0.1 with a small
random checkpoint, then: ``/health`` latency idle; ``/health`` latency while ``--clients`` clients
each post ``--rounds`` JSON bodies of ``--body-mib`` MiB (random codes; more frames than the
server's default ``--max-stream-frames``, so every body is parsed and then refused with 413, none
is decoded); the server's RSS (and its children's, e.g. body-parsing workers) before, at the peak
and after the load. Prints one JSON object. Every request goes to 127.0.0.1; the run is bounded by
``--rounds``.

    PYTHONPATH=$PWD python bench/loop_latency.py [--tree DIR] [--clients 8] [--body-mib 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

HERE = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
        for k in kids:
            out += [k, *children(k)]
    return out


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else float("nan")


def summary(lat: list[float]) -> dict:
    ms = [x * 1000 for x in lat]
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 2), "p99_ms": round(percentile(ms, 99), 2), "max_ms": round(max(ms), 2)}


def body_of(mib: float, seed: int = 0) -> bytes:
    """A JSON body of random codes, as close under ``mib`` MiB as whole frames allow."""
    limit = int(mib * 2**20)
    rng = np.random.default_rng(seed)
    row = len(json.dumps(rng.integers(0, 2048, 16).tolist())) + 2  # ", " between rows
    frames = (limit - 64) // row
    while True:
        body = json.dumps({"codes": rng.integers(0, 2048, (frames, 16)).tolist(), "format": "pcm"}).encode()
        if len(body) <= limit:
            return body
        frames -= max(1, (len(body) - limit) // row + 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", default=str(HERE), help="checkout whose code2wav serves (default: this one)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--body-mib", type=float, default=16.0)
    ap.add_argument("--rounds", type=int, default=3, help="bodies each client posts, one after the other")
    ap.add_argument("--probe-ms", type=float, default=10.0, help="pause between /health probes")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra argument for code2wav serve (repeatable)")
    args = ap.parse_args()

    from tests.models import write_checkpoint

    tmp = Path(tempfile.mkdtemp(prefix="loop_latency-"))
    ckpt = write_checkpoint(tmp / "ckpt")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONPATH=args.tree, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    env.pop("CODE2WAV_API_KEY", None)
    log = open(tmp / "server.log", "wb")
    cmd = [sys.executable, "-m", "code2wav.cli", "serve", "--model", str(ckpt), "--port", str(port), "--log-level", "warning", *args.serve_arg]
    proc = subprocess.Popen(cmd, cwd=args.tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        while True:
            assert proc.poll() is None, (tmp / "server.log").read_text()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() - t0 < 120, "server not ready"
            time.sleep(0.1)
        body = body_of(args.body_mib)
        probe = httpx.Client(base_url=url, timeout=60)
        probe.get("/health")

        def probe_for(n: int | None, stop: threading.Event | None) -> list[float]:
            lat: list[float] = []
            while (n is not None and len(lat) < n) or (stop is not None and not stop.is_set()):
                t = time.perf_counter()
                probe.get("/health").raise_for_status()
                lat.append(time.perf_counter() - t)
                time.sleep(args.probe_ms / 1000)
            return lat

        idle = probe_for(200, None)
        # One warm-up post (a server that parses elsewhere may start its workers on the first body).
        warm = httpx.post(url + "/v1/decode", content=body, headers={"content-type": "application/json"}, timeout=120)
        time.sleep(1.0)
        rss0 = {"server": rss_kib(proc.pid), "children": sum(rss_kib(c) for c in children(proc.pid))}
        peak = dict(rss0)
        statuses: dict[str, int] = {}
        lock = threading.Lock()
        stop = threading.Event()

        def client() -> None:
            with httpx.Client(timeout=300) as c:
                for _ in range(args.rounds):
                    r = c.post(url + "/v1/decode", content=body, headers={"content-type": "application/json"})
                    code = r.json().get("code", "?") if r.headers.get("content-type", "").startswith("application/json") else "?"
                    with lock:
                        key = f"{r.status_code} {code}"
                        statuses[key] = statuses.get(key, 0) + 1

        def sample_rss() -> None:
            while not stop.is_set():
                peak["server"] = max(peak["server"], rss_kib(proc.pid))
                peak["children"] = max(peak["children"], sum(rss_kib(c) for c in children(proc.pid)))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample_rss)
        sampler.start()
        lat: list[float] = []
        prober = threading.Thread(target=lambda: lat.extend(probe_for(None, stop)))
        prober.start()
        t_load = time.perf_counter()
        workers = [threading.Thread(target=client) for _ in range(args.clients)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        load_s = time.perf_counter() - t_load
        stop.set()
        prober.join()
        sampler.join()
        time.sleep(2.0)
        rss1 = {"server": rss_kib(proc.pid), "children": sum(rss_kib(c) for c in children(proc.pid))}
        mib = lambda kib: round(kib / 1024, 1)  # noqa: E731
        out = {
            "tree": args.tree,
            "commit": subprocess.run(["git", "-C", args.tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
            "cpus": os.cpu_count(),
            "body_bytes": len(body),
            "warm_up_status": warm.status_code,
            "clients": args.clients,
            "rounds": args.rounds,
            "load_seconds": round(load_s, 2),
            "responses": statuses,
            "health_idle": summary(idle),
            "health_under_load": summary(lat),
            "rss_mib": {k: {"before": mib(rss0[k]), "peak": mib(peak[k]), "after": mib(rss1[k]), "peak_growth": mib(peak[k] - rss0[k])}
                        for k in rss0},
        }
        print(json.dumps(out, indent=1))
        return 0
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


if __name__ == "__main__":
    sys.exit(main())
