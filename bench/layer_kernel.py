"""The transformer layers of few-row steps as one persistent kernel each (kernels/layer.py) against
their separate launches, on CUDA: the same step's outputs and pool both ways, then the front pass
(dequantizer, pre_conv, transformer) graph-replayed per step shape.

    python3 bench/layer_kernel.py [DTYPE] [SHAPES]    # default: bfloat16 1x1,16x1,1x25,32x1
    python3 bench/layer_kernel.py DTYPE SHAPES breakdown

``breakdown``: one layer's kernel alone, eight launches a graph, with its phases cut after each
one (``FIRST``/``LAST``: the barriers and prefetches stay) and in variants (no prefetch, the
products' whole K in one load, wider column tiles): microseconds a launch.

DTYPE is the conv stack's; the low-rate stages (the transformer) take ``auto``'s choice, as a
default load does. Prints, per shape, the largest difference between the two ways (outputs and
every layer's key/value history, relative to the peak) and the replay times in microseconds.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch

from code2wav.model.config import DecoderConfig
from code2wav.model.init import random_decoder
from code2wav.model.low_rate import auto_low_rate
from code2wav.stream.pool import StatePool


def front_graph(model, pool: StatePool, codes: torch.Tensor, slots: torch.Tensor, n_new: torch.Tensor):
    """A graph of ``pool.front`` over fixed inputs (positions advance on every replay)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            pool.front(model, codes, slots, n_new)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = pool.front(model, codes, slots, n_new)
    return g, out


def replay_us(g: torch.cuda.CUDAGraph, n: int = 300) -> float:
    for _ in range(20):
        g.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / n


def breakdown(model, b: int, t: int) -> None:
    """Microseconds a launch of layer 0's kernel, phases cut and variants (see the docstring)."""
    from code2wav.kernels import layer as lk

    tr = model.pre_transformer
    lay = tr.layers[0]
    attn, mlp = lay.self_attn, lay.mlp
    pool = StatePool(model, b + 1)
    slots, n_new = torch.arange(b, device="cuda"), torch.full((b,), t, device="cuda")
    step = pool.step(slots, n_new)
    C = tr.norm.weight.shape[0]
    h = torch.randn(b, t, C, device="cuda").to(model.low_rate_dtype)
    d = torch.randn(b, t, C, device="cuda").to(model.low_rate_dtype)
    args = (h, d, lay.mlp_layer_scale.scale, lay.input_layernorm.weight, lay.input_layernorm.eps, attn.qkv_weight, attn.n_heads,
            attn.n_kv, tr.rotary.inv_freq, *attn.pool_kv(step), step.slots, step.n_new, step.start, attn.sliding_window,
            attn.o_proj.weight, lay.self_attn_layer_scale.scale, lay.post_attention_layernorm.weight, mlp.gate_up_weight,
            mlp.down_proj.weight)
    width, inner = attn.n_heads * attn.head_dim, mlp.down_proj.weight.shape[1]
    variants = [(f"phases 1..{p}", {"FIRST": 1 if p else 0, "LAST": p}) for p in range(6)]
    variants += [("no prefetch", {"PREFETCH": False}), ("whole-K loads", {"BK_O": width, "BK_D": inner}),
                 ("32-column tiles", {"BN": 32}), ("prefetch only", {"FIRST": 0, "LAST": 0, "PREFETCH": True})]
    print(f"{b}x{t}: one layer's kernel, us a launch")
    for name, tune in variants:
        for _ in range(2):
            lk.layer(*args, tune=tune)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(8):
                lk.layer(*args, tune=tune)
        print(f"  {name:<18} {replay_us(g, 100) / 8:8.1f}", flush=True)


def main() -> int:
    dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[2] if len(sys.argv) > 2 else "1x1,16x1,1x25,32x1").split(",")]
    model = random_decoder(DecoderConfig()).to_dtypes(dtype, "cuda")
    auto_low_rate(model)  # the low-rate stages as a default load runs them
    on = model.layer_choices if model.layer_choices.layer_kernel_rows else replace(model.layer_choices, layer_kernel_rows=32)
    off = replace(on, layer_kernel_rows=0)
    cfg = model.config
    if len(sys.argv) > 3 and sys.argv[3] == "breakdown":
        for b, t in shapes:
            breakdown(model, b, t)
        return 0
    print(f"{dtype}, low-rate stages {model.low_rate_dtype}; layer_kernel_rows {on.layer_kernel_rows} vs 0")
    print(f"{'shape':>7} {'out diff':>9} {'pool diff':>9} {'kernel us':>10} {'launches us':>12}")
    ok = True
    for b, t in shapes:
        g = torch.Generator().manual_seed(b * 100 + t)
        pool = StatePool(model, b + 1)
        for buf in pool.buffers.values():  # a history that matters: rolled streams
            buf.copy_(torch.randn(buf.shape, generator=g).to(buf.dtype))
        pool.position.fill_(500)
        slots = torch.arange(b, device="cuda")
        n_new = torch.full((b,), t, device="cuda")
        codes = torch.randint(0, cfg.codebook_size, (b, cfg.num_quantizers, t), generator=g).cuda()
        saved = {k: v.clone() for k, v in pool.buffers.items()}, pool.position.clone()
        outs, pools = [], []
        for choice in (on, off):
            for k, v in saved[0].items():
                pool.buffers[k].copy_(v)
            pool.position.copy_(saved[1])
            model.set_layer_choices(choice)
            outs.append(pool.front(model, codes, slots, n_new).float())
            pools.append({k: v.float().clone() for k, v in pool.buffers.items() if k.startswith("pre_transformer")})
        peak = outs[1].abs().max().item()
        out_diff = (outs[0] - outs[1]).abs().max().item() / peak
        pool_diff = max((pools[0][k] - pools[1][k]).abs().max().item() / max(pools[1][k].abs().max().item(), 1e-30) for k in pools[1])
        times = []
        for choice in (on, off):
            model.set_layer_choices(choice)
            graph, _ = front_graph(model, pool, codes, slots, n_new)
            times.append(replay_us(graph))
            del graph
        bound = 1e-5 if model.low_rate_dtype == torch.float32 else 2e-2
        ok &= out_diff <= bound and pool_diff <= bound
        print(f"{b:>3}x{t:<3} {out_diff:9.2e} {pool_diff:9.2e} {times[0]:10.1f} {times[1]:12.1f}", flush=True)
    print("PASS" if ok else "FAIL: the two ways differ beyond rounding")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
