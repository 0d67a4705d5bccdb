"""Where one eager streaming step's GPU time goes, layer by layer: CUDA events around each layer
(the front stages, every upsampler and conv, each residual unit and its k=7 conv; a unit's tail
is the unit less its conv), and the kernels each layer launched (torch.profiler ranges, as the
profiler maps them onto the GPU timeline). The eager host launches slower than the GPU runs, so
the step is queued behind a GPU sleep first (``SLEEP_CYCLES``): the GPU then runs it back to back
and each layer's events measure its GPU time, not launch gaps (the inputs are on the device
already, and a step never synchronises). Kernel names say which cuDNN algorithm a conv got.

argv: [dtype, default bfloat16] [shapes ROWSxFRAMES,..., default 16x25,1x1] [cuDNN
benchmark_limit, default torch's]. Output: one table per shape, times in us.
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from code2wav.model.config import DecoderConfig
from code2wav.model.decoder import Decoder
from code2wav.model.init import random_decoder
from code2wav.model.layers import CausalConv1d, CausalConvTranspose1d, ConvNeXtBlock, ResidualUnit
from code2wav.model.loading import configure_cuda
from code2wav.model.low_rate import auto_low_rate
from code2wav.model.transformer import Transformer
from code2wav.stream.pool import StatePool
from code2wav.stream.runner import EagerRunner

DEVICE = "cuda"  # a CPU smoke run sets "cpu" (with stand-in events)
SLEEP_CYCLES = 400_000_000  # ~0.2 s at the H200's clock: longer than the eager host takes to queue a step
TIMED = (CausalConv1d, CausalConvTranspose1d, ConvNeXtBlock, ResidualUnit, Transformer)


def timed_layers(m: Decoder) -> dict[str, torch.nn.Module]:
    """The layers timed, by name; a ConvNeXt block's own conv and a unit's 1x1 conv are left in
    their parents' figures."""
    out = {}
    for name, mod in m.named_modules():
        if isinstance(mod, TIMED) and not name.endswith(("dwconv", "conv2")) and ".layers." not in name:
            out[name] = mod
    return out


class Spans:
    """Forward hooks: a CUDA event pair and a profiler range around each timed layer."""

    def __init__(self, layers: dict[str, torch.nn.Module]):
        self.events: dict[str, list] = defaultdict(list)
        self.ranges: list = []
        self.handles = []
        for name, mod in layers.items():
            self.handles.append(mod.register_forward_pre_hook(self._pre(name)))
            self.handles.append(mod.register_forward_hook(self._post(name)))

    def _pre(self, name):
        def hook(mod, args):
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            self.events[name].append([start, None])
            rf = record_function(f"layer:{name}")
            rf.__enter__()
            self.ranges.append(rf)
        return hook

    def _post(self, name):
        def hook(mod, args, out):
            self.ranges.pop().__exit__(None, None, None)
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.events[name][-1][1] = end
        return hook

    def times_us(self) -> dict[str, float]:
        torch.cuda.synchronize()
        return {k: sum(s.elapsed_time(e) for s, e in v) / len(v) * 1e3 for k, v in self.events.items()}


def gpu_kernels(prof) -> tuple[dict[str, tuple[float, float]], list[tuple[float, float, str]]]:
    """The layers' ranges on the GPU timeline (start, end in us) and every kernel (start, end,
    name), from the profiler's events: a range launched under ``record_function`` has a GPU-side
    twin spanning its kernels."""
    ranges, kernels = {}, []
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        span = (e.time_range.start, e.time_range.end)
        if e.name.startswith("layer:"):
            ranges[e.name.removeprefix("layer:")] = span
        else:
            kernels.append((*span, e.name))
    return ranges, kernels


def inside(span: tuple[float, float], kernels: list[tuple[float, float, str]]) -> Counter:
    """Kernel name -> GPU us, for the kernels that ran within ``span``."""
    out: Counter = Counter()
    for s, e, name in kernels:
        if s >= span[0] and e <= span[1]:
            out[name] += e - s
    return out


def children(name: str, names: list[str]) -> list[str]:
    """The timed layers directly inside ``name`` (no timed layer between)."""
    inside = [n for n in names if n.startswith(name + ".")]
    return [n for n in inside if not any(n.startswith(o + ".") for o in inside if o != n)]


def own(name: str, times: dict[str, float], names: list[str]) -> float:
    """A layer's time less its timed children's (a residual unit less its k=7 conv: the tail;
    a child that did not run, a one-kernel unit's conv, counts nothing)."""
    return times[name] - sum(times.get(n, 0.0) for n in children(name, names))


def main() -> int:
    dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[2] if len(sys.argv) > 2 else "16x25,1x1").split(",")]
    configure_cuda(dtype)
    if len(sys.argv) > 3:
        torch.backends.cudnn.benchmark_limit = int(sys.argv[3])
    m = random_decoder(DecoderConfig()).to_dtypes(dtype, DEVICE).channels_last()
    auto_low_rate(m)  # the low-rate stages as a default load runs them
    pool = StatePool(m, 64)
    eager = EagerRunner(m, pool)
    layers = timed_layers(m)
    names = list(layers)
    g = torch.Generator().manual_seed(0)
    print(f"{dtype}, low-rate stages {m.low_rate_dtype}, cuDNN benchmark_limit {torch.backends.cudnn.benchmark_limit}; eager steps, us per layer")
    for b, t in shapes:
        codes = torch.randint(0, 2048, (b, 16, t), generator=g)
        slots, n_new = torch.arange(b), torch.full((b,), t)
        codes, slots, n_new = codes.to(DEVICE), slots.to(DEVICE), n_new.to(DEVICE)  # no copy in the step
        for _ in range(3):  # cuDNN's search and Triton's compiles outside the figures
            eager(codes, slots, n_new)
        torch.cuda.synchronize()
        spans = Spans(layers)
        whole = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            if DEVICE == "cuda":
                torch.cuda._sleep(SLEEP_CYCLES)
            whole[0].record()
            eager(codes, slots, n_new)
            whole[1].record()
            torch.cuda.synchronize()
        times = spans.times_us()
        for h in spans.handles:
            h.remove()
        step_us = whole[0].elapsed_time(whole[1]) * 1e3
        ranges, kernels = gpu_kernels(prof)
        if DEVICE == "cuda":  # the sleep is the first kernel on the timeline, not the step's
            kernels = sorted(kernels)[1:]
        busy = sum(e - s for s, e, _ in kernels)
        print(f"=== {b} x {t}: step {step_us:.0f} us (events), kernels {busy:.0f} us, {len(kernels)} kernels; "
              f"layer ranges on the GPU: {len(ranges)} of {len(names)}")
        print(f"{'layer':<28}{'us':>8}{'own us':>8}  top kernels (us)")
        for name in [n for n in names if n in times]:  # a one-kernel unit's conv never runs
            ks = inside(ranges[name], kernels) if name in ranges else Counter()
            for n in children(name, names):  # a unit's own kernels: its tail's
                ks -= inside(ranges[n], kernels) if n in ranges else Counter()
            top = ", ".join(f"{k[:44]} {d:.0f}" for k, d in ks.most_common(3))
            print(f"{name:<28}{times[name]:>8.1f}{own(name, times, names):>8.1f}  {top}")
        top_level = [n for n in names if not any(n.startswith(o + ".") for o in names if o != n)]
        by_kind: dict[str, float] = defaultdict(float)
        for name in [n for n in names if n in times]:
            kind = type(layers[name]).__name__
            by_kind[f"{kind} (own)" if children(name, names) else kind] += own(name, times, names)
        print("by kind: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])))
        print(f"{'sum of top-level layers':<28}{sum(times.get(n, 0.0) for n in top_level):>8.1f}   (rest of the step: dequantize, clamp, gaps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
