"""vLLM-Omni's own Code2Wav stage vs code2wav's stage, at the stage interface, one process.

Both stages get the same payload sequence, built by vLLM-Omni's own talker-side processor
(``talker2code2wav_async_chunk``, the deploy YAML's chunking: a first chunk of 1 frame, then 25),
through the same ``forward`` arguments its model runner passes (tests/stacks/vllm_talker.py),
and the same weights (code2wav's embedded random checkpoint unless --model). N requests start
together and each generates --frames frames; one forward per talker step that emitted chunks.
A step runs from handing over the payloads to holding every request's audio on the host.

Reported per stage and level (concurrent requests): audio seconds per wall second, step p50 /
p99 ms, first-chunk latency (the first step, which carries every request's first chunk), peak
device memory above what was allocated before the run, and the max difference of request 0's
audio from code2wav's, up to frame 72 and past it.

Stages (--stages): ``code2wav`` (code2wav.integrations.vllm_omni), ``vllm-omni`` (its
Qwen3TTSCode2Wav with qwen3_tts.yaml's connector settings), ``vllm-omni-hc`` (the same with
qwen3_tts_high_concurrency_mrv2_single_gpu.yaml's: decode batches of 8, graph batch sizes 1-8).

GPU:  PYTHONPATH=/tmp/site:$PWD python bench/integration_vllm.py --out $OUT/integration_vllm.json
CPU:  PYTHONPATH=$PWD python bench/integration_vllm.py --device cpu --frames 12 --levels 1,2
vLLM need not be installed: tests/stacks/vllm_stubs.py stands in for the modules vLLM-Omni's
files import (the wheel installed --no-deps, and msgspec).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tests.stacks import vllm_talker as vt  # noqa: E402  (installs the vllm stand-ins)

SPF, FPS = 1920, 12.5
# qwen3_tts.yaml's connector extra (the chunking and Code2Wav settings it ships)
DEFAULT_EXTRA = {"codec_chunk_frames": 25, "codec_left_context_frames": 72, "initial_codec_chunk_frames": 1,
                 "decode_batch_max_size": 4}
HC_EXTRA = {**DEFAULT_EXTRA, "decode_batch_max_size": 8, "decode_cudagraph_batch_sizes": [1, 2, 3, 4, 5, 6, 7, 8]}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="bfloat16 on CUDA (vLLM-Omni's stage default), float32 on CPU")
    p.add_argument("--levels", default="1,16,64", help="concurrent requests, comma list")
    p.add_argument("--frames", type=int, default=150, help="frames per request")
    p.add_argument("--ref", type=int, default=0, help="reference (ICL) frames per request; 0: x-vector")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per level, after one warm-up run")
    p.add_argument("--stages", default="code2wav,vllm-omni,vllm-omni-hc")
    p.add_argument("--model", default=None, help="tokenizer dir or Qwen3-TTS model dir (default: code2wav's embedded random weights)")
    p.add_argument("--eager", action="store_true", help="enforce_eager: no CUDA graphs in either stage")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", default="integration_vllm.json")
    return p.parse_args(argv)


def model_dir(spec: str | None) -> str:
    """A model directory holding the checkpoint under speech_tokenizer/, as both stages load it."""
    from code2wav.model.loading import resolve_checkpoint

    ckpt = resolve_checkpoint(spec)
    root = Path(tempfile.mkdtemp(prefix="c2w-vllm-bench-"))
    (root / "speech_tokenizer").symlink_to(ckpt.resolve(), target_is_directory=True)
    return str(root)


def build(name: str, path: str, args, dtype: torch.dtype, max_seqs: int):
    extra = HC_EXTRA if name == "vllm-omni-hc" else DEFAULT_EXTRA
    cfg = vt.stage_config(path, dtype=dtype, device=args.device, extra=extra, max_num_seqs=max_seqs, enforce_eager=args.eager)
    if name == "code2wav":
        from code2wav.integrations.vllm_omni.stage import Code2WavQwen3TTSCode2Wav as cls
    else:
        from vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_code2wav import Qwen3TTSCode2Wav as cls
    stage = cls(vllm_config=cfg)
    stage.load_weights(iter([]))
    return stage


def workload(n: int, frames: int, ref: int, seed: int, tag: str) -> list[list[tuple[str, dict]]]:
    """The runner steps of ``n`` requests generating ``frames`` frames together."""
    g = torch.Generator().manual_seed(seed)
    conn = vt.Connector(dict(DEFAULT_EXTRA))
    gens = [torch.randint(0, 2048, (frames, 16), generator=g) for _ in range(n)]
    refs = [torch.randint(0, 2048, (ref, 16), generator=g) if ref else None for _ in range(n)]
    steps = []
    for t in range(frames):
        rows = []
        for i in range(n):
            p = conn.step(f"r{i}", gens[i][t], refs[i], finished=t == frames - 1)
            if p is not None:
                rows.append((f"{tag}-r{i}", p))
        if rows:
            steps.append(rows)
    return steps


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_once(stage, steps, device: str) -> tuple[list[float], torch.Tensor]:
    """Each step's seconds, and request 0's audio."""
    times, first = [], []
    for rows in steps:
        args = vt.forward_args(rows, device=device)
        sync(device)
        t0 = time.perf_counter()
        audio = [a.cpu() for a in vt.audio_of(stage(**args))]
        sync(device)
        times.append(time.perf_counter() - t0)
        if rows[0][0].endswith("-r0"):
            first.append(audio[0])
    stage.on_requests_finished({rid for rows in steps for rid, _ in rows})
    return times, torch.cat(first).float()


def measure(stage, name: str, args, level: int, reference: dict) -> dict:
    steps_for = lambda tag: workload(level, args.frames, args.ref, args.seed + level, tag)  # noqa: E731
    run_once(stage, steps_for(f"{name}-warm"), args.device)
    times: list[float] = []
    walls, firsts, peaks = [], [], []
    audio0 = None
    for k in range(args.repeats):
        steps = steps_for(f"{name}-{k}")
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        t, audio0 = run_once(stage, steps, args.device)
        if args.device.startswith("cuda"):
            peaks.append(torch.cuda.max_memory_allocated() - base)
        times += t
        walls.append(sum(t))
        firsts.append(t[0])
    audio_s = level * args.frames / FPS
    q = sorted(times)
    pct = lambda p: q[min(len(q) - 1, math.ceil(p / 100 * len(q)) - 1)] * 1e3  # noqa: E731
    res = {"stage": name, "level": level, "steps_per_run": len(times) // args.repeats,
           "audio_s_per_wall_s": audio_s / statistics.median(walls),
           "step_p50_ms": pct(50), "step_p99_ms": pct(99), "first_chunk_ms": statistics.median(firsts) * 1e3,
           "peak_mem_above_start_mib": max(peaks) / 2**20 if peaks else None}
    if name == "code2wav":
        reference[level] = audio0
    elif level in reference:
        d = (audio0 - reference[level]).abs().reshape(-1, SPF).amax(1)
        res["diff_vs_code2wav_upto72"] = d[:72].max().item()
        res["diff_vs_code2wav_past72"] = d[72:].max().item() if d.numel() > 72 else None
    return res


def main(argv=None) -> int:
    args = parse_args(argv)
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
    levels = [int(x) for x in args.levels.split(",")]
    path = model_dir(args.model)
    meta = {"device": args.device, "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor(),
            "dtype": str(dtype), "frames": args.frames, "ref": args.ref, "repeats": args.repeats, "torch": torch.__version__,
            "chunking": DEFAULT_EXTRA, "eager": args.eager}
    results, reference = [], {}
    for name in args.stages.split(","):
        t0 = time.perf_counter()
        stage = build(name, path, args, dtype, max(levels))
        load_s = time.perf_counter() - t0
        for level in levels:
            r = measure(stage, name, args, level, reference)
            r["load_s"] = load_s
            results.append(r)
            print(json.dumps(r), flush=True)
            Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
        del stage
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    cols = ("stage", "level", "audio_s_per_wall_s", "step_p50_ms", "step_p99_ms", "first_chunk_ms", "peak_mem_above_start_mib",
            "diff_vs_code2wav_upto72", "diff_vs_code2wav_past72")
    print(" | ".join(cols))
    for r in results:
        print(" | ".join(f"{r.get(c):.4g}" if isinstance(r.get(c), float) else str(r.get(c)) for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
