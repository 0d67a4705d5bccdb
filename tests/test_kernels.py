"""The CUDA kernels' logic, on CPU through Triton's interpreter (float32).

Each fused kernel must equal the eager formula it replaces, for both activation layouts the conv
stack uses (contiguous ``[B, C, L]`` and channels-last ``[B, L, C]`` in memory), with and without
the optional fused SnakeBeta and bias, and the whole streaming step run through them must equal
the eager step. The transformer's kernels (norms, RoPE + KV history, SiLU gate) likewise, and its
fused path (fused projections + kernels) must equal the module code, pool state included.
Real-GPU numerics (bf16, cuDNN) are checked by ``bench/gpu_check.py`` on the H200 (the interpreter
rounds float32 -> bfloat16 toward zero, a GPU to nearest: bf16 errors here would mislead).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from code2wav.kernels import history, mono_conv, snake, unit  # noqa: E402
from code2wav.kernels import transformer as tk  # noqa: E402
from code2wav.kernels.history import window  # noqa: E402
from code2wav.model.streaming import Step  # noqa: E402
from code2wav.model.transformer import Rotary  # noqa: E402
from code2wav.stream.engine import StreamEngine  # noqa: E402
from tests.models import SMALL, model, one_thread, random_codes  # noqa: E402

LAYOUTS = ("contiguous", "channels_last")


@pytest.fixture(autouse=True)
def triton_on_cpu(monkeypatch):
    """Route CPU float32 tensors through the Triton kernels (the gate normally wants CUDA)."""
    monkeypatch.setattr(snake, "fused", lambda x: x.dtype != torch.float64)
    # The interpreter runs programs one by one in Python: fewer, larger blocks (same results).
    monkeypatch.setattr(snake, "BLOCK", 1 << 16)
    monkeypatch.setattr(snake, "MAX_TILE_EDGE", (1 << 14, 1 << 10))
    monkeypatch.setattr(mono_conv, "BLOCK_T", 4096)
    monkeypatch.setattr(unit, "ACC_ELEMENTS", 1 << 24)
    with one_thread():
        yield


def laid_out(x: torch.Tensor, layout: str) -> torch.Tensor:
    return snake.to_layout(x, layout == "channels_last")


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> bool:
    return a.shape == b.shape and (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item())


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_snake_and_residual_kernels_match_eager(layout, with_bias):
    g = torch.Generator().manual_seed(0)
    x = laid_out(torch.randn(3, 5, 37, generator=g) * 3, layout)
    h = laid_out(torch.randn(3, 5, 37, generator=g), layout)
    alpha, beta, bias = (torch.randn(5, generator=g) * 0.3 for _ in range(3))
    b = bias if with_bias else None
    y = snake.snake_beta(x, alpha, beta, b)
    assert close(y, snake.snake_beta_eager(x, alpha, beta, b))
    assert y.stride() == x.stride()  # the layout is kept
    r = snake.residual_add(x, h, bias)
    assert close(r, x + (h + bias[:, None])) and r.stride() == x.stride()
    other = laid_out(h, "contiguous" if layout == "channels_last" else "channels_last")
    assert close(snake.residual_add(x, other, bias), x + (h + bias[:, None]))  # mixed layouts
    trimmed = x[..., 3:30]  # a strided view, as a trimmed ConvTranspose output is
    y = snake.bias_add(trimmed, bias)
    assert close(y, trimmed + bias[:, None]) and snake.is_channels_last(y) == (layout == "channels_last")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kernels_are_exact_across_tile_boundaries(monkeypatch, layout):
    """With tiles far smaller than the tensors (as on the GPU), every program's slice of time and
    channels, and the history / new-sample seam inside a tile, still give the eager result."""
    monkeypatch.setattr(snake, "BLOCK", 32)
    monkeypatch.setattr(snake, "MAX_TILE_EDGE", (8, 4))
    g = torch.Generator().manual_seed(2)
    B, C, L, H, rate = 3, 11, 29, 7, 3
    x = laid_out(torch.randn(B, C, L, generator=g) * 3, layout)
    h = laid_out(torch.randn(B, C, L, generator=g), layout)
    alpha, beta, bias = (torch.randn(C, generator=g) * 0.3 for _ in range(3))
    assert close(snake.snake_beta(x, alpha, beta, bias), snake.snake_beta_eager(x, alpha, beta, bias))
    assert close(snake.residual_add(x, h, bias), x + (h + bias[:, None]))
    assert close(snake.bias_add(x[..., 2:27], bias), x[..., 2:27] + bias[:, None])
    pool = torch.randn(5, C, H, generator=g)
    slots, n_new = torch.tensor([4, 0, 2]), torch.tensor([9, 0, 5])
    xx = history.history_cat(x, H, pool, slots, (alpha, beta), bias)
    assert close(xx, torch.cat([pool[slots], snake.snake_beta_eager(x, alpha, beta, bias)], dim=-1))
    expect = pool.clone()
    expect[slots] = window(xx, n_new * rate, H, dim=-1)
    history.history_write(pool, slots, xx, n_new, rate, H)
    assert close(pool, expect)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("act", ["none", "snake", "snake+bias"])
@pytest.mark.parametrize("pooled", [True, False], ids=["step", "whole-forward"])
@pytest.mark.parametrize("multiple", [1, 4])
def test_history_cat_and_write_match_eager(layout, act, pooled, multiple):
    """``cat([pool[slots], act(x + bias)])`` in one pass (zero-padded to a multiple of 4: 13 ->
    16 samples, as a folded conv needs), then the per-row window of the valid part written back
    to each row's slot; slots out of order, one row with no new samples."""
    g = torch.Generator().manual_seed(1)
    B, C, L, H, rate = 3, 6, 8, 5, 2
    x = laid_out(torch.randn(B, C, L, generator=g), layout)
    pool = torch.randn(7, C, H, generator=g)
    slots = torch.tensor([5, 0, 3])
    alpha, beta, bias = (torch.randn(C, generator=g) * 0.3 for _ in range(3))
    params = (alpha, beta) if act != "none" else None
    b = bias if act == "snake+bias" else None
    hist = pool[slots] if pooled else torch.zeros(B, C, H)
    pad = torch.zeros(B, C, 3 if multiple == 4 else 0)
    expect = torch.cat([hist, snake.snake_beta_eager(x, alpha, beta, b) if params else x, pad], dim=-1)
    xx = history.history_cat(x, H, pool if pooled else None, slots if pooled else None, params, b, multiple)
    assert close(xx, expect)
    assert snake.is_channels_last(xx) == (layout == "channels_last")
    if pooled:
        n_new = torch.tensor([4, 0, 2])  # frames; x holds L = 4 frames at 2 samples each
        want = pool.clone()
        want[slots] = window(expect, n_new * rate, H, dim=-1)
        history.history_write(pool, slots, xx, n_new, rate, H)
        assert close(pool, want)


def test_channels_last_tiles_divide_the_channels_where_they_can(monkeypatch):
    """A channels-last tile spans a power of two of channels that divides C where one of 16 or
    more does, so no channel tile is partly masked (96 channels: three of 32); other counts
    round up to a power of two. Both are capped."""
    monkeypatch.setattr(snake, "MAX_TILE_EDGE", (256, 64))
    assert [snake.tile_shape(c, 1000, True)[1] for c in (96, 192, 384, 1536, 48, 5, 11, 8)] == [32, 64, 64, 64, 16, 8, 16, 8]
    assert snake.tile_shape(96, 1000, True) == (snake.BLOCK // 32, 32)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dilation", [1, 3])
def test_mono_conv_matches_conv1d(layout, dilation):
    g = torch.Generator().manual_seed(2)
    x = laid_out(torch.randn(2, 96, 150, generator=g), layout)
    w = laid_out(torch.randn(1, 96, 7, generator=g) * 0.1, layout)  # weights may be channels-last too
    bias = torch.randn(1, generator=g)
    assert close(mono_conv.mono_conv(x, w, bias, dilation), F.conv1d(x, w, bias, dilation=dilation), 1e-5)


@pytest.mark.parametrize("C", [16, 96])
@pytest.mark.parametrize("tiles", ["one", "many"])
def test_unit_tail_matches_the_unit_ops(monkeypatch, C, tiles):
    """The residual unit's fused tail equals conv1's bias, SnakeBeta, the 1x1 conv and the
    residual add done one by one; with tiles smaller than the tensors (as on the GPU: a row count
    no tile divides) too, and 96 channels padded to a power of two."""
    if tiles == "many":
        monkeypatch.setattr(unit, "ACC_ELEMENTS", 16 * unit.triton.next_power_of_2(C))
    g = torch.Generator().manual_seed(4)
    B, L = 3, 37
    x, h = (laid_out(torch.randn(B, C, L, generator=g), "channels_last") for _ in range(2))
    w2 = torch.randn(C, C, 1, generator=g) / C**0.5
    b1, alpha, beta, b2 = (torch.randn(C, generator=g) * 0.3 for _ in range(4))
    assert unit.applies(x, h)
    y = unit.unit_tail(h, x, w2, b1, alpha, beta, b2)
    ref = x + F.conv1d(snake.snake_beta_eager(h, alpha, beta, b1), w2, b2)
    assert close(y, ref, 1e-5) and snake.is_channels_last(y)
    # h as a folded conv leaves it: the first L of each row's longer run of time steps.
    longer = laid_out(torch.randn(B, C, L + 5, generator=g), "channels_last")
    trimmed = longer[..., :L]
    assert unit.applies(x, trimmed) and trimmed.stride(0) > L * C
    ref = x + F.conv1d(snake.snake_beta_eager(trimmed, alpha, beta, b1), w2, b2)
    assert close(unit.unit_tail(trimmed, x, w2, b1, alpha, beta, b2), ref, 1e-5)


def test_unit_tail_applies_only_where_it_is_exact_and_fast():
    g = torch.Generator().manual_seed(5)
    cl = laid_out(torch.randn(2, 32, 9, generator=g), "channels_last")
    assert unit.applies(cl, cl.clone())
    assert not unit.applies(cl.contiguous(), cl.contiguous())  # contiguous [B, C, L]: cuDNN's 1x1 conv
    odd = laid_out(torch.randn(2, 8, 9, generator=g), "channels_last")
    assert not unit.applies(odd, odd)  # 8 channels: below the GEMM's 16-wide slice
    assert not unit.applies(cl.double(), cl.double())  # float64 stays eager
    wide = laid_out(torch.randn(2, 384, 9, generator=g), "channels_last")
    assert not unit.applies(wide, wide)  # 384 channels: more than one output tile


@pytest.mark.parametrize("layout", LAYOUTS)
def test_streaming_steps_through_the_kernels_equal_eager(monkeypatch, layout):
    """A prefixed stream and a cold one, stepped together with ragged chunks, through every fused
    kernel (and, channels-last, channels-last convs): the prefill and the steps give the same
    audio as the eager path."""
    codes = random_codes(24, SMALL, seed=3)
    schedule = [(0, 1), (1, 4)]

    def run(m) -> list[torch.Tensor]:
        engine = StreamEngine(m, max_streams=2, max_step_frames=8)
        engine.open("prefixed", codes[:13])  # longer than the conv stack's 10-frame horizon
        engine.open("cold")
        outs = []
        for a, b in schedule:
            step = engine.step({"prefixed": codes[13 + a : 13 + b], "cold": codes[2 * a : 2 * a + 2]})
            outs += [step["prefixed"], step["cold"]]
        return outs

    m = model(SMALL, torch.float32)
    fused = run(m if layout == "contiguous" else _channels_last_copy(m))
    monkeypatch.setattr(snake, "fused", lambda x: False)
    eager = run(m)
    for a, b in zip(fused, eager):
        assert close(a, b, 1e-5)


def _channels_last_copy(m):
    import copy

    return copy.deepcopy(m).channels_last()


# -- the transformer's kernels -------------------------------------------------------------------


def test_norm_kernels_match_eager():
    """RMSNorm, and residual + layer scale + RMSNorm in one pass; a width that is not a power of
    two (masked lanes) and values far from unit scale."""
    g = torch.Generator().manual_seed(4)
    x, h = torch.randn(3, 5, 48, generator=g) * 3, torch.randn(3, 5, 48, generator=g)
    scale, w = torch.randn(48, generator=g) * 0.3, 1 + torch.randn(48, generator=g) * 0.1
    eps = 1e-5
    assert close(tk.rms_norm(x, w, eps), tk.rms_norm_eager(x, w, eps))
    xo, n = tk.add_rms_norm(x, h, scale, w, eps)
    want = x + scale * h
    assert close(xo, want)
    assert close(n, tk.rms_norm_eager(want, w, eps))


def test_silu_mul_matches_eager():
    g = torch.Generator().manual_seed(5)
    gu = torch.randn(3, 5, 2 * 40, generator=g) * 4
    gate, up = gu.chunk(2, dim=-1)
    assert close(tk.silu_mul(gu), F.silu(gate) * up)


@pytest.mark.parametrize("pooled", [True, False], ids=["step", "whole-forward"])
def test_rope_kv_cat_and_write_match_eager(pooled):
    """RoPE on q and k from the fused qkv output, keys/values prepended with each row's pool
    history (slots out of order), then each row's last W valid rows written back (ragged n_new,
    one row with none). 4 query heads over 2 kv heads: heads without kv must write q only."""
    g = torch.Generator().manual_seed(6)
    B, T, H, Hkv, D, W = 3, 4, 4, 2, 16, 5
    qkv = torch.randn(B, T, (H + 2 * Hkv) * D, generator=g)
    start = torch.tensor([0, 7, 300])
    cos, sin = Rotary(D, 10000.0)(start[:, None] + torch.arange(T))
    pool_k, pool_v = torch.randn(7, Hkv, W, D, generator=g), torch.randn(7, Hkv, W, D, generator=g)
    slots, n_new = torch.tensor([5, 0, 3]), torch.tensor([4, 0, 2])
    # Today's Attention.forward, op by op.
    q = qkv[..., : H * D].view(B, T, H, D).transpose(1, 2)
    k = qkv[..., H * D : (H + Hkv) * D].view(B, T, Hkv, D).transpose(1, 2)
    v = qkv[..., (H + Hkv) * D :].view(B, T, Hkv, D).transpose(1, 2)
    q, k = tk.rotate_eager(q, cos, sin), tk.rotate_eager(k, cos, sin)
    if pooled:
        k, v = torch.cat([pool_k[slots], k], dim=2), torch.cat([pool_v[slots], v], dim=2)
    qq, kk, vv = tk.rope_kv_cat(qkv, H, Hkv, cos, sin, *((pool_k, pool_v, slots) if pooled else ()))
    assert close(qq, q) and close(kk, k) and close(vv, v)
    assert kk.is_contiguous() and vv.is_contiguous() and qq.stride(-1) == 1
    # Written in the dtype attention runs in (a float32 transformer under a bf16 conv stack).
    half = tk.rope_kv_cat(qkv, H, Hkv, cos, sin, *((pool_k, pool_v, slots) if pooled else ()), out_dtype=torch.bfloat16)
    assert [t.dtype for t in half] == [torch.bfloat16] * 3
    assert all(close(a.float(), b, 1e-2) for a, b in zip(half, (q, k, v)))
    if pooled:
        want_k, want_v = pool_k.clone(), pool_v.clone()
        want_k[slots] = window(k, n_new, W, dim=2)
        want_v[slots] = window(v, n_new, W, dim=2)
        tk.kv_write(pool_k, pool_v, slots, kk, vv, n_new)
        assert close(pool_k, want_k) and close(pool_v, want_v)  # slots 1, 2, 4, 6 untouched too


def _kv_pool(tr, rows: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Random history for every layer: a masked entry that leaks in would show."""
    return {
        key: torch.randn(rows, *shape, generator=g)
        for layer in tr.layers
        for key, shape in layer.self_attn.state_shapes().items()
    }


def _transformer_step(tr, x, pool, pooled: bool):
    """One step of ``tr`` over rows: a cold stream, one younger than the window, a rolling one;
    ragged n_new (one row with no new frame). Returns the output and the pool afterwards."""
    pool = {k: v.clone() for k, v in pool.items()}
    step = Step(pool, torch.tensor([5, 0, 3]), torch.tensor([4, 0, 2]), torch.tensor([0, 30, 300])) if pooled else None
    return tr(x, step), pool


@pytest.mark.parametrize("pooled", [True, False], ids=["step", "whole-forward"])
def test_transformer_fused_path_equals_eager(monkeypatch, pooled):
    """The fused path (fused projections + every transformer kernel) against the module code:
    same output, same pool state afterwards."""
    tr = model(SMALL, torch.float32).pre_transformer
    assert tr.is_fused  # tests/models.py fuses like load_decoder
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 4, SMALL.latent_dim, generator=g)
    pool = _kv_pool(tr, 7, g)
    fused, fused_pool = _transformer_step(tr, x, pool, pooled)
    monkeypatch.setattr(snake, "fused", lambda x: False)
    eager, eager_pool = _transformer_step(tr, x, pool, pooled)
    assert close(fused, eager)
    for key in pool:
        assert close(fused_pool[key], eager_pool[key]), key
    if pooled:
        assert not close(eager_pool[key], pool[key])  # the step did write history


def test_fuse_projections_keeps_checkpoint_names_and_the_forward():
    """Fusing adds no state-dict entries (the checkpoint layout loads unchanged into either), the
    fused path reads the fused weights (spoil them and its output moves, the module path's does
    not), and a model loaded then fused computes what the unfused one does."""
    import copy

    from code2wav.model.transformer import Transformer

    ref = model(SMALL, torch.float32).pre_transformer
    plain = Transformer(SMALL)
    plain.load_state_dict(ref.state_dict(), strict=True)
    assert not plain.is_fused and plain.state_dict().keys() == ref.state_dict().keys()
    g = torch.Generator().manual_seed(8)
    x = torch.randn(3, 4, SMALL.latent_dim, generator=g)
    pool = _kv_pool(ref, 7, g)
    for layer, ref_layer in zip(plain.layers, ref.layers):  # Transformer alone has no state keys
        layer.self_attn.state_key = ref_layer.self_attn.state_key
    unfused, unfused_pool = _transformer_step(plain, x, pool, True)  # module path (not fused)
    plain.fuse_projections()
    assert plain.is_fused and plain.state_dict().keys() == ref.state_dict().keys()
    attn = plain.layers[0].self_attn
    assert torch.equal(attn.qkv_weight, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    fused, fused_pool = _transformer_step(plain, x, pool, True)
    assert close(fused, unfused)
    for key in pool:
        assert close(fused_pool[key], unfused_pool[key]), key
    assert plain.double().layers[0].mlp.gate_up_weight.dtype == torch.float64  # follows .to()
    spoiled = copy.deepcopy(ref)
    spoiled.layers[3].mlp.gate_up_weight.mul_(1.5)
    assert not close(_transformer_step(spoiled, x, pool, True)[0], fused)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(snake, "fused", lambda x: False)
        assert close(_transformer_step(spoiled, x, pool, True)[0], unfused)


def test_unit_tail_tiles_fill_the_gpu_in_small_steps(monkeypatch):
    """A residual unit's fused tail takes 128 rows per program (64 at 192+ channels, where the
    accumulator would grow past 16k elements), and fewer, down to 16, where that would leave SMs
    of the GPU idle: a 1-frame step's 640 rows of 192 channels on 132 SMs run as 40 programs of
    16, not 10 of 64. ``FILL_SMS = False`` keeps the fixed tiles."""
    monkeypatch.setattr(unit, "ACC_ELEMENTS", 128 * 128)
    assert unit.rows_per_program(16 * 25 * 640, 256, 132) == 64
    assert unit.rows_per_program(16 * 25 * 1920, 128, 132) == 128
    assert unit.rows_per_program(640, 256, 132) == 16
    assert unit.rows_per_program(1920, 128, 132) == 16
    assert unit.rows_per_program(5 * 1920, 128, 132) == 128  # 73 rows per SM: the next power of two
    assert unit.rows_per_program(10, 128, 132) == 16
    monkeypatch.setattr(unit, "FILL_SMS", False)
    assert unit.rows_per_program(640, 256, 132) == 64 and unit.rows_per_program(1920, 128, 132) == 128
