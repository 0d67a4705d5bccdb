"""GPU checks (run on a GPU machine, not in CI): kernels and graph replay against eager and the
float64 CPU reference. Prints one line per check and exits non-zero on any failure."""

from __future__ import annotations

import sys
import time
from dataclasses import replace

import torch

from code2wav.engine.graphs import GraphRunner
from code2wav.kernels.snake import snake_beta, snake_beta_eager
from code2wav.model.choices import DEFAULT_CHOICES, LayerChoices
from code2wav.model.config import DecoderConfig
from code2wav.model.decoder import Decoder
from code2wav.model.init import random_decoder
from code2wav.model.loading import configure_cuda
from code2wav.model.low_rate import auto_low_rate
from code2wav.stream.engine import StreamEngine
from code2wav.stream.pool import StatePool

SPF = 1920
failures: list[str] = []


def check(name: str, ok: bool, detail: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        failures.append(name)


def load(weights: dict, dtype: torch.dtype, device: str, low_rate_dtype: torch.dtype | None = None,
         channels_last: bool = True, layers: LayerChoices = DEFAULT_CHOICES) -> Decoder:
    configure_cuda(dtype)
    m = Decoder(DecoderConfig())
    m.load_state_dict(weights)
    m.to_dtypes(dtype, device, low_rate_dtype)
    m.set_layer_choices(layers)
    return m.channels_last() if channels_last and device.startswith("cuda") else m


def snr_db(ref: torch.Tensor, x: torch.Tensor) -> float:
    ref, x = ref.double(), x.double()
    return 10 * torch.log10(ref.pow(2).sum() / (ref - x).pow(2).sum()).item()


def graph_stream(model: Decoder, codes: torch.Tensor) -> torch.Tensor:
    """The check stream (prefix 40, chunks 1,25,25,25,4) through graphs of its chunk sizes'
    buckets only, prefill included."""
    runner = GraphRunner(model, StatePool(model, 2), batch_sizes=(1,), frame_sizes=(1, 4, 25), max_batch_frames=32)
    e = StreamEngine(model, runner=runner)
    e.runner.capture(e.prefill_shapes())
    return stream(e, "x", codes, 40, [1, 25, 25, 25, 4])


def stream(engine: StreamEngine, rid: str, codes: torch.Tensor, prefix: int, sizes: list[int]) -> torch.Tensor:
    engine.open(rid, codes[:prefix])
    out, at = [], prefix
    for n in sizes:
        out.append(engine.push(rid, codes[at : at + n]))
        at += n
    engine.finish(rid)
    return torch.cat(out)


def main() -> int:
    torch.manual_seed(0)
    # 1. SnakeBeta kernel == eager formula.
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(4, 96, 9999, device="cuda", dtype=dtype) * 3
        a, b = torch.randn(96, device="cuda", dtype=dtype) * 0.3, torch.randn(96, device="cuda", dtype=dtype) * 0.3
        ref = snake_beta_eager(x.float(), a.float(), b.float())
        err = ((snake_beta(x, a, b).float() - ref).abs().max() / ref.abs().max()).item()
        check(f"snake kernel {dtype}", err < (1e-5 if dtype == torch.float32 else 1e-2), f"max rel err {err:.2e}")

    weights = random_decoder(DecoderConfig()).state_dict()
    m64 = load(weights, torch.float64, "cpu")
    m32 = load(weights, torch.float32, "cuda")  # channels-last, the CUDA default
    mbf = load(weights, torch.bfloat16, "cuda")
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 2048, (200, 16), generator=g)

    # 2. GPU fp32 streaming (graphs) vs CPU fp64 whole-utterance forward.
    with torch.no_grad():
        ref = m64(codes[:120].T[None])[0, 0][40 * SPF :]
    m32c = load(weights, torch.float32, "cuda", channels_last=False)
    for name, mod in (("contiguous", m32c), ("channels-last", m32)):
        s32 = graph_stream(mod, codes).double()  # m32's, the last, is compared again in the PDL check
        err = ((s32 - ref).abs().max() / ref.abs().max()).item()
        check(f"graph fp32 stream ({name} convs) vs fp64 forward", err <= 1e-4, f"max err / peak {err:.2e} (prefix 40, chunks 1,25,25,25,4)")
    del m32c

    # 3. bf16 graph stream SNR vs fp32.
    s_bf16 = graph_stream(mbf, codes)
    snr = snr_db(ref, s_bf16.float())
    with torch.no_grad():
        whole_bf16 = mbf(codes[:120].T[None].cuda())[0, 0][40 * SPF :].float().cpu()
    snr_whole = snr_db(ref, whole_bf16)
    detail = f"stream {snr:.1f} dB; our whole-utterance bf16 forward {snr_whole:.1f} dB"
    try:
        sys.path.insert(0, ".")
        from tests.official import official_decoder, reference_config

        off = official_decoder(reference_config()["decoder_config"])
        off.load_state_dict(weights)
        off = off.to("cuda", torch.bfloat16)
        with torch.no_grad():
            off_bf16 = off(codes[:120].T[None].cuda())[0, 0][40 * SPF :].float().cpu()
        detail += f"; official bf16 forward {snr_db(ref, off_bf16):.1f} dB"
        del off
    except Exception as e:  # the official package may be missing on the machine
        detail += f"; official not run ({type(e).__name__})"
    # Streaming must add nothing to bf16 rounding: compare with the same weights' whole forward
    # (ours and official).
    check("graph bf16 stream SNR == whole bf16 forward", snr >= snr_whole - 0.5, detail)
    # The target, for the default bf16 model (low-rate stages in float32 / TF32), and the
    # all-bf16 model's figure for comparison.
    snr_all = snr_db(ref, graph_stream(load(weights, torch.bfloat16, "cuda", torch.bfloat16), codes).float())
    snr_lr16 = snr_db(ref, graph_stream(load(weights, torch.bfloat16, "cuda", torch.float16), codes).float())
    check("graph bf16 stream SNR >= 30 dB vs fp64", snr >= 30.0, f"{snr:.1f} dB; all-bf16 (low-rate stages bf16 too) {snr_all:.1f} dB;"
          f" low-rate stages float16 {snr_lr16:.1f} dB")
    # 3a. low_rate_dtype="auto" (model/low_rate.py): the probe on these weights, its choice and cost,
    # and the stream it gives within the same bound.
    m_auto = load(weights, torch.bfloat16, "cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    chosen = auto_low_rate(m_auto)
    torch.cuda.synchronize()
    probe_s = time.perf_counter() - t0
    snr_auto = snr_db(ref, graph_stream(m_auto, codes).float())
    check("low-rate dtype auto: float16 on these weights, bf16 stream SNR >= 30 dB", chosen == torch.float16 and snr_auto >= 30.0,
          f"{m_auto.precision()['low_rate_dtype']}, probe peak {m_auto.low_rate_peak:.3g} in {probe_s * 1e3:.0f} ms (first run: "
          f"kernels compiled); {snr_auto:.1f} dB")
    del m_auto
    # 3a''. The few-row half products (float16 low-rate stages, the bf16 conv stack's few-row
    # convs) through kernels/skinny.py or cuBLAS: whichever LayerChoices.skinny_half the default
    # does not pick, with auto's low-rate stages, within the same bound.
    flipped = replace(m32.layer_choices, skinny_half=not m32.layer_choices.skinny_half)
    m_flip = load(weights, torch.bfloat16, "cuda", layers=flipped)
    auto_low_rate(m_flip)
    snr_flip = snr_db(ref, graph_stream(m_flip, codes).float())
    check(f"skinny_half={flipped.skinny_half}, low-rate auto: bf16 stream SNR >= 30 dB", snr_flip >= 30.0,
          f"{snr_flip:.1f} dB (default layers {snr_auto:.1f} dB)")
    del m_flip
    # 3a'''. Kernels launched with PDL (LayerChoices.pdl, kernels/pdl.py) or plainly: whichever the
    # default does not pick, the fp32 stream through graphs within the bound of check 2, and how
    # far it lies from the default's (the same kernels in the same order: a race would show here).
    other = replace(m32.layer_choices, pdl=not m32.layer_choices.pdl)
    s_other = graph_stream(load(weights, torch.float32, "cuda", layers=other), codes).double()
    err_other = ((s_other - ref).abs().max() / ref.abs().max()).item()
    apart = ((s_other - s32).abs().max() / ref.abs().max()).item()
    check(f"pdl={other.pdl}: graph fp32 stream vs fp64 forward", err_other <= 1e-4,
          f"max err / peak {err_other:.2e}; from the default's stream {apart:.2e}")
    # 3a (attention). Attention as RoPE + KV concat, a mask and SDPA (LayerChoices.attention_frames=0)
    # instead of one kernel a layer (kernels/attention.py, the default): the fp32 stream within
    # check 2's bound and how far it lies from the default's, the bf16 stream within the SNR bound.
    sdpa = replace(m32.layer_choices, attention_frames=0)
    s_sdpa = graph_stream(load(weights, torch.float32, "cuda", layers=sdpa), codes).double()
    err_sdpa = ((s_sdpa - ref).abs().max() / ref.abs().max()).item()
    apart = ((s_sdpa - s32).abs().max() / ref.abs().max()).item()
    snr_sdpa = snr_db(ref, graph_stream(load(weights, torch.bfloat16, "cuda", layers=sdpa), codes).float())
    check("attention_frames=0 (RoPE + KV concat, SDPA): fp32 stream vs fp64, bf16 stream SNR >= 30 dB",
          err_sdpa <= 1e-4 and snr_sdpa >= 30.0,
          f"max err / peak {err_sdpa:.2e}, from the default's stream {apart:.2e}; {snr_sdpa:.1f} dB (default layers {snr:.1f} dB)")
    # (Every residual unit as one kernel, unit_conv_rows=1, is the default's own form since
    # session 15: check 3 runs it.)
    # 3b'. The 96-channel units as the CUDA C++ kernel are the default on sm90
    # (unit_window_rows=1); the other form, the Triton one-kernel unit there too
    # (unit_window_rows=0), within the same bound.
    if torch.cuda.get_device_capability() == (9, 0):
        triton_units = replace(m32.layer_choices, unit_window_rows=0)
        snr_uw = snr_db(ref, graph_stream(load(weights, torch.bfloat16, "cuda", layers=triton_units), codes).float())
        check("96-channel units as the Triton kernel: bf16 stream SNR >= 30 dB", snr_uw >= 30.0,
              f"{snr_uw:.1f} dB (default layers, the wgmma kernel: {snr:.1f} dB)")
        # One warpgroup filling the window unit's windows (window_producers=1) computes the
        # same values as the default's two: the bf16 stream equal to the default's.
        one = replace(m32.layer_choices, window_producers=1)
        s_one = graph_stream(load(weights, torch.bfloat16, "cuda", layers=one), codes)
        apart_one = (s_one.float() - s_bf16.float()).abs().max().item()
        check("window_producers=1: the bf16 stream equal to the default's (2)", apart_one == 0.0,
              f"max difference {apart_one:.3g}; {snr_db(ref, s_one.float()):.1f} dB")
        # The 192-channel units as the CUDA C++ kernel with streamed weights in large steps are
        # the default (unit_streamed_rows); the Triton unit everywhere (0) and the streamed one
        # in every step (1), within the same bound.
        for rows in (0, 1):
            other = replace(m32.layer_choices, unit_streamed_rows=rows)
            snr_us = snr_db(ref, graph_stream(load(weights, torch.bfloat16, "cuda", layers=other), codes).float())
            check(f"unit_streamed_rows={rows} (192-channel units: {'Triton' if rows == 0 else 'streamed, every step'}): bf16 stream "
                  "SNR >= 30 dB", snr_us >= 30.0, f"{snr_us:.1f} dB (default layers {snr:.1f} dB)")
        # The 384-channel units' tail as the CUDA C++ kernel (tail_wide_rows=1) against the
        # default's three passes: the bf16 stream within the SNR bound and as close to the
        # float64 stream as the default's.
        tails = replace(m32.layer_choices, tail_wide_rows=1)
        snr_tw = snr_db(ref, graph_stream(load(weights, torch.bfloat16, "cuda", layers=tails), codes).float())
        check("tail_wide_rows=1 (the 384-channel tails as one kernel): bf16 stream SNR >= 30 dB, within 0.3 dB of the default's",
              snr_tw >= 30.0 and snr_tw >= snr - 0.3, f"{snr_tw:.1f} dB (default layers {snr:.1f} dB)")
    # 3b''. The window unit and the output conv read their own history by default
    # (read_history=True); the other form, the history concat before them (read_history=False):
    # the fp32 stream within check 2's bound, the bf16 stream within the SNR bound. And the
    # 384/768-channel units' tail as one GEMM after SnakeBeta (wide_tail=True, off by default).
    concat = replace(m32.layer_choices, read_history=False)
    err_cat = ((graph_stream(load(weights, torch.float32, "cuda", layers=concat), codes).double() - ref).abs().max() / ref.abs().max()).item()
    snr_cat = snr_db(ref, graph_stream(load(weights, torch.bfloat16, "cuda", layers=concat), codes).float())
    check("read_history=False (the history concat): fp32 stream vs fp64, bf16 stream SNR >= 30 dB",
          err_cat <= 1e-4 and snr_cat >= 30.0, f"max err / peak {err_cat:.2e}; {snr_cat:.1f} dB (default layers {snr:.1f} dB)")
    wide = replace(m32.layer_choices, wide_tail=True)
    snr_wide = snr_db(ref, graph_stream(load(weights, torch.bfloat16, "cuda", layers=wide), codes).float())
    check("wide_tail=True: bf16 stream SNR >= 30 dB", snr_wide >= 30.0, f"{snr_wide:.1f} dB (default layers {snr:.1f} dB)")
    # 3a'. The last decoder block's ConvTranspose as one kernel is the default (convt_kernel_rows=1,
    # at the widths kernels/convt.TILES names); the other form, cuBLAS's two products everywhere
    # (convt_kernel_rows=0), within the same bound.
    pairs = replace(m32.layer_choices, convt_kernel_rows=0)
    snr_ck = snr_db(ref, graph_stream(load(weights, torch.bfloat16, "cuda", layers=pairs), codes).float())
    check("ConvTransposes as two cuBLAS products: bf16 stream SNR >= 30 dB", snr_ck >= 30.0, f"{snr_ck:.1f} dB (default layers {snr:.1f} dB)")

    # 3b. fp16 (same tensor-core speed, 3 more mantissa bits): the same stream through graphs.
    out16 = graph_stream(load(weights, torch.float16, "cuda"), codes).float()
    snr16 = snr_db(ref, out16)
    check("graph fp16 stream SNR >= 30 dB", bool(torch.isfinite(out16).all()) and snr16 >= 30.0, f"{snr16:.1f} dB vs fp64")
    # 3c. The ConvTranspose layers as cuDNN's transposed conv (copies of the models with
    # ``LayerChoices.convt_gemm`` off; the checks above ran the default, GEMMs): within the same
    # bounds, through graphs.
    cudnn_convt = replace(m32.layer_choices, convt_gemm=False)
    err = ((graph_stream(load(weights, torch.float32, "cuda", layers=cudnn_convt), codes).double() - ref).abs().max() / ref.abs().max()).item()
    snr_cudnn = snr_db(ref, graph_stream(load(weights, torch.bfloat16, "cuda", layers=cudnn_convt), codes).float())
    check("ConvTranspose as cuDNN's conv: fp32 stream vs fp64, bf16 SNR", err <= 1e-4 and snr_cudnn >= 30.0,
          f"max err / peak {err:.2e}; bf16 {snr_cudnn:.1f} dB (as GEMMs, the default: {snr:.1f} dB)")
    if "--quick" in sys.argv:  # skips the all-buckets captures below (minutes of cuDNN autotune)
        print(f"SUMMARY gpu_check (quick): {len(failures)} failed: {failures}")
        return 1 if failures else 0

    # 4. Graph replay == eager for every captured shape (fp32: differences are real, not bf16 noise).
    # (Bucket sizes trimmed so the check fits one device call; the capture logic is the same.)
    eager = StreamEngine(m32, max_streams=8, max_step_frames=32, max_batch_frames=128)
    gr = GraphRunner(m32, StatePool(m32, 8), batch_sizes=(1, 2, 8), frame_sizes=(1, 4, 25), max_batch_frames=128)
    graph = StreamEngine(m32, runner=gr, max_step_frames=32, max_batch_frames=128)
    t0 = time.perf_counter()
    gr.capture(graph.prefill_shapes())
    check("capture fp32 (buckets b in 1,2,8 + fill, t in 1,4,25; prefill shapes)", True,
          f"{len(gr.graphs)} graphs in {time.perf_counter() - t0:.1f}s, pool {gr.memory_bytes() / 2**20:.0f} MiB")
    errs: dict[tuple[int, int], float] = {}
    for b, t in sorted(gr.graphs):
        rows = max(1, b - 1) if b > 1 else 1  # one fewer than the bucket: exercises row padding
        ids = [f"{b}-{t}-{i}" for i in range(rows)]
        for i, rid in enumerate(ids):
            pre = codes[: (i * 13) % 90]  # cold, growing and rolling rows together
            eager.open(rid, pre)
            graph.open(rid, pre)
        worst = 0.0
        for _ in range(2):
            chunk = {rid: torch.randint(0, 2048, (max(1, t - (i % 2)), 16), generator=g) for i, rid in enumerate(ids)}
            a, bb = eager.decode(chunk), graph.decode(chunk)
            for rid in ids:
                d = (a[rid].float() - bb[rid].float()).abs().max().item() / max(a[rid].float().abs().max().item(), 1e-6)
                worst = max(worst, d)
        errs[(b, t)] = worst
        for rid in ids:
            eager.finish(rid)
            graph.finish(rid)
    bad = {k: f"{v:.1e}" for k, v in errs.items() if v > 1e-4}
    check("graph replay == eager, every shape (fp32)", not bad, f"worst {max(errs.values()):.2e}; failing buckets {bad}; runner {gr.stats()}")
    del gr, graph, eager
    torch.cuda.empty_cache()

    # (Graph memory by frame budget: bench/graph_memory.py.)

    # 5. Memory of a 10-minute offline decode (bf16): bounded by the piece size, not the length.
    from code2wav.offline import decode

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    long_codes = torch.randint(0, 2048, (7500, 16), generator=g)
    t0 = time.perf_counter()
    wav = decode(mbf, long_codes)[0]
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    check("10-minute offline decode (bf16)", wav.numel() == 7500 * SPF, f"{dt:.1f}s, {600 / dt:.0f}x RT, peak extra {peak:.0f} MiB")
    print(f"SUMMARY gpu_check: {len(failures)} failed: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
