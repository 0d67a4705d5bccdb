"""Does a small step wait on its weights' reads from HBM? A one-frame step reads every layer's
weights once (~220 MB in bf16/fp16), and L2 (50 MB) cannot hold them from one step to the next;
most of its ~160 kernels are short products whose time may be the first touch of their weights.
This captures the step with a side branch in the graph that asks L2 to prefetch the weights of
the layers ``AHEAD`` places ahead (``cp.async.bulk.prefetch.L2``), each prefetch forked from the
main chain when an earlier layer starts, so the prefetched bytes arrive shortly before they are
read and do not evict each other. Graph replay per step shape, alternating: no prefetch, and a
prefetch at each lead; with the default products (cuBLAS) and with the skinny kernel for half
products (``LayerChoices.skinny_half``, whose own time in a step was ~4.7 us a product from HBM
against ~2 us from L2, session 19). Prototype: bench only, the model is patched from outside.
argv: [shapes, default 1x1,16x1,1x25,16x25] [leads, default 1,2,4] [replays, default 200]."""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace

import torch
import triton
import triton.language as tl

from code2wav.model.choices import DEFAULT_CHOICES
from code2wav.model.loading import configure_cuda, load_decoder
from code2wav.stream.pool import StatePool, packed_inputs

PIECE = 4096  # bytes per prefetch instruction
LANES = 16  # instructions per program


@triton.jit
def _prefetch_kernel(w_ptr, nbytes, PIECE: tl.constexpr, LANES: tl.constexpr):
    i = tl.program_id(0) * LANES + tl.arange(0, LANES)
    start = tl.minimum(i.to(tl.int64) * PIECE, ((nbytes - 1) // PIECE) * PIECE)
    size = tl.minimum(nbytes - start, PIECE)
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n mov.u32 $0, 0;", "=r,l,r",
                              [w_ptr + start, size.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill one range of memory, in any order of its axes."""
    expect = 1
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1):
        if stride != expect:
            return False
        expect *= size
    return True


def prefetch(tensors: list[torch.Tensor]) -> None:
    for t in tensors:  # dense in memory (channels-last conv weights too): its bytes as one range
        n = t.numel() * t.element_size()
        if n >= 16 and n % 16 == 0 and _dense(t) and t.data_ptr() % 16 == 0:
            u = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage(), t.storage_offset() * t.element_size(), (n,))
            _prefetch_kernel[(triton.cdiv(n, PIECE * LANES),)](u, n, PIECE=PIECE, LANES=LANES)


def stages(model) -> list[tuple[object, list[torch.Tensor]]]:
    """The step's weight-reading stages in order: (module whose start triggers, its weights).
    The transformer's layers run in its fused loop (no module call): they are keyed by their
    attention module, whose ``attend_one_kernel`` is patched (since 0e6ef83 it runs after the
    layer's q/k/v product, which was inside it when call 1 ran this)."""
    out = [(model.pre_conv, list(model.pre_conv.parameters()))]
    tr = model.pre_transformer
    out.append((None, [tr.input_proj.weight]))
    for layer in tr.layers:
        a, m = layer.self_attn, layer.mlp
        ws = [w for w in (a.qkv_weight, a.o_proj.weight, m.gate_up_weight, m.down_proj.weight) if w is not None]
        out.append((a, ws))
    out.append((None, [tr.output_proj.weight]))
    for blk in model.upsample:
        for sub in blk:
            out.append((sub, [p for p in sub.parameters() if p.dim() > 1]))
    for blk in model.decoder:
        kids = list(blk.block) if hasattr(blk, "block") else [blk]
        for sub in kids:
            ps = [p for p in sub.parameters() if p.dim() > 1]
            if ps:
                out.append((sub, ps))
    return out


class Prefetcher:
    """At the start of stage i (while capturing), fork the side stream and prefetch stage i +
    ``ahead``'s weights there; the first ``ahead`` stages at the step's start; join at its end."""

    def __init__(self, model, ahead: int):
        self.model, self.ahead, self.on = model, ahead, False
        self.side = torch.cuda.Stream()
        self.st = stages(model)
        self.handles = []
        for i, (mod, _) in enumerate(self.st):
            if mod is None:
                continue
            if hasattr(mod, "attend_one_kernel"):
                orig = mod.attend_one_kernel

                def patched(*a, _i=i, _orig=orig, **k):
                    self.trigger(_i)
                    return _orig(*a, **k)

                mod.attend_one_kernel = patched
                self.handles.append((mod, orig))
            else:
                self.handles.append(mod.register_forward_pre_hook(lambda m, a, _i=i: self.trigger(_i)))

    def trigger(self, i: int) -> None:
        j = i + self.ahead
        if self.on and j < len(self.st):
            self._fork([j])

    def _fork(self, idx: list[int]) -> None:
        cur = torch.cuda.current_stream()
        self.side.wait_stream(cur)
        with torch.cuda.stream(self.side):
            for j in idx:
                prefetch(self.st[j][1])

    def begin(self) -> None:
        if self.on:
            self._fork(list(range(min(self.ahead, len(self.st)))))

    def end(self) -> None:
        if self.on:
            torch.cuda.current_stream().wait_stream(self.side)


def capture(model, pool, shape, pf: Prefetcher | None):
    b, t = shape
    _, codes, slots, n_new = packed_inputs(b, t, pool.scratch_slot, "cuda", q=model.config.num_quantizers)
    codes.random_(0, 1024)
    slots.copy_(torch.arange(b) % pool.max_streams)
    n_new.fill_(t)

    def fn():
        if pf is not None:
            pf.begin()
        out = pool.run(model, codes, slots, n_new)
        if pf is not None:
            pf.end()
        return out

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    s.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        out = fn()
    return g, out


def timed(graphs: dict[str, torch.cuda.CUDAGraph], replays: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in graphs}
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    for _ in range(replays):
        for k, g in graphs.items():  # alternating
            ev[0].record()
            g.replay()
            ev[1].record()
            ev[1].synchronize()
            times[k].append(ev[0].elapsed_time(ev[1]) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> int:
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[1] if len(sys.argv) > 1 else "1x1,16x1,1x25,16x25").split(",")]
    leads = [int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "1,2,4").split(",")]
    replays = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    configure_cuda(torch.bfloat16)
    model = load_decoder(None, device="cuda", dtype=torch.bfloat16)
    pool = StatePool(model, 32)
    total = sum(sum(w.numel() * w.element_size() for w in ws) for _, ws in stages(model))
    print(f"weights in the stages: {total / 2**20:.1f} MiB; low-rate {model.low_rate_dtype}", flush=True)
    for products in ("cublas", "skinny_half"):
        model.set_layer_choices(replace(DEFAULT_CHOICES, skinny_half=products == "skinny_half"))
        for shape in shapes:
            graphs = {}
            g, _ = capture(model, pool, shape, None)
            graphs["none"] = g
            for lead in leads:
                pf = Prefetcher(model, lead)
                pf.on = True
                graphs[f"ahead {lead}"], _ = capture(model, pool, shape, pf)
                pf.on = False
                for h in pf.handles:
                    if isinstance(h, tuple):
                        del h[0].attend_one_kernel  # the class's method again
                    else:
                        h.remove()
            res = timed(graphs, replays)
            print(f"{products:12s} {shape[0]:3d} x {shape[1]:2d}: " + ", ".join(f"{k} {v:7.1f} us" for k, v in res.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
