"""Exact streaming: the delta-input contract against the whole-utterance forward.

For a stream opened with reference prefix ``codes[:P]`` and fed ``codes[P:P+N]`` in any chunk
schedule, the concatenated pushes must equal ``forward(codes[:P+N])[P*1920:]``. Because the
decoder is causal, ``forward(codes[:L])`` is the first ``L*1920`` samples of ``forward(codes)``,
so one reference forward serves every (prefix, length) pair cut from the same code sequence.
"""

from __future__ import annotations

import contextlib
import copy
import random

import pytest
import torch

from code2wav.options import chunk_schedule
from code2wav.stream.baselines import BaselineEngine
from code2wav.stream.engine import StreamEngine
from tests.models import FULL, SMALL, forward_audio, model, one_thread, ragged_pair, random_codes, stream_alone

SPF = 1920


@pytest.fixture(autouse=True)
def _threads(request):
    if request.node.get_closest_marker("slow"):  # full-size tests use every core
        yield
        return
    with one_thread():
        yield


def schedule_sizes(schedule: list[int], total: int) -> list[int]:
    """Chunk sizes in order, the last repeating, cut to ``total`` frames (the CLI's rule)."""
    return chunk_schedule(total, schedule)


def ragged(seed: int, total: int, hi: int = 30) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(1, hi) for _ in range(total)]


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a - b).abs().max().item()


SCHEDULES = {"1": [1], "25": [25], "1,25": [1, 25], "ramp": [4, 4, 8, 16, 25], "ragged": ragged(7, 100)}


# -- full-size architecture, float64 -----------------------------------------------------------


@pytest.fixture(scope="module")
def full64():
    m = model(FULL, torch.float64)
    codes = random_codes(240, FULL, seed=1)  # the longest case: a 200-frame prefix + 40 frames
    return m, codes, forward_audio(m, codes)


@pytest.mark.slow
def test_full_size_streams_batched_together_match_forward(full64):
    """Five streams of the real architecture (prefixes 0/1/12/72/200, five schedules) step in the
    same batches, cold and rolling rows together, and each equals its forward within 1e-9.
    (40 frames: "p0" grows through 40 one-frame steps; "p72" and "p200" roll their KV window.)"""
    m, codes, ref = full64
    n = 40
    cases = {"p0": (0, [1]), "p1": (1, [25]), "p12": (12, [1, 25]), "p72": (72, [4, 8, 25]), "p200": (200, SCHEDULES["ragged"])}
    engine = StreamEngine(m, max_streams=8, max_step_frames=32)
    pending = {rid: schedule_sizes(s, n) for rid, (p, s) in cases.items()}
    at = {rid: p for rid, (p, _) in cases.items()}
    outs: dict[str, list[torch.Tensor]] = {rid: [] for rid in cases}
    for rid, (p, _) in cases.items():
        engine.open(rid, codes[:p])
    while any(pending.values()):
        batch = {}
        for rid, sizes in pending.items():
            if sizes:
                size = sizes.pop(0)
                batch[rid] = codes[at[rid] : at[rid] + size]
                at[rid] += size
        for rid, audio in engine.decode(batch).items():
            outs[rid].append(audio)
    for rid, (p, _) in cases.items():
        engine.finish(rid)
        assert max_err(torch.cat(outs[rid]), ref[p * SPF : (p + n) * SPF]) <= 1e-9, rid
    assert engine.active == 0 and engine.pool.in_use == 0


@pytest.mark.slow
def test_full_size_float32_within_1e4_of_peak():
    m32 = model(FULL, torch.float32)
    m64 = model(FULL, torch.float64)
    codes = random_codes(40, FULL, seed=2)
    ref = forward_audio(m64, codes)[12 * SPF :]
    out = stream_alone(StreamEngine(m32, max_streams=1), "a", codes.clone(), 12, 28, [1, 25])
    assert max_err(out.double(), ref) <= 1e-4 * ref.abs().max().item()


# -- shrunk architecture: the full matrix --------------------------------------------------------


@pytest.fixture(scope="module")
def small64():
    m = model(SMALL, torch.float64)
    codes = random_codes(200 + 620, SMALL, seed=3)
    return m, codes, forward_audio(m, codes)


@pytest.mark.parametrize("prefix", [0, 1, 12, 72, 200])
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedule_and_prefix_matrix_float64(small64, prefix, name):
    m, codes, ref = small64
    n = 150  # crosses the 72-frame window
    out = stream_alone(StreamEngine(m, max_streams=2), "s", codes, prefix, n, SCHEDULES[name])
    assert max_err(out, ref[prefix * SPF : (prefix + n) * SPF]) <= 1e-9


@pytest.mark.parametrize("prefix", [0, 72])
def test_crossing_eight_windows_float64(small64, prefix):
    """8 layers x 71 frames is the transformer's receptive field: run well past it."""
    m, codes, ref = small64
    n = 8 * 72 + 20
    out = stream_alone(StreamEngine(m, max_streams=1), "s", codes, prefix, n, [1, 25, 7])
    assert max_err(out, ref[prefix * SPF : (prefix + n) * SPF]) <= 1e-9


@pytest.mark.parametrize("name", ["1,25", "ragged"])
def test_float32_within_1e4_of_peak(small64, name):
    _, codes, ref = small64
    out = stream_alone(StreamEngine(model(SMALL, torch.float32), max_streams=1), "s", codes, 12, 150, SCHEDULES[name])
    expect = ref[12 * SPF : 162 * SPF]
    assert max_err(out.double(), expect) <= 1e-4 * expect.abs().max().item()


def snr_db(ref: torch.Tensor, x: torch.Tensor) -> float:
    return 10 * torch.log10(ref.pow(2).sum() / (ref - x.double()).pow(2).sum()).item()


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_half_models_keep_the_low_rate_stages_float32(small64, half):
    """A half-precision decoder runs the stages before the conv stack (dequantizer, pre_conv,
    transformer, upsampling) in float32 and keeps its state pool in the half dtype: the same
    state size as all-half, and a stream closer to the float64 forward than all-half's."""
    _, codes, ref = small64
    mixed, all_half = model(SMALL, half), model(SMALL, half, low_rate_dtype=half)
    assert (mixed.dtype, mixed.low_rate_dtype) == (half, torch.float32)
    assert (all_half.dtype, all_half.low_rate_dtype) == (half, half)
    assert {p.dtype for m in mixed.low_rate_modules() for p in m.parameters()} == {torch.float32}
    assert mixed.quantizer.table.dtype == torch.float32
    assert {p.dtype for p in mixed.decoder.parameters()} == {half}
    # Attention runs in the dtype its keys and values are stored in.
    assert {layer.self_attn.attention_dtype for layer in mixed.pre_transformer.layers} == {half}
    assert {layer.self_attn.attention_dtype for layer in all_half.pre_transformer.layers} == {None}
    outs = {}
    for name, m in (("mixed", mixed), ("all-half", all_half)):
        engine = StreamEngine(m, max_streams=1)
        assert {b.dtype for b in engine.pool.buffers.values()} == {half}
        outs[name] = stream_alone(engine, "s", codes, 12, 60, [1, 25])
        assert outs[name].dtype == half
    expect = ref[12 * SPF : 72 * SPF]
    snr = {name: snr_db(expect, out) for name, out in outs.items()}
    assert snr["mixed"] >= snr["all-half"] + 1.0, snr
    assert StreamEngine(mixed, max_streams=1).pool.bytes_per_stream == StreamEngine(all_half, max_streams=1).pool.bytes_per_stream


def test_float16_low_rate_stages_keep_the_bf16_streams_snr(small64):
    """bf16 conv stack, float16 low-rate stages (``low_rate_dtype="auto"``'s choice on CUDA where
    the weights leave room): the stream is within 1 dB of float32 low-rate stages' SNR vs the
    float64 forward (float16 has TF32's 10-bit mantissa), and far above all-bf16's."""
    _, codes, ref = small64
    expect = ref[12 * SPF : 72 * SPF]
    snr = {}
    for name, low in (("float32", None), ("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        m = model(SMALL, torch.bfloat16, low_rate_dtype=low)
        assert m.low_rate_dtype == (low or torch.float32)
        snr[name] = snr_db(expect, stream_alone(StreamEngine(m, max_streams=1), "s", codes, 12, 60, [1, 25]))
    assert snr["float16"] >= snr["float32"] - 1.0 and snr["float16"] >= snr["bfloat16"] + 2.0, snr


def test_tf32_is_scoped_to_the_low_rate_stages():
    """TF32 is switched on only around a half model's float32 low-rate stages on CUDA, and the
    previous settings come back, even after an error: float32 models rely on TF32 being off."""
    from code2wav.model import decoder

    assert isinstance(model(SMALL, torch.bfloat16).low_rate_precision(), contextlib.nullcontext)  # CPU
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        with pytest.raises(RuntimeError, match="inside"):
            with decoder._tf32():
                assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
                raise RuntimeError("inside")
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_many_streams_in_one_batch_equal_each_alone(small64):
    """Cold, growing and rolling rows share steps; every stream's audio equals the same stream
    decoded alone (to float64 rounding: batch shape changes BLAS blocking, nothing else)."""
    m, codes, _ = small64
    specs = [(p, ragged(s, 200, hi=12)) for s, p in enumerate([0, 3, 72, 10, 0, 150, 1, 40])]
    alone = [stream_alone(StreamEngine(m, max_streams=1, max_step_frames=16), f"r{i}", codes, p, 90, sch) for i, (p, sch) in enumerate(specs)]
    engine = StreamEngine(m, max_streams=8, max_step_frames=16)
    plans = [schedule_sizes(sch, 90) for _, sch in specs]
    at = [p for p, _ in specs]
    outs: list[list[torch.Tensor]] = [[] for _ in specs]
    started = set()
    for t in range(200):
        batch = {}
        for i, (p, _) in enumerate(specs):
            if t < 3 * i:  # staggered arrivals: some streams are cold while others roll
                continue
            if i not in started:
                engine.open(f"r{i}", codes[:p])
                started.add(i)
            if plans[i]:
                size = plans[i].pop(0)
                batch[f"r{i}"] = codes[at[i] : at[i] + size]
                at[i] += size
        for rid, audio in engine.decode(batch).items():
            outs[int(rid[1:])].append(audio)
        if not any(plans) and len(started) == len(specs):
            break
    for i in range(len(specs)):
        assert max_err(torch.cat(outs[i]), alone[i]) <= 1e-12, f"stream r{i}"


def test_output_never_contains_prefix_audio(small64):
    """Regression for the reference-audio leak: a push returns its own frames' audio only."""
    m, codes, ref = small64
    engine = StreamEngine(m, max_streams=1)
    engine.open("s", codes[:40])
    first = engine.push("s", codes[40:45])
    assert first.shape == (5 * SPF,)
    assert max_err(first, ref[40 * SPF : 45 * SPF]) <= 1e-9
    assert max_err(first, ref[: 5 * SPF]) > 1e-3  # not the prefix's audio


def _counting(model, name: str) -> list[int]:
    """Count calls of ``model.<name>`` (front or back pass) from now on."""
    calls: list[int] = []
    inner = getattr(model, name)

    def counted(*args, **kwargs):
        calls.append(args[0].shape[0])  # rows in that pass
        return inner(*args, **kwargs)

    setattr(model, name, counted)
    return calls


@pytest.mark.parametrize("bucketed", [False, True], ids=["exact-shapes", "bucketed-shapes"])
def test_prefixes_of_streams_opening_together_are_prefilled_in_one_batch(small64, bucketed):
    """Streams opened with reference prefixes are prefilled at their first step, together: one
    conv-stack pass over every prefix's last frames (not one eager prefill per stream, which
    queued 256 opening streams behind each other). With bucketed shapes (the CUDA setting) the
    batch is padded with scratch rows and full-size pieces; the audio is exact either way."""
    m, codes, ref = small64
    prefixes = [1, 3, 9, 10, 40, 72, 0]
    engine = StreamEngine(m, max_streams=8, max_step_frames=16, bucket_prefill=bucketed)
    for i, p in enumerate(prefixes):
        engine.open(f"s{i}", codes[:p])
    back_rows = _counting(engine.model, "back")
    try:
        out = engine.decode({f"s{i}": codes[p : p + 3] for i, p in enumerate(prefixes)})
    finally:
        del engine.model.back  # the instance attribute; the class method is back
    assert back_rows == [8 if bucketed else 6, 7]  # the prefill pass (6 prefixed rows), then the step
    for i, p in enumerate(prefixes):
        assert max_err(out[f"s{i}"], ref[p * SPF : (p + 3) * SPF]) <= 1e-9, (i, p)
    # a later opener is prefilled alone, in its own first step
    engine.finish("s0")
    engine.open("late", codes[:25])
    assert max_err(engine.push("late", codes[25:27]), ref[25 * SPF : 27 * SPF]) <= 1e-9


def test_bucketed_prefill_uses_only_the_shapes_a_graph_runner_captured(small64):
    """On CUDA the prefill's front and back passes replay graphs captured at start for
    ``prefill_shapes()``: every pass must have one of those shapes (else a request would wait
    for a capture or a cuDNN autotune). The audio is exact."""
    from code2wav.stream.pool import StatePool
    from code2wav.stream.runner import EagerRunner

    m, codes, ref = small64
    seen: list[tuple[str, int, int]] = []

    class Runner(EagerRunner):  # a GraphRunner stand-in: records the shapes of the passes it runs
        def prefill(self, kind, x, slots, n_new):
            seen.append((kind, x.shape[0], x.shape[-1]))
            return super().prefill(kind, x, slots, n_new)

    engine = StreamEngine(m, runner=Runner(m, StatePool(m, 8)), max_step_frames=16, max_batch_frames=40, bucket_prefill=True)
    prefixes = [1, 3, 9, 10, 40, 0, 17]
    for i, p in enumerate(prefixes):
        engine.open(f"s{i}", codes[:p])
    out = engine.decode({f"s{i}": codes[p : p + 2] for i, p in enumerate(prefixes)})
    for i, p in enumerate(prefixes):
        assert max_err(out[f"s{i}"], ref[p * SPF : (p + 2) * SPF]) <= 1e-9, (i, p)
    shapes = set(engine.prefill_shapes())
    assert {kind for kind, _, _ in seen} == {"front", "back"}
    assert set(seen) <= shapes, set(seen) - shapes
    assert max(b for _, b, _ in shapes) * engine.prefill.back_context <= 40  # within the frame budget


def test_prefill_batches_respect_the_frame_budget(small64):
    """The prefill's conv pass holds at most ``max_batch_frames`` frames (rows x back context):
    more opening streams are split into several exact passes."""
    m, codes, ref = small64
    engine = StreamEngine(m, max_streams=5, max_step_frames=16, max_batch_frames=30)  # 2 rows of 10 frames
    for i in range(5):
        engine.open(f"s{i}", codes[: 12 + i])
    back_rows = _counting(engine.model, "back")
    try:
        out = engine.decode({f"s{i}": codes[12 + i : 14 + i] for i in range(5)})
    finally:
        del engine.model.back
    assert back_rows[:3] == [2, 2, 1]
    for i in range(5):
        assert max_err(out[f"s{i}"], ref[(12 + i) * SPF : (14 + i) * SPF]) <= 1e-9


def test_failed_prefill_ends_only_the_prefixed_streams(small64):
    """If the batched prefill fails (e.g. the device runs out of memory), the streams waiting
    for it get a ``prefill_failed`` error and are ended; the other rows of the step decode."""
    from code2wav.stream.rows import StreamError

    m, codes, ref = small64
    engine = StreamEngine(m, max_streams=3)
    engine.open("plain")
    engine.open("p1", codes[:20])
    engine.open("p2", codes[:5])
    inner = engine.prefill

    def failing(streams):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    engine.prefill = failing
    out = engine.decode({"plain": codes[:4], "p1": codes[20:24], "p2": codes[5:9]})
    engine.prefill = inner
    assert max_err(out["plain"], ref[: 4 * SPF]) <= 1e-9
    for rid in ("p1", "p2"):
        assert isinstance(out[rid], StreamError) and out[rid].code == "prefill_failed"
        assert "out of memory" in str(out[rid]) and rid in str(out[rid])
    assert engine.active == 1 and engine.pool.in_use == 1
    with pytest.raises(StreamError, match="already aborted"):
        engine.push("p1", codes[24:25])


def test_stream_with_prefix_ended_before_its_first_step(small64):
    """A prefixed stream that is finished or aborted before any push never runs its prefill
    and frees its slot."""
    m, codes, _ = small64
    engine = StreamEngine(m, max_streams=2)
    engine.open("a", codes[:30])
    engine.open("b", codes[:30])
    back_rows = _counting(engine.model, "back")
    try:
        assert engine.finish("a").numel() == 0
        engine.abort("b")
    finally:
        del engine.model.back
    assert back_rows == [] and engine.pool.in_use == 0 and engine.active == 0


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dilation", [1, 3, 9])
@pytest.mark.parametrize("fold", ["all", "dilated", "multi-row", "none"])
def test_folded_conv_equals_the_dilated_conv(monkeypatch, layout, dilation, fold):
    """A full conv may run as an undilated (7, 1) conv over a [B, C, T/d, d] view of its input:
    equal (float64) to the causal dilated conv1d, for lengths no multiple of the dilation, whole
    and stepped with a history from the pool; so is each other choice of which convs fold."""
    from code2wav.kernels.snake import to_layout
    from code2wav.model.choices import LayerChoices
    from code2wav.model.layers import CausalConv1d
    from code2wav.model.streaming import Step

    g = torch.Generator().manual_seed(7)
    conv = CausalConv1d(8, 12, 7, dilation=dilation).double()
    conv.choices = LayerChoices(conv_fold=fold)
    x = torch.randn(2, 8, 5 + 6 * dilation + 4, dtype=torch.float64, generator=g)  # 2 steps' worth
    want = torch.nn.functional.conv1d(torch.nn.functional.pad(x, (6 * dilation, 0)), conv.conv.weight, conv.conv.bias, dilation=dilation)
    with torch.no_grad():
        assert (conv(to_layout(x, layout == "channels_last")) - want).abs().max() < 1e-12
        pool = {conv.state_key: torch.zeros(3, 8, 6 * dilation, dtype=torch.float64)}
        cut = 5
        outs = []
        for a, b in ((0, cut), (cut, x.shape[-1])):
            step = Step(pool, torch.tensor([2, 0]), torch.tensor([b - a] * 2), torch.tensor([a] * 2))
            outs.append(conv(to_layout(x[..., a:b], layout == "channels_last"), step))
    assert (torch.cat(outs, -1) - want).abs().max() < 1e-12


@pytest.mark.parametrize("kernel,dilation", [(7, 1), (7, 3), (7, 9), (3, 1), (1, 1)])
def test_small_conv_as_gemm_equals_the_conv(monkeypatch, kernel, dilation):
    """A full conv whose output has at most ``LayerChoices.conv_gemm_rows`` samples (channels-last
    weight and input) runs as one GEMM over its im2col rows: equal (float64) to the conv, whole
    and stepped with its history from the pool, for several batch rows, with and without its
    bias, the output channels-last. Above the limit it stays a conv."""
    from code2wav.kernels.snake import is_channels_last, to_layout
    from code2wav.model.choices import LayerChoices
    from code2wav.model.layers import CausalConv1d, channels_last_
    from code2wav.model.streaming import Step

    g = torch.Generator().manual_seed(9)
    conv = CausalConv1d(6, 5, kernel, dilation=dilation).double()
    with torch.no_grad():
        for p in conv.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    channels_last_(conv.conv)
    x = to_layout(torch.randn(3, 6, 9, dtype=torch.float64, generator=g), True)
    calls = []
    real = CausalConv1d._as_gemm
    monkeypatch.setattr(CausalConv1d, "_as_gemm", lambda self, *a: calls.append(1) or real(self, *a))

    def run(rows: int):
        conv.choices = LayerChoices(conv_fold="none", conv_gemm_rows=rows)
        with torch.no_grad():
            whole = conv(x, None)
            no_bias = conv(x, None, add_bias=False)
            pool = {conv.state_key: torch.zeros(4, 6, max(conv.history, 1), dtype=torch.float64)} if conv.history else {}
            outs = []
            for a, b in ((0, 4), (4, 5), (5, 9)):
                step = Step(pool, torch.tensor([3, 0, 1]), torch.tensor([b - a] * 3), torch.tensor([a] * 3))
                outs.append(conv(x[..., a:b], step))
        return whole, no_bias, torch.cat(outs, -1)

    ref = run(0)
    assert calls == []
    got = run(3 * 9)  # the whole input's 27 output samples fit
    assert len(calls) == 5
    for r, y in zip(ref, got):
        assert y.shape == r.shape == (3, 5, 9) and (y - r).abs().max() < 1e-12
    assert is_channels_last(got[0]) and is_channels_last(got[1])  # (the stepped one is a cat)
    want = torch.nn.functional.conv1d(torch.nn.functional.pad(x, ((kernel - 1) * dilation, 0)), conv.conv.weight, conv.conv.bias, dilation=dilation)
    assert (got[0] - want).abs().max() < 1e-12 and (got[2] - want).abs().max() < 1e-12
    calls.clear()
    run(3 * 9 - 1)  # one sample too many for the whole input: those two calls stay convs
    assert len(calls) == 3


def _ragged_pair_is_exact(m, codes, ref) -> None:
    """A cold stream and one with a 30-frame prefix, stepped together with ragged chunks: each
    equals the float64 forward ``ref``."""
    got = ragged_pair(StreamEngine(m, max_streams=3), codes)
    assert max_err(got["a"], ref[: len(got["a"])]) <= 1e-9
    assert max_err(got["b"], ref[30 * SPF : 30 * SPF + len(got["b"])]) <= 1e-9


def test_streams_with_small_convs_as_gemms_match_the_forward(small64, monkeypatch):
    """The whole decoder channels-last with every full conv of a small step run as a GEMM:
    streams with and without a prefix, batched with ragged chunks, still equal the float64
    forward."""
    from code2wav.model.choices import LayerChoices
    from code2wav.model.layers import CausalConv1d

    m, codes, ref = small64
    cl = copy.deepcopy(m).channels_last().set_layer_choices(LayerChoices(conv_gemm_rows=1 << 30))
    calls = []
    real = CausalConv1d._as_gemm
    monkeypatch.setattr(CausalConv1d, "_as_gemm", lambda self, *a: calls.append(1) or real(self, *a))
    _ragged_pair_is_exact(cl, codes, ref)
    assert calls


@pytest.mark.parametrize("stride,kernel", [(2, 2), (3, 6), (8, 16)])
def test_convtranspose_as_gemm_equals_the_transposed_conv(monkeypatch, stride, kernel):
    """A causal ConvTranspose (k = s or 2s) over channels-last input may run as GEMMs on its rows
    (``LayerChoices.convt_gemm``): equal (float64) to the transposed conv, whole and
    stepped with its history from the pool, for several batch rows (the GEMM runs over all of
    them at once), with the output channels-last."""
    from code2wav.kernels.snake import is_channels_last, to_layout
    from code2wav.model.choices import LayerChoices
    from code2wav.model.layers import CausalConvTranspose1d, SnakeBeta, channels_last_
    from code2wav.model.streaming import Step

    g = torch.Generator().manual_seed(8)
    convt = CausalConvTranspose1d(6, 5, kernel, stride).double()
    act = SnakeBeta(6).double()
    with torch.no_grad():
        for p in (*convt.parameters(), *act.parameters()):
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)
    convt.fuse()
    channels_last_(convt.conv)
    x = to_layout(torch.randn(3, 6, 9, dtype=torch.float64, generator=g), True)

    calls = []
    real = CausalConvTranspose1d._as_gemm
    monkeypatch.setattr(CausalConvTranspose1d, "_as_gemm", lambda self, xx: calls.append(1) or real(self, xx))

    def run(on: bool):
        convt.choices = LayerChoices(convt_gemm=on)
        with torch.no_grad():
            whole = convt(x, None, act)
            pool = {convt.state_key: torch.zeros(4, 6, convt.history, dtype=torch.float64)}
            outs = []
            for a, b in ((0, 4), (4, 5), (5, 9)):
                step = Step(pool, torch.tensor([3, 0, 1]), torch.tensor([b - a] * 3), torch.tensor([a] * 3))
                outs.append(convt(x[..., a:b], step, act))
        return whole, torch.cat(outs, -1)

    (ref_whole, ref_steps), (whole, steps) = run(False), run(True)
    assert len(calls) == 4  # every call of the second run took the GEMM form
    assert whole.shape == ref_whole.shape == (3, 5, 9 * stride) and is_channels_last(whole)
    assert (whole - ref_whole).abs().max() < 1e-12 and (steps - ref_whole).abs().max() < 1e-12
    assert (ref_steps - ref_whole).abs().max() < 1e-12


def test_streams_with_convtranspose_as_gemm_match_the_forward(small64, monkeypatch):
    """The whole decoder channels-last with every ConvTranspose as GEMMs (none falls back):
    streams with and without a prefix, batched with ragged chunks, still equal the float64
    forward."""
    from code2wav.model.choices import LayerChoices

    m, codes, ref = small64
    cl = copy.deepcopy(m).channels_last().set_layer_choices(LayerChoices(convt_gemm=True))
    def no_transposed_conv(*args, **kwargs):
        raise AssertionError("a ConvTranspose fell back to the transposed conv")

    monkeypatch.setattr(torch.nn.functional, "conv_transpose2d", no_transposed_conv)
    _ragged_pair_is_exact(cl, codes, ref)


def test_back_context_is_exactly_enough(small64):
    """The conv stack only sees the last ``back_context_frames()`` prefix frames (10 for these
    rates); that rebuilds its state exactly, and one frame fewer does not."""
    m, codes, ref = small64
    k = m.back_context_frames()
    assert k == 10
    expect = ref[100 * SPF : 110 * SPF]
    for ctx, exact in ((k, True), (k - 1, False)):
        engine = StreamEngine(m, max_streams=1)
        engine.prefill.back_context = ctx  # the prefill's horizon, one frame short in the second run
        engine.open("s", codes[:100])
        err = max_err(engine.push("s", codes[100:110]), expect)
        assert (err <= 1e-9) == exact, (ctx, err)


@pytest.mark.parametrize("mode", ["windowed", "full"])
def test_baseline_modes(small64, mode):
    """``full`` re-decodes everything: exact. ``windowed`` keeps 72 frames of left context: exact
    while the whole history fits in the window, and measurably off once it does not."""
    m, codes, ref = small64
    out = stream_alone(BaselineEngine(m, mode, max_streams=1), "s", codes, 0, 120, [25])
    err_inside = max_err(out[: 72 * SPF], ref[: 72 * SPF])
    err_after = max_err(out[100 * SPF :], ref[100 * SPF : 120 * SPF])
    assert err_inside <= 1e-9
    if mode == "full":
        assert err_after <= 1e-9
    else:
        assert err_after > 1e-6


def test_state_bytes_per_stream():
    """The released architecture keeps ~1.30 M values per stream; KV is about 90 % of it."""
    from code2wav.model.decoder import Decoder

    shapes = Decoder(FULL).state_shapes()
    values = sum(torch.Size(s).numel() for s in shapes.values())
    kv = sum(torch.Size(s).numel() for k, s in shapes.items() if k.endswith((".k", ".v")))
    assert kv == FULL.num_hidden_layers * 2 * 71 * FULL.num_key_value_heads * FULL.head_dim
    assert 1.25e6 < values < 1.35e6
    assert 0.85 < kv / values < 0.95
    engine = StreamEngine(model(SMALL, torch.float64), max_streams=3)
    per = engine.state_bytes()["per_stream"]
    small_values = sum(torch.Size(s).numel() for s in engine.model.state_shapes().values())
    assert per == small_values * 8 + 8  # float64 state + the int64 position
    assert engine.state_bytes()["pool"] == (3 + 1) * per  # three slots and the scratch row


@pytest.mark.parametrize("step_frames", [64, 2])
@pytest.mark.parametrize("pcm16", [False, True])
@pytest.mark.parametrize(("dtype", "low"), [(torch.float16, torch.float16), (torch.bfloat16, torch.float16)])
def test_float16_overflow_ends_only_that_stream(dtype, low, pcm16, step_frames):
    """float16 can overflow (max 65504) where bfloat16 cannot, in a float16 conv stack or in
    float16 low-rate stages (``low_rate_dtype="auto"``'s choice on CUDA). A row whose audio comes
    out non-finite gets ``non_finite_audio`` and is ended (its state holds inf/NaN now); the
    other rows of the same step, a shorter one included (a ragged step), decode normally and
    stay open. It is checked on the step's device, so ``pcm16`` streams are
    caught too. (The overflow comes from the codebook sum, per row.) With ``step_frames`` 2 the
    rows run in pieces, the overflow in a middle one: the row is refused as a whole."""
    from code2wav.stream.rows import StreamError

    m = copy.deepcopy(model(SMALL, dtype, low_rate_dtype=low))
    m.quantizer.table = m.quantizer.table.clone()
    size = SMALL.codebook_size
    m.quantizer.table[7] = 6e4  # code 7 of quantizers 0 and 1: their sum overflows float16
    m.quantizer.table[size + 7] = 6e4
    good = random_codes(6, seed=3)
    good[good == 7] = 8
    bad = good.clone()
    bad[2, :2] = 7
    engine = StreamEngine(m, max_streams=3, max_step_frames=step_frames)
    for rid in ("good", "short", "bad"):
        engine.open(rid, pcm16=pcm16)
    out = engine.decode({"good": good, "short": good[:5], "bad": bad})  # one step of 6 / 5 / 6 frames (or pieces of 2)
    assert isinstance(out["bad"], StreamError) and out["bad"].code == "non_finite_audio"
    assert "'bad'" in str(out["bad"])
    for rid, frames in (("good", 6), ("short", 5)):
        assert out[rid].dtype == (torch.int16 if pcm16 else dtype) and out[rid].shape == (frames * SPF,)
        assert torch.isfinite(out[rid].float()).all()
    assert engine.active == 2 and engine.pool.in_use == 2
    with pytest.raises(StreamError, match="already aborted"):
        engine.push("bad", good[:1])
    assert torch.isfinite(engine.push("good", good[:2]).float()).all()


def test_the_overflow_check_sums_in_float32():
    """A float16 row of 64 full-scale frames sums past float16's range (122,880): the check's
    sums are float32, so loud audio is not mistaken for an overflow; a NaN still is."""
    from code2wav.stream.rows import Row
    from code2wav.stream.schedule import Group

    engine = StreamEngine(model(SMALL, torch.float16, low_rate_dtype=torch.float16), max_streams=2)
    engine.open("loud")
    engine.open("nan")
    rows = [Row(engine._get(rid), random_codes(64)) for rid in ("loud", "nan")]
    wav = torch.ones(2, 64 * SPF, dtype=torch.float16)
    wav[1, 5] = float("nan")
    outs, sums = engine._outputs(wav, Group(rows, [64, 64]), torch.tensor([64, 64]))
    assert sums.dtype == torch.float32 and sums[0] == 64 * SPF and sums[1].isnan()


def test_no_overflow_check_without_float16():
    """bfloat16 and float32 do not overflow on this decoder's values: no check runs there."""
    assert not StreamEngine(model(SMALL, torch.bfloat16)).overflows
    assert not StreamEngine(model(SMALL, torch.float32)).overflows
    assert StreamEngine(model(SMALL, torch.bfloat16, low_rate_dtype=torch.float16)).overflows


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_pcm16_streams_get_their_float_audio_quantized_by_the_one_rule(dtype):
    """A stream opened with ``pcm16`` gets int16 samples, quantized where its step ran: exactly
    ``to_int16`` of the float samples the same stream gets without it, in steps that hold float
    rows too and in steps of pcm16 rows alone, with and without a prefix, a chunk longer than a
    step's piece included (its pieces joined)."""
    from code2wav.audio import to_int16

    m = model(SMALL, dtype)
    codes = random_codes(120, SMALL, seed=11)
    engine = StreamEngine(m, max_streams=4, max_step_frames=8)
    for rid, pfx, pcm16 in (("f", 10, False), ("q", 10, True), ("f0", 0, False), ("q0", 0, True)):
        engine.open(rid, codes[:pfx] if pfx else None, pcm16=pcm16)
    outs: dict[str, list[torch.Tensor]] = {rid: [] for rid in ("f", "q", "f0", "q0")}
    at = {"f": 10, "q": 10, "f0": 0, "q0": 0}
    for sizes in ({"f": 1, "q": 1, "f0": 3, "q0": 3}, {"f": 20, "q": 20, "f0": 5, "q0": 5}, {"q": 7, "q0": 2}, {"f": 7, "f0": 2}):
        batch = {rid: codes[at[rid] : at[rid] + n] for rid, n in sizes.items()}
        for rid, n in sizes.items():
            at[rid] += n
        for rid, audio in engine.decode(batch).items():
            assert not isinstance(audio, Exception), audio
            assert audio.dtype == (torch.int16 if rid.startswith("q") else m.dtype), rid
            outs[rid].append(audio)
    for f, q, frames in (("f", "q", 28), ("f0", "q0", 10)):
        fl, pcm = torch.cat(outs[f]), torch.cat(outs[q])
        assert pcm.shape == fl.shape == (frames * SPF,)
        assert (pcm != 0).any()
        assert torch.equal(pcm, torch.from_numpy(to_int16(fl))), q


@pytest.mark.parametrize("field, value", [("conv_fold", "sideways"), ("unit_conv_rows", -1), ("attention_frames", -1)])
def test_layer_choices_refuse_values_no_form_has(field, value):
    from code2wav.model.choices import LayerChoices

    with pytest.raises(ValueError, match=field):
        LayerChoices(**{field: value})


def test_layer_choices_belong_to_the_model(small64):
    """Two models in one process may run different layer forms: a choice set on one reaches
    every layer of it and none of the other's, and both still equal the float64 forward."""
    from code2wav.model.choices import LayerChoices
    from code2wav.model.layers import CausalConv1d, CausalConvTranspose1d

    m, codes, ref = small64
    mine = copy.deepcopy(m).set_layer_choices(LayerChoices(conv_fold="none", convt_gemm=False, conv_gemm_rows=0))
    other = copy.deepcopy(m)
    layers = lambda d: [x for x in d.modules() if isinstance(x, (CausalConv1d, CausalConvTranspose1d))]  # noqa: E731
    assert all(x.choices == mine.layer_choices for x in layers(mine))
    assert all(x.choices == LayerChoices() for x in layers(other))
    for d in (mine, other):
        out = stream_alone(StreamEngine(d, max_streams=1), "s", codes, 0, 40, [1, 25])
        assert max_err(out, ref[: 40 * SPF]) <= 1e-9
