"""Offline decode, ours vs the official qwen-tts decoder, same weights, one process.

CPU:  python bench/offline.py --device cpu --threads 2 --dtypes float32 --batches 1 --frames 125
GPU:  python bench/offline.py --device cuda --dtypes float32,bfloat16 --batches 1,16,64 --frames 125
Prints audio seconds per wall second for each (dtype, batch), and the speedup.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from code2wav.model.config import DecoderConfig  # noqa: E402
from code2wav.model.decoder import Decoder  # noqa: E402
from code2wav.model.init import random_decoder  # noqa: E402
from code2wav.offline import decode  # noqa: E402


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, repeat: int) -> float:
    fn()  # warm-up
    sync(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--frames", type=int, default=125)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--no-autotune", action="store_true", help="cuDNN heuristics instead of timing every conv shape (both sides)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from tests.official import Qwen3TTSTokenizerV2Decoder, Qwen3TTSTokenizerV2DecoderConfig, reference_config

    weights = random_decoder(DecoderConfig()).state_dict()
    if args.device.startswith("cuda"):
        from code2wav.model.loading import configure_cuda

        configure_cuda(getattr(torch, args.dtypes.split(",")[0]))
        torch.backends.cudnn.benchmark = not args.no_autotune
    rows = []
    for dname in args.dtypes.split(","):
        dtype = getattr(torch, dname)
        ours = Decoder(DecoderConfig())
        ours.load_state_dict(weights)
        ours.to_dtypes(dtype, args.device, dtype)  # folded from the fp32 weights, then cast once (all in dtype, as the official)
        if args.device.startswith("cuda"):
            ours.channels_last()
        off = Qwen3TTSTokenizerV2Decoder._from_config(Qwen3TTSTokenizerV2DecoderConfig(**reference_config()["decoder_config"]))
        off.load_state_dict(weights, strict=True)  # the same weights
        off = off.to(args.device, dtype).eval()
        for b in [int(x) for x in args.batches.split(",")]:
            codes = torch.randint(0, 2048, (b, 16, args.frames))
            with torch.no_grad():
                t_off = timed(lambda: off.chunked_decode(codes.to(args.device)), args.device, args.repeat)
                t_ours = timed(lambda: decode(ours, codes), args.device, args.repeat)
            audio_s = b * args.frames * 1920 / 24000
            row = {"dtype": dname, "batch": b, "frames": args.frames, "official_s": t_off, "ours_s": t_ours,
                   "official_xrt": audio_s / t_off, "ours_xrt": audio_s / t_ours, "speedup": t_off / t_ours}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"{'dtype':<10}{'batch':>6}{'official s':>12}{'ours s':>10}{'official xRT':>14}{'ours xRT':>10}{'speedup':>9}")
    for r in rows:
        print(f"{r['dtype']:<10}{r['batch']:>6}{r['official_s']:>12.3f}{r['ours_s']:>10.3f}{r['official_xrt']:>14.1f}{r['ours_xrt']:>10.1f}{r['speedup']:>9.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
