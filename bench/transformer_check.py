"""The transformer's fused CUDA path on the GPU, full-size model, random weights: numerics against
the module code and a float64 CPU reference (fp32 and bf16, ragged steps, cold and rolling
streams), launches per layer (torch.profiler), and the 1-frame step's graph-replay time, fused
vs unfused, for the transformer alone and for the whole decoder. Run on the device machine:
``python3 bench/transformer_check.py``."""

from __future__ import annotations

import copy
import time

import torch

from code2wav.engine.graphs import GraphRunner
from code2wav.model.config import DecoderConfig
from code2wav.model.init import random_decoder
from code2wav.model.loading import configure_cuda
from code2wav.model.streaming import Step
from code2wav.stream.engine import StreamEngine



def unfused(tr):
    tr = copy.deepcopy(tr)
    for layer in tr.layers:
        layer.self_attn.qkv_weight = None
        layer.mlp.gate_up_weight = None
    return tr


def step_of(tr, pool, slots, n_new, start, device):
    pool = {k: v.clone().to(device) for k, v in pool.items()}
    return pool, Step(pool, slots.to(device), n_new.to(device), start.to(device))


def rel(a, ref):
    return ((a.double().cpu() - ref).norm() / ref.norm()).item()


@torch.no_grad()
def numerics(base) -> None:
    g = torch.Generator().manual_seed(0)
    cfg = DecoderConfig()
    for B, T, n_new, start in ((1, 1, [1], [5000]), (4, 3, [3, 0, 2, 1], [0, 30, 300, 5000])):
        x = torch.randn(B, T, cfg.latent_dim, generator=g)
        pool = {k: torch.randn(9, *s, generator=g) for l in base.layers for k, s in l.self_attn.state_shapes().items()}
        slots, n_new, start = torch.arange(B) * 2, torch.tensor(n_new), torch.tensor(start)
        ref64 = copy.deepcopy(base).double()
        p64, st = step_of(ref64, {k: v.double() for k, v in pool.items()}, slots, n_new, start, "cpu")
        ref = ref64(x.double(), st)
        for dtype in (torch.float32, torch.bfloat16):
            tr = copy.deepcopy(base).to("cuda", dtype)
            outs = {}
            for name, model in (("fused", tr), ("module", unfused(tr))):
                p, st = step_of(model, {k: v.to(dtype) for k, v in pool.items()}, slots, n_new, start, "cuda")
                outs[name] = (model(x.to("cuda", dtype), st), p)
            (f, fp), (m, mp) = outs["fused"], outs["module"]
            pool_err = max(rel(fp[k], p64[k]) for k in p64)
            pool_err_m = max(rel(mp[k], p64[k]) for k in p64)
            print(
                f"B={B} T={T} {str(dtype):15} out rel err vs fp64: fused {rel(f, ref):.2e} module {rel(m, ref):.2e}"
                f" | fused vs module {rel(f, m.double().cpu()):.2e} | pool max rel err fused {pool_err:.2e} module {pool_err_m:.2e}",
                flush=True,
            )


@torch.no_grad()
def launches(base) -> None:
    from torch.profiler import ProfilerActivity, profile

    cfg = DecoderConfig()
    tr = copy.deepcopy(base).to("cuda", torch.bfloat16)
    x = torch.randn(1, 1, cfg.latent_dim, device="cuda", dtype=torch.bfloat16)
    pool = {k: torch.zeros(2, *s) for l in base.layers for k, s in l.self_attn.state_shapes().items()}
    for name, model in (("fused", tr), ("module", unfused(tr))):
        p, st = step_of(model, {k: v.bfloat16() for k, v in pool.items()}, torch.tensor([0]), torch.tensor([1]), torch.tensor([10]), "cuda")
        model(x, st)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            model(x, st)
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        print(f"{name}: {len(kernels)} GPU kernels/copies per transformer step ({len(kernels) / cfg.num_hidden_layers:.1f} per layer incl. per-step ops)")
        if name == "fused":
            for e in kernels[: len(kernels) // cfg.num_hidden_layers + 6]:
                print(f"    {e.name[:100]}")


def graph_ms(fn, reps: int = 200) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


@torch.no_grad()
def timing(base, dec) -> None:
    cfg = DecoderConfig()
    tr = copy.deepcopy(base).to("cuda", torch.bfloat16)
    x = torch.randn(1, 1, cfg.latent_dim, device="cuda", dtype=torch.bfloat16)
    pool = {k: torch.zeros(2, *s) for l in base.layers for k, s in l.self_attn.state_shapes().items()}
    for name, model in (("fused", tr), ("module", unfused(tr))):
        p, st = step_of(model, {k: v.bfloat16() for k, v in pool.items()}, torch.tensor([0]), torch.tensor([1]), torch.tensor([10]), "cuda")
        print(f"transformer 1-frame step, graph replay, bf16, {name}: {graph_ms(lambda: model(x, st)):.3f} ms", flush=True)
    for name in ("fused", "module"):
        m = dec if name == "fused" else copy.deepcopy(dec)
        if name == "module":
            m.pre_transformer = unfused(m.pre_transformer)
        eng = StreamEngine(m, max_streams=4)
        runner = GraphRunner(m, eng.pool, batch_sizes=(1,), frame_sizes=(1,))
        runner.capture()
        codes, slots, n_new = torch.zeros(1, 16, 1, dtype=torch.long), torch.tensor([0]), torch.tensor([1])
        for _ in range(10):
            runner(codes, slots, n_new)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(100):
            runner(codes, slots, n_new)
        torch.cuda.synchronize()
        print(f"decoder 1-frame step (GraphRunner, bf16, channels-last), {name}: {(time.perf_counter() - t0) * 10:.3f} ms", flush=True)
        del runner, eng


def main() -> None:
    configure_cuda(torch.float32)  # no TF32: fp32 means fp32
    print("torch", torch.__version__, torch.cuda.get_device_name())
    dec = random_decoder(DecoderConfig())  # fused by random_decoder
    base = dec.pre_transformer
    assert base.is_fused
    numerics(base)
    launches(base)
    dec.fold_codebooks(torch.bfloat16)
    dec = dec.to("cuda", torch.bfloat16).eval().requires_grad_(False).channels_last()
    configure_cuda(torch.bfloat16)
    timing(base, dec)


if __name__ == "__main__":
    main()
