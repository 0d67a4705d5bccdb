"""From a cold start to the first audio.

``python3 bench/cold_start.py phases [dtype]``: in one process, the time of each start-up phase
(importing torch and code2wav, loading the model, the state pool, then every step graph and
prefill graph captured one at a time, each timed), sorted, so the costly phase is named.

``python3 bench/cold_start.py serve [serve options ...]``: ``code2wav serve`` started as a
subprocess; stamps (from the spawn) when ``/health`` first answers, when it says ready, and when
the first audio of a one-frame WebSocket stream opened as soon as the server accepts comes back.
Run it twice on one machine: the second start finds the Triton and weight caches warm.
``COLD_START_UNTIL="first audio"`` stops there instead of at ready.
``serve --then CMD [serve options ...]``: once ready, runs the shell command CMD against the
same server (the load runs) before stopping it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

T0 = time.perf_counter()


def phases(dtype_name: str) -> None:
    import torch

    import code2wav  # noqa: F401
    from code2wav.engine.build import EngineConfig, load_model
    from code2wav.engine.graphs import GraphRunner, use_expandable_segments
    from code2wav.model.loading import configure_cuda
    from code2wav.stream.engine import StreamEngine
    from code2wav.stream.pool import StatePool

    out: dict[str, float] = {"import": time.perf_counter() - T0}
    use_expandable_segments()
    cfg = EngineConfig(device="cuda", dtype=dtype_name)
    t = time.perf_counter()
    torch.zeros(1, device="cuda")
    out["cuda init"] = time.perf_counter() - t
    t = time.perf_counter()
    configure_cuda(getattr(torch, dtype_name))
    if os.environ.get("CUDNN_BENCHMARK") == "0":  # the A/B: cuDNN's heuristic algorithm choice, no per-shape timing
        torch.backends.cudnn.benchmark = False
    model = load_model(cfg)
    torch.cuda.synchronize()
    out["load model"] = time.perf_counter() - t
    t = time.perf_counter()
    pool = StatePool(model, cfg.max_streams)
    runner = GraphRunner(model, pool, max_batch_frames=cfg.batch_frames())
    engine = StreamEngine(model, runner=runner, max_step_frames=cfg.step_frames(), max_batch_frames=cfg.batch_frames())
    out["pool + engine"] = time.perf_counter() - t
    buckets = sorted(runner.buckets, key=lambda bt: -bt[0] * bt[1])
    each: list[tuple[str, float]] = []
    t_all = time.perf_counter()
    for bt in buckets:
        runner.buckets = [bt]
        t = time.perf_counter()
        runner.capture([])
        each.append((f"step {bt}", time.perf_counter() - t))
    for shape in engine.prefill_shapes():
        runner.buckets = []
        t = time.perf_counter()
        runner.capture([shape])
        each.append((f"prefill {shape}", time.perf_counter() - t))
    out["all graphs"] = time.perf_counter() - t_all
    # The same shapes again, now that every kernel is compiled and every cuDNN shape tuned: what
    # a capture costs by itself.
    t = time.perf_counter()
    runner.buckets = buckets
    runner.capture(engine.prefill_shapes())
    out["all graphs again"] = time.perf_counter() - t
    out["total"] = time.perf_counter() - T0
    # What the captured graphs cost to replay (the steady state), a few shapes: cuDNN's
    # algorithm choice at capture is in these.
    for shape in [(1, 1), (1, 25), (16, 25), (19, 25), (60, 8)]:
        if shape in runner.graphs:
            g = runner.graphs[shape].graph
            g.replay()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(50):
                g.replay()
            torch.cuda.synchronize()
            out[f"replay {shape} ms"] = (time.perf_counter() - t) / 50 * 1e3
    for k, v in out.items():
        print(f"{k:>22}: {v:8.3f}" + ("" if k.endswith("ms") else " s"))
    print(f"{len(each)} graphs; the costliest first:")
    for name, s in sorted(each, key=lambda x: -x[1])[:15]:
        print(f"  {name:>28}: {s * 1e3:9.1f} ms")
    print("first five captured:", ", ".join(f"{n} {s:.2f}s" for n, s in each[:5]))
    print(json.dumps({"phases": out, "graphs": each}))


def serve(args: list[str], then: str | None) -> None:
    import httpx
    import numpy as np

    from code2wav.client import Client

    url = "http://127.0.0.1:8091"
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "code2wav", "serve", "--log-level", "warning", *args], env=os.environ)
    stamps: dict[str, float] = {}
    try:
        until = os.environ.get("COLD_START_UNTIL", "ready")  # or "first audio"
        while proc.poll() is None and until not in stamps:
            try:
                r = httpx.get(url + "/health", timeout=1)
                stamps.setdefault("health answers", time.perf_counter() - t0)
                body = r.json()
                if "first audio" not in stamps:
                    with Client(url).stream(format="f32le") as s:
                        s.push(np.zeros((1, 16), dtype=np.int64))
                        s.recv_audio()
                        stamps["first audio"] = time.perf_counter() - t0
                        stamps["health at first audio: " + json.dumps(body)] = 0.0
                if r.status_code == 200 and body.get("graphs", {}).get("state", "ready") == "ready":
                    stamps["ready"] = time.perf_counter() - t0
            except (httpx.HTTPError, OSError):
                pass
            time.sleep(0.02)
        for k, v in stamps.items():
            print(f"{k}: {v:.2f} s" if v else k, flush=True)
        if then and proc.poll() is None:
            subprocess.run(then, shell=True)
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "phases"
    if what == "phases":
        phases(sys.argv[2] if len(sys.argv) > 2 else "bfloat16")
    elif what == "serve":
        rest = sys.argv[2:]
        then = rest[1] if rest[:1] == ["--then"] else None
        serve(rest[2:] if then else rest, then)
    else:
        sys.exit(f"unknown {what!r}: phases | serve")
