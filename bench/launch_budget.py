"""What fewer launches would buy a small step, before building the kernels that remove them: the
step's graph replayed with groups of its short kernels cut out (wrong numbers, the same shapes
otherwise), alternating, medians per shape. Each variant is an upper bound on what fusing that
group into its neighbours can save:

- ``default``: ``skinny_half`` off (the default until 0e6ef83: cuBLAS for few-row half products);
- ``skinny_half``: few-row half products through kernels/skinny.py (``LayerChoices.skinny_half``,
  the default since; with it the MLP's ``silu * up`` rides in the down projection's loads, and
  since 0e6ef83 the transformer's norms and the ConvNeXt blocks' GELU, gamma and residual in
  their products too);
- ``-norms``: skinny_half, and the transformer's products without their norms (at 0e6ef83:
  its 17 RMSNorm / residual-add kernels skipped, what a product that normalises its own input
  in its loads would leave; since ``skinny.normed_linear`` does that, the norms' cost inside
  the products);
- ``-convnext``: skinny_half, and each ConvNeXt block's LayerNorm, GELU, gamma and residual
  kernels skipped (what a block as dwconv+norm, product+GELU, product+residual would leave);
- ``-both``: both cut.

argv: [shapes, default 1x1,16x1,1x25] [replays, default 300]."""

from __future__ import annotations

import statistics
import sys
from contextlib import ExitStack
from dataclasses import replace
from unittest import mock

import torch

from code2wav.kernels import skinny
from code2wav.model.choices import DEFAULT_CHOICES
from code2wav.model.layers import ConvNeXtBlock
from code2wav.model.loading import configure_cuda, load_decoder
from code2wav.stream.pool import StatePool, packed_inputs


def _no_norms(stack: ExitStack) -> None:
    def products_only(h, w, norm_weight, eps, residual=None, scale=None, bias=None, enabled=True):
        return skinny.linear(h if residual is None else residual, w, bias, enabled), h

    stack.enter_context(mock.patch.object(skinny, "normed_linear", products_only))


def _convnext_products_only(self, x, step=None):
    h = self.dwconv(x, step).transpose(1, 2)
    on = self.choices.skinny_for(h.dtype)
    h = skinny.linear(skinny.linear(h, self.pwconv1.weight, self.pwconv1.bias, enabled=on), self.pwconv2.weight,
                         self.pwconv2.bias, enabled=on)
    return h.transpose(1, 2)


def _no_convnext_glue(stack: ExitStack) -> None:
    stack.enter_context(mock.patch.object(ConvNeXtBlock, "forward", _convnext_products_only))


VARIANTS = {
    "default": (False, ()),
    "skinny_half": (True, ()),
    "-norms": (True, (_no_norms,)),
    "-convnext": (True, (_no_convnext_glue,)),
    "-both": (True, (_no_norms, _no_convnext_glue)),
}


def capture(model, pool, shape):
    b, t = shape
    _, codes, slots, n_new = packed_inputs(b, t, pool.scratch_slot, "cuda", q=model.config.num_quantizers)
    codes.random_(0, 1024)
    slots.copy_(torch.arange(b) % pool.max_streams)
    n_new.fill_(t)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            pool.run(model, codes, slots, n_new)
    s.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        pool.run(model, codes, slots, n_new)
    return g


def main() -> int:
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[1] if len(sys.argv) > 1 else "1x1,16x1,1x25").split(",")]
    replays = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    configure_cuda(torch.bfloat16)
    model = load_decoder(None, device="cuda", dtype=torch.bfloat16)
    pool = StatePool(model, 32)
    print(f"low-rate stages {model.low_rate_dtype}; graph replay, medians of {replays} alternating, us", flush=True)
    for shape in shapes:
        graphs = {}
        for name, (half, cuts) in VARIANTS.items():
            model.set_layer_choices(replace(DEFAULT_CHOICES, skinny_half=half))
            with ExitStack() as stack:
                for cut in cuts:
                    cut(stack)
                graphs[name] = capture(model, pool, shape)
        times: dict[str, list[float]] = {k: [] for k in graphs}
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        for _ in range(replays):
            for k, g in graphs.items():
                ev[0].record()
                g.replay()
                ev[1].record()
                ev[1].synchronize()
                times[k].append(ev[0].elapsed_time(ev[1]) * 1e3)
        print(f"{shape[0]:3d} x {shape[1]:2d}: " + ", ".join(f"{k} {statistics.median(v):6.1f}" for k, v in times.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
