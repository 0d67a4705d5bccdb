"""SGLang-Omni's own Qwen3-TTS vocoder scheduler vs code2wav's, at the stage interface.

Both schedulers get the same request/chunk sequence, the same weights, in one process: each
talker step sends one frame per running request (``stream_chunk`` messages with the stack's
``StreamItem``; the first carries the reference codes), then every request ends with
``stream_done`` and its payload. The stack's runtime is played by tests/stacks/sglang_driver.py's
way of driving it (``start()`` on a thread, inbox in, outbox out); here a reader thread
timestamps the outbox. Per scheduler and concurrency level:

* throughput: seconds of audio out / wall seconds from the first chunk to the last result;
* talker step p50/p99: from queueing a step's chunks until the scheduler has handled them (for
  code2wav that includes the decode; SGLang-Omni's async mode decodes on its worker threads,
  so there it is the ingest alone: read it with the throughput);
* first-chunk latency: from a request's first chunk to its first audio message (mean, p99);
* peak GPU memory during the run, and what was resident after the build.

Runs with no network: sglang-omni installed --no-deps (prepend it to PYTHONPATH), no sglang
(tests/stacks/sglang_stubs.py stands in for the engine modules). Smoke test on CPU:
``python bench/integration_sglang.py --device cpu --frames 12 --levels 1,2``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from sglang_omni.scheduling.message import IncomingMessage, put_messages  # noqa: E402

from tests.stacks.sglang_driver import BARRIER, BARRIERS, Request, waveform  # noqa: E402
from tests.stacks.sglang_stubs import their_scheduler  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA (the stack's default), float32 on CPU")
    p.add_argument("--levels", default="1,16,64")
    p.add_argument("--frames", type=int, default=250, help="generated frames per request (250: 20 s of audio)")
    p.add_argument("--ref", type=int, default=0, help="reference-prefix frames per request")
    p.add_argument("--model", default=None, help="tokenizer checkpoint dir; default: random weights of the real architecture")
    p.add_argument("--schedulers", default="sglang-omni,code2wav")
    p.add_argument("--out", default=None, help="JSON results (rewritten after every run)")
    return p.parse_args(argv)


class Timed:
    """The stage runtime around one scheduler, with every outbox message timestamped."""

    def __init__(self, sched):
        self.s = sched
        self.msgs: list[tuple[float, object]] = []
        self.marks: dict[str, threading.Event] = {}
        self.runner = threading.Thread(target=sched.start, daemon=True)
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.runner.start()
        self.reader.start()

    def read(self) -> None:
        while True:
            msg = self.s.outbox.get()
            if msg is None:
                return
            if msg.request_id.startswith(BARRIER):
                self.marks[msg.request_id].set()
            else:
                self.msgs.append((time.perf_counter(), msg))

    def send(self, msgs) -> float:
        """Queue ``msgs`` together and wait until the scheduler handled them; returns the seconds."""
        mark = f"{BARRIER}{next(BARRIERS)}"
        self.marks[mark] = threading.Event()
        t = time.perf_counter()
        put_messages(self.s.inbox, [*msgs, IncomingMessage(mark, "wakeup")])
        self.marks[mark].wait()
        return time.perf_counter() - t

    def close(self) -> None:
        self.s.stop()
        self.runner.join()
        self.s.outbox.put(None)
        self.reader.join()


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def one_run(sched, device, n: int, frames: int, ref: int, seed: int) -> tuple[dict, dict[str, np.ndarray]]:
    from tests.models import random_codes

    codes = random_codes(frames + ref, seed=seed)
    reqs = [Request(f"r{seed}-{i}", codes[:ref], torch.roll(codes[ref:], i, 0), [1] * frames) for i in range(n)]
    drv = Timed(sched)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    steps, first_sent = [], {}
    t0 = time.perf_counter()
    for k in range(frames):
        msgs = []
        for r in reqs:
            msgs.append(r.chunk(k))
            if k == frames - 1:
                msgs += [r.done(), r.payload()]
        if k == 0:
            first_sent = {r.rid: time.perf_counter() for r in reqs}
        steps.append(drv.send(msgs))
    ended = lambda: sum(1 for _, m in list(drv.msgs) if m.type in ("result", "error"))  # noqa: E731
    while ended() < n:
        time.sleep(0.001)
    sync(device)
    wall = time.perf_counter() - t0
    drv.close()
    errors = [m.data for _, m in drv.msgs if m.type == "error"]
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed: {errors[0]!r}")
    first = {}
    audio: dict[str, list[np.ndarray]] = {}
    for t, m in drv.msgs:
        if m.type == "stream":
            first.setdefault(m.request_id, t - first_sent[m.request_id])
            audio.setdefault(m.request_id, []).append(waveform(m))
    out = {rid: np.concatenate(a) for rid, a in audio.items()}
    seconds = sum(len(a) for a in out.values()) / 24000
    lat = sorted(first.values())
    ms = lambda x: round(1000 * x, 3)  # noqa: E731
    res = {"requests": n, "audio_s": round(seconds, 3), "wall_s": round(wall, 4), "throughput_x": round(seconds / wall, 2),
           "step_p50_ms": ms(statistics.median(steps)), "step_p99_ms": ms(float(np.percentile(steps, 99))),
           "first_chunk_mean_ms": ms(statistics.mean(lat)), "first_chunk_p99_ms": ms(float(np.percentile(lat, 99)))}
    if device.type == "cuda":
        res["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    return res, out


def build(name: str, ckpt: Path, device, dtype: str, slots: int):
    if name == "sglang-omni":
        # Their factory's switches on this device: the stateful codec decoder, its CUDA graphs and
        # async decode on CUDA (has_reference_prefixed_first_chunks: a Base checkpoint).
        return their_scheduler(ckpt, device=device, dtype=getattr(torch, dtype), codec_state_slots=slots, fused_snake_activation=device.type == "cuda")
    from code2wav.integrations.sglang_omni import create_vocoder_executor

    return create_vocoder_executor(str(ckpt), device=str(device), dtype=dtype, codec_state_slots=slots)


def main(argv=None) -> None:
    args = parse(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    levels = [int(x) for x in args.levels.split(",")]
    tmp = tempfile.TemporaryDirectory()
    if args.model:
        from code2wav.model.loading import resolve_checkpoint

        ckpt = resolve_checkpoint(args.model)
    else:
        from tests.models import FULL, write_checkpoint

        ckpt = write_checkpoint(Path(tmp.name) / "tokenizer", FULL)
    results: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "dtype": dtype, "frames": args.frames,
                     "ref": args.ref, "torch": torch.__version__, "runs": {}}
    audio: dict[str, dict[int, dict[str, np.ndarray]]] = {}
    for name in args.schedulers.split(","):
        if device.type == "cuda":
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated(device)
        t = time.perf_counter()
        sched = build(name, ckpt, device, dtype, max(levels))
        sync(device)
        runs = results["runs"].setdefault(name, {"build_s": round(time.perf_counter() - t, 2)})
        if device.type == "cuda":
            runs["resident_gpu_mib"] = round((torch.cuda.memory_allocated(device) - base) / 2**20, 1)
        one_run(sched, device, 1, min(args.frames, 8), args.ref, seed=99)  # warm-up
        for n in levels:
            res, out = one_run(sched, device, n, args.frames, args.ref, seed=n)
            runs[str(n)] = res
            audio.setdefault(name, {})[n] = out
            print(name, json.dumps(res), flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps(results, indent=1))
        del sched
    names = list(audio)
    if len(names) == 2:  # the same codes through both: how far apart their audio is
        a, b = audio[names[0]], audio[names[1]]
        results["max_abs_diff"] = {str(n): float(max(np.abs(a[n][rid] - b[n][rid]).max() for rid in a[n])) for n in levels}
        print("max |sglang-omni - code2wav|:", results["max_abs_diff"])
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    tmp.cleanup()


if __name__ == "__main__":
    main()
