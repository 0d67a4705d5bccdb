"""Where one eager streaming step's GPU time goes, layer by layer: CUDA events around each layer
(the front stages, every upsampler and conv, each residual unit and its k=7 conv; a unit's tail
is the unit less its conv), and the kernels each layer launched (torch.profiler ranges). The
layers' times add up to the step's; kernel names say which cuDNN algorithm a conv got.

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
from code2wav.model.transformer import Transformer
from code2wav.stream.pool import StatePool
from code2wav.stream.runner import EagerRunner

DEVICE = "cuda"  # a CPU smoke run sets "cpu" (with stand-in events)
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


def kernels_of(evt) -> list[tuple[str, float]]:
    """The kernels launched under a profiler event (itself and every CPU child), with their us."""
    out = [(k.name, k.duration) for k in getattr(evt, "kernels", [])]
    for child in evt.cpu_children:
        out += kernels_of(child)
    return out


def children(name: str, names: list[str]) -> list[str]:
    """The timed layers directly inside ``name`` (no timed layer between)."""
    inside = [n for n in names if n.startswith(name + ".")]
    return [n for n in inside if not any(n.startswith(o + ".") for o in inside if o != n)]


def own(name: str, times: dict[str, float], names: list[str]) -> float:
    """A layer's time less its timed children's (a residual unit less its k=7 conv: the tail)."""
    return times[name] - sum(times[n] for n in children(name, names))


def main() -> int:
    dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[2] if len(sys.argv) > 2 else "16x25,1x1").split(",")]
    configure_cuda(dtype)
    if len(sys.argv) > 3:
        torch.backends.cudnn.benchmark_limit = int(sys.argv[3])
    m = random_decoder(DecoderConfig()).to_dtypes(dtype, DEVICE).channels_last()
    pool = StatePool(m, 64)
    eager = EagerRunner(m, pool)
    layers = timed_layers(m)
    names = list(layers)
    g = torch.Generator().manual_seed(0)
    print(f"{dtype}, cuDNN benchmark_limit {torch.backends.cudnn.benchmark_limit}; eager steps, us per layer")
    for b, t in shapes:
        codes = torch.randint(0, 2048, (b, 16, t), generator=g)
        slots, n_new = torch.arange(b), torch.full((b,), t)
        for _ in range(3):  # cuDNN's search and Triton's compiles outside the figures
            eager(codes, slots, n_new)
        torch.cuda.synchronize()
        spans = Spans(layers)
        whole = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            whole[0].record()
            eager(codes, slots, n_new)
            whole[1].record()
            torch.cuda.synchronize()
        times = spans.times_us()
        for h in spans.handles:
            h.remove()
        step_us = whole[0].elapsed_time(whole[1]) * 1e3
        by_range = {e.name.removeprefix("layer:"): e for e in prof.events() if e.name.startswith("layer:")}
        print(f"=== {b} x {t}: step {step_us:.0f} us (events, eager; launch gaps included)")
        print(f"{'layer':<28}{'us':>8}{'own us':>8}  kernels (us)")
        for name in names:
            ks = Counter(kernels_of(by_range[name])) if name in by_range else Counter()
            for n in children(name, names):  # a unit's own kernels: its tail's
                ks -= Counter(kernels_of(by_range[n])) if n in by_range else Counter()
            top = ", ".join(f"{k[:48]} {d:.0f}" for (k, d), _ in sorted(ks.items(), key=lambda kv: -kv[0][1])[:3])
            print(f"{name:<28}{times[name]:>8.1f}{own(name, times, names):>8.1f}  {top}")
        top_level = [n for n in names if not any(n.startswith(o + ".") for o in names if o != n)]
        by_kind: dict[str, float] = defaultdict(float)
        for name in names:
            kind = type(layers[name]).__name__
            by_kind[f"{kind} (own)" if children(name, names) else kind] += own(name, times, names)
        print("by kind: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])))
        print(f"{'sum of top-level layers':<28}{sum(times[n] for n in top_level):>8.1f}   (rest of the step: dequantize, clamp, gaps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
