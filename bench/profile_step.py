"""Where a batched step's time goes on the GPU: timings of eager vs graph replay for a few
(batch, frames) shapes and the top kernels of one large step (torch.profiler)."""

from __future__ import annotations

import re
import sys
import time
from dataclasses import replace

import torch

from code2wav.engine.graphs import GraphRunner
from code2wav.kernels import unit
from code2wav.model.choices import DEFAULT_CHOICES, LayerChoices
from code2wav.model.config import DecoderConfig
from code2wav.model.init import random_decoder
from code2wav.model.loading import configure_cuda
from code2wav.model.low_rate import auto_low_rate
from code2wav.stream.pool import StatePool
from code2wav.stream.runner import EagerRunner

# A layout's ``-name=value`` suffixes, any order: the LayerChoices field each sets, from its text.
SUFFIXES = {
    "fold": ("conv_fold", str),
    "convt": ("convt_gemm", lambda v: v != "cudnn"),
    "skinny": ("skinny", lambda v: v != "0"),
    "skinnyhalf": ("skinny_half", lambda v: v != "0"),
    "pdl": ("pdl", lambda v: v != "0"),
    "unitfill": ("unit_fill_sms", lambda v: v != "0"),
    "gemmrows": ("conv_gemm_rows", int),
    "unitconv": ("unit_conv_rows", int),
    "unitwindow": ("unit_window_rows", int),
    "convtk": ("convt_kernel_rows", int),
    "attn": ("attention_frames", int),
}


def layer_choices(layout: str) -> tuple[str, LayerChoices]:
    """A layout name's ``-name=value`` suffixes (``SUFFIXES``: ``-fold=``, ``-convt=cudnn``,
    ``-skinny=0``, ``-unitfill=0``, ``-gemmrows=N``, ``-unitconv=N``, ``-unitwindow=N``, ``-convtk=N``, ``-attn=N``) as the model's
    :class:`LayerChoices`, each field the default unless its suffix is there; returns the name
    without them."""
    name, *settings = re.split(r"-(?=\w+=)", layout)  # a value may hold a hyphen: fold=multi-row
    fields = {}
    for setting in settings:
        key, _, value = setting.partition("=")
        field, parse = SUFFIXES[key]
        fields[field] = parse(value)
    return name, replace(DEFAULT_CHOICES, **fields)


def main() -> int:
    """argv: [dtype] [layouts] [cuDNN benchmark_limit: algorithms timed per shape, 0 = all].
    A layout named ``...-unfused`` runs the residual units' tails as separate ops (the A/B of
    ``code2wav/kernels/unit.py``); ``...-fold=all|dilated|none`` sets which full convs run folded
    (the A/B of ``LayerChoices.conv_fold``); ``...-convt=cudnn`` runs the ConvTranspose layers as
    cuDNN's transposed conv, not GEMMs (the A/B of ``LayerChoices.convt_gemm``);
    ``...-gemmrows=N`` runs full convs of at most N output samples as GEMMs (the A/B of
    ``LayerChoices.conv_gemm_rows``); ``...-unitfill=0`` keeps the residual units' fused tails
    at fixed 128-row tiles in small steps (the A/B of ``LayerChoices.unit_fill_sms``);
    ``...-skinny=0`` runs the few-row float32 products through cuBLAS (the A/B of
    ``LayerChoices.skinny``; ``...-skinnyhalf=1`` the half ones too, ``LayerChoices.skinny_half``;
    ``...-pdl=0`` launches the Triton kernels plainly, ``LayerChoices.pdl``);
    ``...-unitconv=N`` runs a residual unit as one kernel in steps of
    at least N samples (the A/B of ``LayerChoices.unit_conv_rows``); ``...-convtk=N`` runs each
    decoder block's ConvTranspose as one kernel in steps of at least N input rows (the A/B of
    ``LayerChoices.convt_kernel_rows``). Each suffix sets that field
    of the model's layer choices (the others keep their defaults); ``-unfused`` goes first. Each layout's eager 16x25, 1x25 and 1x1 steps are profiled."""
    dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
    layouts = sys.argv[2].split(",") if len(sys.argv) > 2 else ["channels_last"]  # the CUDA default
    configure_cuda(dtype)
    if len(sys.argv) > 3:
        torch.backends.cudnn.benchmark_limit = int(sys.argv[3])
    print(f"{dtype}, cuDNN benchmark_limit {torch.backends.cudnn.benchmark_limit}")
    shapes = [(1, 1), (16, 1), (1, 25), (5, 25), (10, 25), (16, 25), (20, 25), (64, 8)]
    g = torch.Generator().manual_seed(0)
    real_applies = unit.applies
    for layout in layouts:  # the same step, conv weights stored either way
        name = layout
        layout, choices = layer_choices(layout)
        # No layer choice for the fused tail itself: the A/B swaps the kernel's gate.
        unit.applies = (lambda x, h: False) if layout.endswith("-unfused") else real_applies
        layout = layout.removesuffix("-unfused")
        m = random_decoder(DecoderConfig())
        m = m.to_dtypes(dtype, "cuda").set_layer_choices(choices)
        auto_low_rate(m)  # the low-rate stages as a default load runs them
        if layout == "channels_last":
            m.channels_last()
        pool = StatePool(m, 64)
        eager = EagerRunner(m, pool)
        runner = GraphRunner(m, pool, batch_sizes=(1, 5, 10, 16, 64), frame_sizes=(1, 8, 25), max_batch_frames=512)
        runner.capture()
        print(f"{name}: low-rate stages {m.low_rate_dtype}, conv weights {layout}, fold {choices.conv_fold}, "
              f"GEMM convs up to {choices.conv_gemm_rows} samples; "
              f"graph pool {runner.memory_bytes() / 2**20:.0f} MiB at 512 frames")
        print(f"{'B':>4}{'T':>4}{'eager ms':>10}{'graph ms':>10}{'frames/s graph':>16}{'x RT':>8}")
        for b, t in shapes:
            codes = torch.randint(0, 2048, (b, 16, t), generator=g)
            slots = torch.arange(b)
            n_new = torch.full((b,), t)
            res = {}
            for how, fn in (("eager", eager), ("graph", runner)):
                for _ in range(3):
                    fn(codes, slots, n_new)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                reps = 20
                for _ in range(reps):
                    fn(codes, slots, n_new)
                torch.cuda.synchronize()
                res[how] = (time.perf_counter() - t0) / reps * 1e3
            fps = b * t / res["graph"] * 1e3
            print(f"{b:>4}{t:>4}{res['eager']:>10.2f}{res['graph']:>10.2f}{fps:>16.0f}{fps / 12.5:>8.0f}", flush=True)
        del runner
        profile_steps(eager, name, g)
    return 0


def profile_steps(eager: EagerRunner, name: str, g: torch.Generator) -> None:
    """Where a big step's time goes; what a 1-frame step launches (eager, torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    for b, t, rows in ((16, 25, 24), (1, 25, 16), (1, 1, 16)):
        codes = torch.randint(0, 2048, (b, 16, t), generator=g)
        slots, n_new = torch.arange(b), torch.full((b,), t)
        eager(codes, slots, n_new)  # cuDNN's algorithm search outside the profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            eager(codes, slots, n_new)
            torch.cuda.synchronize()
        events = prof.key_averages()
        kernels = sum(e.count for e in events if e.device_type.name == "CUDA")
        gpu_ms = sum(e.self_device_time_total for e in events) / 1e3
        print(f"--- {name} {b}x{t} eager step: {kernels} GPU kernels/copies, {gpu_ms:.2f} ms GPU time")
        print(events.table(sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=70))


if __name__ == "__main__":
    sys.exit(main())
