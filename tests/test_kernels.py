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

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from code2wav.kernels import convt, history, mono_conv, skinny, snake, unit, unit_conv  # noqa: E402
from code2wav.kernels import transformer as tk  # noqa: E402
from code2wav.kernels.history import window  # noqa: E402
from code2wav.model.layers import ResidualUnit  # noqa: E402
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
    monkeypatch.setattr(mono_conv, "BLOCK_R", 4096)
    monkeypatch.setattr(unit, "ACC_ELEMENTS", 1 << 24)
    monkeypatch.setattr(skinny, "MIN_WEIGHT", 0)  # the shrunk model's few-row float32 products too
    monkeypatch.setattr(skinny, "PROGRAMS", 2)  # few, wide programs: each finds a norm's RMS itself
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
    B, C, L, rate = 3, 11, 30, 3
    x = laid_out(torch.randn(B, C, L, generator=g) * 3, layout)
    h = laid_out(torch.randn(B, C, L, generator=g), layout)
    alpha, beta, bias = (torch.randn(C, generator=g) * 0.3 for _ in range(3))
    assert close(snake.snake_beta(x, alpha, beta, bias), snake.snake_beta_eager(x, alpha, beta, bias))
    assert close(snake.residual_add(x, h, bias), x + (h + bias[:, None]))
    assert close(snake.bias_add(x[..., 2:27], bias), x[..., 2:27] + bias[:, None])
    # Three channel tiles of 4, each split among 4 history programs of one channel, which walk
    # the 20-sample history in three chunks (8 + 8 + 4).
    monkeypatch.setattr(history, "HISTORY_TILE", 8)
    H = 20
    assert snake.tile_shape(C, H + L, layout == "channels_last")[1] == 4
    assert history._history_programs(H, 4) == (4, 1, 8)
    pool = torch.randn(6, C, H, generator=g)  # slot 5: the scratch slot
    # Windows starting at sample 30 (all new: the full length), 0 (all old), 15 (chunk 0 reads
    # what chunk 1 and 2 overwrite, and new samples from j = 5), 3 (old and new mixed across
    # and inside chunks); two padding rows on the scratch slot.
    slots, n_new = torch.tensor([4, 0, 2, 1, 5, 5]), torch.tensor([10, 0, 5, 1, 0, 0])
    x = laid_out(torch.randn(len(slots), C, L, generator=g) * 3, layout)
    for params, b in (((alpha, beta), bias), (None, None)):
        for multiple in (1, 4):
            want_xx, want_pool = _eager_history_step(x, H, pool, slots, params, b, multiple, n_new, rate)
            fused_pool = pool.clone()
            xx = history.history_cat(x, H, fused_pool, slots, params, b, multiple, n_new=n_new, rate=rate)
            assert close(xx, want_xx) and close(fused_pool, want_pool)
            assert not close(fused_pool[[4, 2, 1]], pool[[4, 2, 1]])  # the rows did write
            assert torch.equal(fused_pool[5], pool[5])  # scratch rows write back what they read
    # A bf16 activation over a float32 pool: the pool gets exactly the (rounded) values the
    # output holds, as the eager write copies them.
    xb, read_pool, fused_pool = x.bfloat16(), pool.clone(), pool.clone()
    xx = history.history_cat(xb, H, read_pool, slots, (alpha, beta), bias)
    history.history_write(read_pool, slots, xx, n_new, rate, H)
    assert torch.equal(history.history_cat(xb, H, fused_pool, slots, (alpha, beta), bias, n_new=n_new, rate=rate), xx)
    assert torch.equal(fused_pool, read_pool)


def _eager_history_step(x, H, pool, slots, params, bias, multiple, n_new, rate):
    """The eager reference of a streaming conv's history: ``cat([pool[slots], act(x + bias)])``
    zero-padded to a ``multiple``, then each row's window written back to a copy of the pool."""
    B, C, L = x.shape
    act = snake.snake_beta_eager(x, *params, bias) if params is not None else x
    pad = torch.zeros(B, C, -(-(H + L) // multiple) * multiple - H - L)
    xx = torch.cat([pool.index_select(0, slots), act, pad], dim=-1)
    after = pool.clone()
    after.index_copy_(0, slots, window(xx, n_new * rate, H, dim=-1))
    return xx, after


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("act", ["none", "snake", "snake+bias"])
@pytest.mark.parametrize("pooled", [True, False], ids=["step", "whole-forward"])
@pytest.mark.parametrize("multiple", [1, 4])
def test_history_cat_and_write_match_eager(monkeypatch, layout, act, pooled, multiple):
    """``cat([pool[slots], act(x + bias)])`` in one pass (zero-padded to a multiple of 4: 13 ->
    16 samples, as a folded conv needs) and, given ``n_new``, the per-row window of the valid part
    written back to each row's slot in the same pass: slots out of order, ragged ``n_new`` (the
    full length, none, part), two padding rows on the scratch slot. The pool afterwards, every
    slot, equals the eager index_copy's; without ``n_new`` the pool is only read."""
    g = torch.Generator().manual_seed(1)
    B, C, L, H, rate = 5, 6, 8, 5, 2
    x = laid_out(torch.randn(B, C, L, generator=g), layout)
    pool = torch.randn(7, C, H, generator=g)  # slot 6: the scratch slot
    slots = torch.tensor([5, 0, 3, 6, 6])
    n_new = torch.tensor([4, 0, 2, 0, 0])  # frames; x holds L = 4 frames at 2 samples each
    alpha, beta, bias = (torch.randn(C, generator=g) * 0.3 for _ in range(3))
    params = (alpha, beta) if act != "none" else None
    b = bias if act == "snake+bias" else None
    if not pooled:
        pad = torch.zeros(B, C, 3 if multiple == 4 else 0)
        expect = torch.cat([torch.zeros(B, C, H), snake.snake_beta_eager(x, alpha, beta, b) if params else x, pad], dim=-1)
        xx = history.history_cat(x, H, None, None, params, b, multiple)
        assert close(xx, expect) and snake.is_channels_last(xx) == (layout == "channels_last")
        return
    want_xx, want_pool = _eager_history_step(x, H, pool, slots, params, b, multiple, n_new, rate)
    before = pool.clone()
    xx = history.history_cat(x, H, pool, slots, params, b, multiple)
    assert close(xx, want_xx) and torch.equal(pool, before)  # read only
    assert snake.is_channels_last(xx) == (layout == "channels_last")
    history.history_write(pool, slots, xx, n_new, rate, H)  # the eager write
    assert close(pool, want_pool)
    for tile in (512, 16):  # the channels' history in one program, and in four of two channels
        monkeypatch.setattr(history, "HISTORY_TILE", tile)
        assert history._history_programs(H, 8)[0] == (1 if tile == 512 else 4)
        fused_pool = before.clone()
        xx = history.history_cat(x, H, fused_pool, slots, params, b, multiple, n_new=n_new, rate=rate)
        assert close(xx, want_xx) and close(fused_pool, want_pool)
        assert snake.is_channels_last(xx) == (layout == "channels_last")


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


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dilation", [1, 3])
@pytest.mark.parametrize("pooled", [False, True])
def test_mono_conv_reading_its_history_matches_the_history_concat(layout, dilation, pooled):
    """The output conv reading ``[history, act(x)]`` itself equals the history concat then
    conv1d: programs of 32 or 64 input rows (each after the first starting 6 d rows before the
    last one's end), slots out of order, ragged new frames (all, none, part), two padding rows on the
    scratch slot; every slot of the pool afterwards equals the history concat's writes."""
    g = torch.Generator().manual_seed(4)
    B, C, L, rate = 5, 96, 150, 10
    H, block_r = 6 * dilation, 32 if dilation == 1 else 64
    x = laid_out(torch.randn(B, C, L, generator=g), layout)
    w = laid_out(torch.randn(1, C, 7, generator=g) * 0.1, layout)
    bias = torch.randn(1, generator=g)
    act = (torch.randn(C, generator=g) * 0.3, torch.randn(C, generator=g) * 0.3)
    if not pooled:
        want = F.conv1d(history.history_cat(x, H, act=act), w, bias, dilation=dilation)
        assert close(mono_conv.mono_conv_history(x, w, bias, dilation, act, block_r=block_r), want, 1e-5)
        return
    pool = torch.randn(7, C, H, generator=g)  # slot 6: the scratch slot
    slots, n_new = torch.tensor([5, 0, 3, 6, 6]), torch.tensor([15, 0, 7, 0, 0])
    want_pool, got_pool = pool.clone(), pool.clone()
    want = F.conv1d(history.history_cat(x, H, want_pool, slots, act, n_new=n_new, rate=rate), w, bias, dilation=dilation)
    got = mono_conv.mono_conv_history(x, w, bias, dilation, act, got_pool, slots, n_new, rate, block_r=block_r)
    assert close(got, want, 1e-5)
    assert torch.equal(got_pool, want_pool)
    assert not torch.equal(got_pool, pool)  # rows with new frames moved on
    with pytest.raises(ValueError, match="twice the history"):  # the next program would read the pool too
        mono_conv.mono_conv_history(x, w, bias, dilation, act, block_r=2 * H - 1)


@pytest.mark.parametrize(("C", "tiles"), [(C, t) for C in (16, 96) for t in ("one", "many", "early residual")]
                         + [(96, "channel tiles")])  # 16 channels are one tile: tl.dot takes no fewer
def test_unit_tail_matches_the_unit_ops(monkeypatch, C, tiles):
    """The residual unit's fused tail equals conv1's bias, SnakeBeta, the 1x1 conv and the
    residual add done one by one; with tiles smaller than the tensors (as on the GPU: a row count
    no tile divides) too, 96 channels padded to a power of two, the output channels split over
    programs (as for the wide blocks: 96 in tiles of 64, the last one partly masked), and the
    residual loaded before the GEMM."""
    if tiles == "many":
        monkeypatch.setattr(unit, "ACC_ELEMENTS", 16 * unit.triton.next_power_of_2(C))
    if tiles == "channel tiles":
        monkeypatch.setitem(unit.TILES, C, unit.Tiles(32, 64, 16, 4, 2))
    if tiles == "early residual":
        monkeypatch.setitem(unit.TILES, C, unit.Tiles(32, min(C, 64), 16, 4, 2, early_x=True))
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


def test_the_wide_units_tail_after_snakebeta_matches_the_unit_ops(monkeypatch):
    """At 384 channels (above the fused tail's widths) the tail takes SnakeBeta's output: the 1x1
    conv, its bias and the residual add in one GEMM equal cuDNN's conv and the add, with the
    output channels over three programs and a row count no tile divides; it runs in a model
    step only with ``LayerChoices.wide_tail``."""
    monkeypatch.setitem(unit.TILES, 384, unit.Tiles(32, 128, 64, 4, 2))
    g = torch.Generator().manual_seed(6)
    B, C, L = 2, 384, 37
    x, s = (laid_out(torch.randn(B, C, L, generator=g), "channels_last") for _ in range(2))
    w2 = torch.randn(C, C, 1, generator=g) / C**0.5
    b2 = torch.randn(C, generator=g) * 0.3
    assert unit.applies_activated(x, s) and not unit.applies(x, s)
    assert close(unit.unit_tail(s, x, w2, None, None, None, b2), x + F.conv1d(s, w2, b2), 1e-5)
    with pytest.raises(ValueError, match="none of them"):
        unit.unit_tail(s, x, w2, b2, None, None, b2)
    narrow = laid_out(torch.randn(B, 96, L, generator=g), "channels_last")
    assert not unit.applies_activated(narrow, narrow)  # the fused tail's widths keep SnakeBeta inside
    assert not unit.applies_activated(x.contiguous(), s.contiguous())


def test_unit_tail_applies_only_where_it_is_exact_and_fast():
    g = torch.Generator().manual_seed(5)
    cl = laid_out(torch.randn(2, 32, 9, generator=g), "channels_last")
    assert unit.applies(cl, cl.clone())
    assert not unit.applies(cl.contiguous(), cl.contiguous())  # contiguous [B, C, L]: cuDNN's 1x1 conv
    odd = laid_out(torch.randn(2, 8, 9, generator=g), "channels_last")
    assert not unit.applies(odd, odd)  # 8 channels: below the GEMM's 16-wide slice
    assert not unit.applies(cl.double(), cl.double())  # float64 stays eager
    wide = laid_out(torch.randn(2, 384, 9, generator=g), "channels_last")
    assert not unit.applies(wide, wide)  # 384 channels: the separate ops replay as fast


def test_unit_tail_tiles_split_wide_units_and_check_the_k_slice():
    """Up to ``MAX_N`` output channels a program takes them all (SnakeBeta once per element);
    wider units split them in tiles of 128. A K slice that does not divide the channels is
    refused, not read past the row."""
    assert unit.generic_tiles(96).block_n == 128 and unit.generic_tiles(256).block_n == 256
    assert unit.generic_tiles(384).block_n == 128 and unit.generic_tiles(768).block_n == 128
    assert unit.generic_tiles(48).block_k == 16 and unit.generic_tiles(768).block_k == 32
    g = torch.Generator().manual_seed(6)
    x = laid_out(torch.randn(1, 48, 5, generator=g), "channels_last")
    with pytest.raises(ValueError, match="K slice 32 must divide 48"):
        unit.unit_tail(x, x, torch.randn(48, 48, 1), *(torch.zeros(48) for _ in range(4)), tiles=unit.Tiles(16, 64, 32, 4, 2))


def _unit_case(C: int, d: int, B: int, L: int, g: torch.Generator, extra: int = 0):
    """A residual unit's parts at ``C`` channels and dilation ``d``: its input ``x``, the history
    concat ``xx`` (a random history, ``extra`` zero samples of padding after), the weights; and
    the unit's output done op by op."""
    H = 6 * d
    x = laid_out(torch.randn(B, C, L, generator=g), "channels_last")
    a1, be1, b1, a2, be2, b2 = (torch.randn(C, generator=g) * 0.3 for _ in range(6))
    w1 = torch.randn(C, C, 7, generator=g) / (7 * C) ** 0.5
    w2 = torch.randn(C, C, 1, generator=g) / C**0.5
    parts = [torch.randn(B, C, H, generator=g), snake.snake_beta_eager(x, a1, be1), torch.zeros(B, C, extra)]
    xx = laid_out(torch.cat(parts, -1), "channels_last")
    ref = x + F.conv1d(snake.snake_beta_eager(F.conv1d(xx[..., : H + L], w1, dilation=d), a2, be2, b1), w2, b2)
    return (xx, x, w1, d, b1, a2, be2, w2, b2), ref


@pytest.mark.parametrize(("C", "d", "loads"), [(96, 3, "pointers"), (48, 9, "pointers"), (32, 1, "pointers"), (96, 3, "tma"),
                                                (48, 9, "tma"), (32, 1, "tma"), (96, 3, "tma-w"), (48, 9, "tma-both-ws")])
@pytest.mark.parametrize("form", ["samples", "channels"])
def test_unit_conv_matches_the_unit_ops(monkeypatch, form, C, d, loads):
    """A residual unit as one kernel after its history concat (the dilated conv, conv1's bias,
    SnakeBeta, the 1x1 conv and the residual) equals the ops one by one: widths split in two
    power-of-two parts (96 = 64 + 32, 48 = 32 + 16) or padded to one (the channels form) and a
    power of two (32); row tiles that straddle batch rows (pointer loads; with ``tma`` a
    program stays in one batch row, its last tile reading past the row's end, masked) and a
    sample count no tile divides; a history concat longer than the conv reads (a folded
    conv's padding). With ``tma_w`` the channels-last weights come through descriptors (the
    channels form's padded rows past ``C`` read as zero); ``ws`` warp-specializes the K loop."""
    g = torch.Generator().manual_seed(7)
    ws = loads == "tma-both-ws"
    tiles = unit_conv.ConvTiles(16, 16, 8 if ws else 4, 2, form, tma=loads in ("tma", "tma-both-ws"), tma_w=loads.startswith("tma-"), ws=ws)
    args, ref = _unit_case(C, d, 3, 37, g, extra=d)
    if tiles.tma_w:
        args = (args[0], args[1], snake.to_layout(args[2], True), *args[3:])
    y = unit_conv.unit_conv(*args, tiles=tiles)
    assert close(y, ref, 1e-5) and snake.is_channels_last(y)
    monkeypatch.setitem(unit_conv.TILES, C, tiles)  # the default tiles of a width
    assert close(unit_conv.unit_conv(*args), ref, 1e-5)
    # Default tiles whose descriptors the tensors do not fit fall back to pointer loads: a
    # trimmed concat (rows not one block apart), contiguous weights.
    trimmed = (args[0][..., : args[0].shape[-1] - 1], args[1], args[2].contiguous(), *args[3:])
    assert close(unit_conv.unit_conv(*trimmed), ref, 1e-5)


@pytest.mark.parametrize(("C", "d"), [(96, 3), (48, 9)])
@pytest.mark.parametrize("form", ["samples", "channels"])
def test_unit_conv_takes_a_whole_tap_a_k_step(form, C, d):
    """A K slice that is not a power of two (a whole tap, ``block_k = C``: 96 = 64 + 32,
    48 = 32 + 16) runs as two power-of-two products a K step, with the same result; tensor
    descriptors take power-of-two slices only."""
    g = torch.Generator().manual_seed(11)
    args, ref = _unit_case(C, d, 3, 37, g, extra=d)
    y = unit_conv.unit_conv(*args, tiles=unit_conv.ConvTiles(16, C, 4, 2, form))
    assert close(y, ref, 1e-5) and snake.is_channels_last(y)
    assert not unit_conv.computes(C, unit_conv.ConvTiles(16, C, 4, 2, form, tma=True))
    assert not unit_conv.computes(112, unit_conv.ConvTiles(16, 112, 4, 2, "channels"))  # 112 = 64 + 48: no


def test_unit_conv_refuses_what_it_cannot_compute():
    """A history concat shorter than the conv reads, a K slice that does not divide the
    channels, a width the samples form cannot split (80 = 64 + 16 can, 112 = 64 + 48 not; the
    channels form pads it), an unknown form, descriptors over tensors not laid out for them and a
    warp-specialized loop on fewer than 8 warps are refused, not read past (or compiled)."""
    g = torch.Generator().manual_seed(8)
    args, _ = _unit_case(48, 3, 1, 5, g)
    xx, rest = args[0], args[1:]
    with pytest.raises(ValueError, match="xx has 22 samples, the conv needs 23"):
        unit_conv.unit_conv(xx[..., :-1], *rest, tiles=unit_conv.ConvTiles(16, 16, 4, 2))
    with pytest.raises(ValueError, match="cannot compute 48 channels"):
        unit_conv.unit_conv(xx, *rest, tiles=unit_conv.ConvTiles(16, 32, 4, 2))  # a K slice of 32
    with pytest.raises(ValueError, match="form must be"):
        unit_conv.unit_conv(xx, *rest, tiles=unit_conv.ConvTiles(16, 16, 4, 2, "rows"))
    with pytest.raises(ValueError, match="dense"):  # a trimmed view: its rows are not one block apart
        unit_conv.unit_conv(xx[..., :-1], *rest[:2], 2, *rest[3:], tiles=unit_conv.ConvTiles(16, 16, 4, 2, tma=True))
    with pytest.raises(ValueError, match="channels-last weights"):  # [C, C, k] contiguous: k is the fast axis
        unit_conv.unit_conv(xx, *rest, tiles=unit_conv.ConvTiles(16, 16, 4, 2, tma_w=True))
    with pytest.raises(ValueError, match="8 warps"):  # what Triton 3.6's Hopper pass could not compile
        unit_conv.unit_conv(xx, *rest, tiles=unit_conv.ConvTiles(16, 16, 4, 2, ws=True))


def test_unit_conv_applies_where_it_has_tiles_and_enough_samples(monkeypatch):
    """The one-kernel unit runs for half dtypes on CUDA and float32 under the test interpreter,
    channels-last, at widths with tiles (the decoder's 96 and 192), in steps of at least
    ``unit_conv_rows`` samples; 0 turns it off."""
    g = torch.Generator().manual_seed(9)
    x = laid_out(torch.randn(2, 96, 9, generator=g), "channels_last")
    assert unit_conv.applies(x, 1) and unit_conv.applies(x, 18) and not unit_conv.applies(x, 19)
    assert not unit_conv.applies(x, 0)  # off
    assert not unit_conv.applies(x.contiguous(), 1)  # contiguous [B, C, L]
    assert not unit_conv.applies(x.double(), 1)  # float64 stays eager
    wide = laid_out(torch.randn(2, 384, 9, generator=g), "channels_last")
    assert not unit_conv.applies(wide, 1)  # no tiles: cuDNN's conv and the fused tail
    assert sorted(unit_conv.TILES) == [96, 192]
    samples, channels = unit_conv.ConvTiles(16, 16, 4, 2), unit_conv.ConvTiles(16, 16, 4, 2, "channels")
    assert unit_conv.computes(80, samples) and not unit_conv.computes(112, samples) and unit_conv.computes(112, channels)
    monkeypatch.setitem(unit_conv.TILES, 112, samples)
    assert not unit_conv.applies(laid_out(torch.randn(1, 112, 9, generator=g), "channels_last"), 1)
    assert [unit_conv.split(C) for C in (96, 192, 384, 32)] == [(64, 32), (128, 64), (256, 128), (32, 0)]


def _pairs_case(C: int, c_out: int, s: int, B: int, T: int, g: torch.Generator):
    """A ConvTranspose layer (k = 2s, its bias rows derived), channels-last ``[history, new]``
    input rows and the layer's two-product output, row 0 of each batch row included."""
    from code2wav.model.layers import CausalConvTranspose1d

    layer = CausalConvTranspose1d(C, c_out, 2 * s, s)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    layer.requires_grad_(False).fuse()
    rows = torch.randn(B * T, C, generator=g)
    w = layer.conv.weight.detach().permute(0, 2, 1).reshape(C, -1)  # [c_in, 2 * s * c_out]: W_now, then W_prev
    N = s * c_out
    ref = torch.full((B * T, N), float("nan"))
    ref[1:] = rows[:-1] @ w[:, N:] + rows[1:] @ w[:, :N] + layer.bias_rows
    return layer, rows, w, ref


@pytest.mark.parametrize(("C", "c_out", "s"), [(32, 16, 3), (48, 24, 4), (64, 32, 8), (16, 8, 5)])
def test_convt_pairs_match_the_two_products(C, c_out, s):
    """A ConvTranspose's two products (the previous row against the last ``s`` taps, this row
    against the first ``s``, plus the bias) as one kernel: output widths the column tile does
    not divide (48, 40), row tiles that straddle batch rows, one K slice (16 channels) and
    several; row 0, the history's block, is the caller's to drop."""
    g = torch.Generator().manual_seed(11)
    layer, rows, w, ref = _pairs_case(C, c_out, s, 3, 13, g)
    y = convt.convt_pairs(rows, w, layer.bias_rows, tiles=convt.PairTiles(16, 32, 16, 4, 2))
    assert close(y[1:], ref[1:], 1e-5)


@pytest.mark.parametrize("B", [1, 4])
def test_convt_layer_through_the_pairs_kernel_equals_its_gemms(monkeypatch, B):
    """The layer's forward with ``convt_kernel_rows`` on equals its two-product form, one-sample
    steps included (a history row and one new row per batch row)."""
    monkeypatch.setitem(convt.TILES, 32, convt.PairTiles(16, 16, 16, 4, 2))
    g = torch.Generator().manual_seed(12)
    layer, _, _, _ = _pairs_case(32, 16, 4, 1, 2, g)
    for T in (1, 9):
        xx = laid_out(torch.randn(B, 32, T + 1, generator=g), "channels_last")
        layer.choices = replace(layer.choices, convt_kernel_rows=0)
        ref = layer._as_gemm(xx)
        layer.choices = replace(layer.choices, convt_kernel_rows=1)
        assert convt.applies(xx.transpose(1, 2).reshape(-1, 32), 1)
        assert close(layer._as_gemm(xx), ref, 1e-5)


def test_convt_pairs_refuse_and_apply(monkeypatch):
    """A weight that is not ``[C, 2N]`` and a K slice that does not divide the width are refused;
    the kernel runs for half dtypes on CUDA and float32 under the test interpreter, in steps of at
    least ``convt_kernel_rows`` rows (0: never), never for float64, and only at widths with tiles
    in ``convt.TILES`` (where the sweep found it faster than the two products)."""
    g = torch.Generator().manual_seed(13)
    _, rows, w, ref = _pairs_case(48, 8, 2, 1, 5, g)
    bias = torch.zeros(16)
    with pytest.raises(ValueError, match=r"w must be \[48, 32\]"):
        convt.convt_pairs(rows, w[:, :-1], bias)
    with pytest.raises(ValueError, match="K slice of 32 does not divide 48"):
        convt.convt_pairs(rows, w, bias, tiles=convt.PairTiles(16, 16, 32, 4, 2))
    assert sorted(convt.TILES) == [192]  # of the released blocks' widths, the last one's alone
    rows = torch.randn(5, 128, generator=g)
    assert not convt.applies(rows, 1)  # no tiles for 128 channels: the two products
    monkeypatch.setitem(convt.TILES, 128, convt.PairTiles(16, 16, 64, 4, 2))
    assert convt.applies(rows, 1) and convt.applies(rows, 5) and not convt.applies(rows, 6)
    assert not convt.applies(rows, 0) and not convt.applies(rows.double(), 1)
    monkeypatch.setitem(convt.TILES, 96, convt.PairTiles(16, 16, 64, 4, 2))
    assert not convt.applies(torch.randn(5, 96, generator=g), 1)  # a K slice of 64 does not divide 96 channels


@pytest.mark.parametrize("layout", [*LAYOUTS, "channels_last, one-kernel units and ConvTransposes", "channels_last, wide tails"])
def test_streaming_steps_through_the_kernels_equal_eager(monkeypatch, layout):
    """A prefixed stream and a cold one, stepped together with ragged chunks, through every fused
    kernel (the few-row float32 products included; and, channels-last, channels-last convs; and
    the residual units as one kernel, at the shrunk model's 32- and 16-channel blocks in both
    forms, with the ConvTransposes as one GEMM each; or every unit's tail as the wide blocks' GEMM
    after SnakeBeta, ``wide_tail``): the prefill and the steps give the same audio as the eager
    path."""
    one_kernel = layout.endswith("one-kernel units and ConvTransposes")
    wide = layout.endswith("wide tails")
    units, pairs, tails = [], [], []
    if wide:  # the shrunk model's blocks as wide as the 384- and 768-channel ones
        monkeypatch.setattr(unit, "MAX_C", 8)
        real_tail = unit.unit_tail
        monkeypatch.setattr(unit, "unit_tail", lambda h, x, *a, **k: (tails.append((x.shape[1], a[2] is None)), real_tail(h, x, *a, **k))[1])
    if one_kernel:
        # Large row tiles: the interpreter runs programs one by one (tile edges: the unit tests above).
        monkeypatch.setitem(unit_conv.TILES, 32, unit_conv.ConvTiles(256, 16, 4, 2, "samples"))
        monkeypatch.setitem(unit_conv.TILES, 16, unit_conv.ConvTiles(256, 16, 4, 2, "channels"))
        real_unit_conv = unit_conv.unit_conv
        monkeypatch.setattr(unit_conv, "unit_conv", lambda xx, x, *a, **k: (units.append(x.shape[1]), real_unit_conv(xx, x, *a, **k))[1])
        for c in (64, 32, 16, 8):  # the shrunk model's blocks
            monkeypatch.setitem(convt.TILES, c, convt.PairTiles(256, 64, 8, 4, 2))
        real_pairs = convt.convt_pairs
        monkeypatch.setattr(convt, "convt_pairs", lambda rows, *a, **k: (pairs.append(rows.shape[1]), real_pairs(rows, *a, **k))[1])
    codes = random_codes(24, SMALL, seed=3)
    schedule = [(0, 1), (1, 4)]

    def run(m) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
        engine = StreamEngine(m, max_streams=2, max_step_frames=8)
        engine.open("prefixed", codes[:13])  # longer than the conv stack's 10-frame horizon
        engine.open("cold")
        outs = []
        for a, b in schedule:
            step = engine.decode({"prefixed": codes[13 + a : 13 + b], "cold": codes[2 * a : 2 * a + 2]})
            outs += [step["prefixed"], step["cold"]]
        return outs, engine.pool.buffers

    m = model(SMALL, torch.float32)
    products = []  # few-row float32 products that went through the skinny kernel: (ran, gated)
    real_matmul = skinny.matmul_t
    monkeypatch.setattr(skinny, "matmul_t", lambda x, w, *a, **k: (products.append((skinny.applies(x, w), k.get("gated", False))),
                                                                    real_matmul(x, w, *a, **k))[1])
    fused_model = m if layout == "contiguous" else _channels_last_copy(m)
    if one_kernel:
        fused_model.set_layer_choices(replace(fused_model.layer_choices, convt_kernel_rows=1))
    if wide:
        fused_model.set_layer_choices(replace(fused_model.layer_choices, wide_tail=True))
    fused, fused_pool = run(fused_model)
    widths = sorted({u.conv1.conv.in_channels for u in m.modules() if isinstance(u, ResidualUnit)})
    # every unit the GEMM's K slice divides (the 4- and 8-channel ones keep the separate ops), SnakeBeta done before
    assert sorted(set(tails)) == ([(c, True) for c in widths if c % unit.MIN_K == 0] if wide else [])
    assert any(ran for ran, _ in products)  # the 1-frame step's transformer and upsampler products
    assert any(gated for _, gated in products)  # its MLPs' silu * up inside the down projection
    assert sorted(set(units)) == ([16, 32] if one_kernel else [])
    assert sorted(set(pairs)) == ([8, 16, 32, 64] if one_kernel else [])
    monkeypatch.setattr(snake, "fused", lambda x: False)
    eager, eager_pool = run(m)
    for a, b in zip(fused, eager):
        assert close(a, b, 1e-5)
    for key in eager_pool:  # every layer's history, written inside the read kernels on the fused path
        assert close(fused_pool[key], eager_pool[key], 1e-5), key


def test_a_step_runs_one_history_kernel_per_stateful_layer(monkeypatch):
    """A streaming step reads and writes each layer's history in one launch: one history concat
    per conv layer with history but the output conv, which reads its own (``read_history``), one
    attention kernel per attention layer (a one-frame step:
    RoPE, the KV history, the mask and SDPA in one), and no separate write kernel (counted at the
    interpreter's launch; padding rows on the scratch slot included)."""
    from collections import Counter

    from triton.runtime.interpreter import InterpretedFunction

    from code2wav.model.streaming import StreamingLayer
    from code2wav.model.transformer import Attention
    from code2wav.stream.pool import StatePool

    m = model(SMALL, torch.float32)
    pool = StatePool(m, max_streams=2)
    codes = torch.stack([random_codes(1, SMALL, seed=s).T for s in range(3)])  # [3, Q, 1]
    launches: Counter[str] = Counter()
    launch = InterpretedFunction.run

    def counted(self, *args, **kwargs):
        launches[self.__name__] += 1
        return launch(self, *args, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", counted)
    pool.run(m, codes, torch.tensor([1, 0, pool.scratch_slot]), torch.tensor([1, 1, 0]))
    stateful = [mod for mod in m.modules() if isinstance(mod, StreamingLayer) and mod.history]
    attention = [mod for mod in stateful if isinstance(mod, Attention)]
    assert launches["_attend_kernel"] == len(attention) > 0
    assert launches["_rope_kv_cat_kernel"] == 0
    assert launches["_mono_conv_history_kernel"] == 1
    assert launches["_history_cat_kernel"] == len(stateful) - len(attention) - 1 > 0
    assert not [name for name in launches if "write" in name]
    launches.clear()
    m.set_layer_choices(replace(m.layer_choices, read_history=False))
    pool.run(m, codes, torch.tensor([1, 0, pool.scratch_slot]), torch.tensor([1, 1, 0]))
    assert launches["_history_cat_kernel"] == len(stateful) - len(attention) and "_mono_conv_history_kernel" not in launches


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
@pytest.mark.parametrize("tiles", ["one", "many"])
def test_rope_kv_cat_and_write_match_eager(monkeypatch, pooled, tiles):
    """RoPE on q and k from the fused qkv output, keys/values prepended with each row's pool
    history (slots out of order), and, given ``n_new``, each row's last W valid rows written back
    in the same pass (ragged n_new: all, none, part; two padding rows on the scratch slot).
    4 query heads over 2 kv heads: heads without kv must write q only. With many tiles the
    history program walks the W = 5 history rows in chunks of 2, and row 2's window (rows 2..6)
    reads rows the later chunks overwrite, and history and new rows inside one chunk."""
    if tiles == "many":
        monkeypatch.setattr(snake, "BLOCK", 32)  # two 16-wide rows per program
    g = torch.Generator().manual_seed(6)
    B, T, H, Hkv, D, W = 5, 4, 4, 2, 16, 5
    assert tk._rows(W + T, D) == (2 if tiles == "many" else 16)
    qkv = torch.randn(B, T, (H + 2 * Hkv) * D, generator=g)
    start = torch.tensor([0, 7, 300, 0, 0])
    cos, sin = Rotary(D, 10000.0)(start[:, None] + torch.arange(T))
    pool_k, pool_v = torch.randn(7, Hkv, W, D, generator=g), torch.randn(7, Hkv, W, D, generator=g)  # 6: scratch
    slots, n_new = torch.tensor([5, 0, 3, 6, 6]), torch.tensor([4, 0, 2, 0, 0])
    # Today's Attention.forward, op by op.
    q = qkv[..., : H * D].view(B, T, H, D).transpose(1, 2)
    k = qkv[..., H * D : (H + Hkv) * D].view(B, T, Hkv, D).transpose(1, 2)
    v = qkv[..., (H + Hkv) * D :].view(B, T, Hkv, D).transpose(1, 2)
    q, k = tk.rotate_eager(q, cos, sin), tk.rotate_eager(k, cos, sin)
    if pooled:
        k, v = torch.cat([pool_k[slots], k], dim=2), torch.cat([pool_v[slots], v], dim=2)
    before = pool_k.clone(), pool_v.clone()
    qq, kk, vv = tk.rope_kv_cat(qkv, H, Hkv, cos, sin, *((pool_k, pool_v, slots) if pooled else ()))
    assert close(qq, q) and close(kk, k) and close(vv, v)
    assert kk.is_contiguous() and vv.is_contiguous() and qq.stride(-1) == 1
    assert torch.equal(pool_k, before[0]) and torch.equal(pool_v, before[1])  # read only
    # Written in the dtype attention runs in (a float32 transformer under a bf16 conv stack).
    half = tk.rope_kv_cat(qkv, H, Hkv, cos, sin, *((pool_k, pool_v, slots) if pooled else ()), out_dtype=torch.bfloat16)
    assert [t.dtype for t in half] == [torch.bfloat16] * 3
    assert all(close(a.float(), b, 1e-2) for a, b in zip(half, (q, k, v)))
    if not pooled:
        return
    want_k, want_v = pool_k.clone(), pool_v.clone()
    want_k.index_copy_(0, slots, window(k, n_new, W, dim=2))
    want_v.index_copy_(0, slots, window(v, n_new, W, dim=2))
    tk.kv_write(pool_k, pool_v, slots, kk, vv, n_new)  # the eager write
    assert close(pool_k, want_k) and close(pool_v, want_v)  # slots 1, 2, 4 untouched too
    fk, fv = before[0].clone(), before[1].clone()
    qq, kk, vv = tk.rope_kv_cat(qkv, H, Hkv, cos, sin, fk, fv, slots, n_new=n_new)
    assert close(qq, q) and close(kk, k) and close(vv, v)
    assert close(fk, want_k) and close(fv, want_v)
    assert torch.equal(fk[6], before[0][6]) and torch.equal(fv[6], before[1][6])  # scratch: rewritten as read
    # bf16 keys: the pool gets the rounded values the keys hold, as the eager write copies them.
    fk, fv = before[0].clone(), before[1].clone()
    half = tk.rope_kv_cat(qkv, H, Hkv, cos, sin, fk, fv, slots, torch.bfloat16, n_new)
    ek, ev = before[0].clone(), before[1].clone()
    tk.kv_write(ek, ev, slots, half[1], half[2], n_new)
    assert torch.equal(fk, ek) and torch.equal(fv, ev)
    # Pools that are not dense are read from copies and written eagerly after the kernel.
    sk, sv = (p.transpose(2, 3).contiguous().transpose(2, 3) for p in before)
    tk.rope_kv_cat(qkv, H, Hkv, cos, sin, sk, sv, slots, n_new=n_new)
    assert close(sk, want_k) and close(sv, want_v)


@pytest.mark.parametrize("T", [1, 4, 7])
def test_attention_kernel_matches_rope_kv_cat_sdpa_and_write(T):
    """One kernel for a step's attention layer against the path it replaces: rope_kv_cat (with
    the history write), the position mask (Attention.mask), SDPA and the [B, T, H * D] copy.
    Rows: cold (start 0), younger than the window, rolling, a ragged one (n_new < T) and two
    padding rows on the scratch slot; 4 query heads over 2 kv heads; a 6-frame window (W = 5
    history rows) so the mask bites inside the step, and at T = 7 more new frames than history
    rows. The write-back overwrites rows it reads (the history shifts by n_new). Same output,
    same pool afterwards; in a half dtype, the same rounding points."""
    from code2wav.kernels import attention
    from code2wav.model.transformer import Attention, _additive_mask

    g = torch.Generator().manual_seed(16)
    B, H, Hkv, D, W = 6, 4, 2, 16, 5
    qkv = torch.randn(B, T, (H + 2 * Hkv) * D, generator=g)
    start = torch.tensor([0, 3, 300, 41, 0, 0])
    slots, n_new = torch.tensor([5, 0, 3, 1, 6, 6]), torch.tensor([T, T, T, T - 1 if T > 1 else 0, 0, 0])
    cos, sin = Rotary(D, 10000.0)(start[:, None] + torch.arange(T))
    pool_k, pool_v = torch.randn(7, Hkv, W, D, generator=g), torch.randn(7, Hkv, W, D, generator=g)
    cfg = replace(SMALL, num_attention_heads=H, num_key_value_heads=Hkv, head_dim=D, hidden_size=H * D, sliding_window=W + 1)
    layer = Attention(cfg)
    step = Step({}, slots, n_new, start)
    q_pos = start[:, None] + torch.arange(T)
    bias = _additive_mask(layer.mask(q_pos, step), torch.float32)

    def two_kernels(pk, pv, dtype):
        q, k, v = tk.rope_kv_cat(qkv, H, Hkv, cos, sin, pk, pv, slots, dtype, n_new)
        k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(dtype), scale=D ** -0.5)
        return out.float().transpose(1, 2).reshape(B, T, H * D)

    want_k, want_v = pool_k.clone(), pool_v.clone()
    want = two_kernels(want_k, want_v, torch.float32)
    got_k, got_v = pool_k.clone(), pool_v.clone()
    inv_freq = Rotary(D, 10000.0).inv_freq
    got = attention.attend(qkv, H, Hkv, inv_freq, got_k, got_v, slots, n_new, start, W + 1, torch.float32)
    valid = torch.arange(T)[None, :] < n_new[:, None]  # padding frames' outputs are never read
    assert close(got[valid], want[valid])
    assert close(got_k, want_k) and close(got_v, want_v)
    assert not torch.equal(got_k[5], pool_k[5])  # the step wrote history
    assert torch.equal(got_k[2], pool_k[2]) and torch.equal(got_k[4], pool_k[4])  # slots no row uses
    # Keys and values kept in a half dtype (a float32 transformer attending in float16; the
    # interpreter cannot take bf16 products): the pool gets the keys' rounded values, the output
    # SDPA's to the half dtype's rounding.
    half_k, half_v = pool_k.half(), pool_v.half()
    want_hk, want_hv = half_k.clone(), half_v.clone()
    want = two_kernels(want_hk, want_hv, torch.float16)
    got = attention.attend(qkv, H, Hkv, inv_freq, half_k, half_v, slots, n_new, start, W + 1, torch.float32)
    assert torch.equal(half_k, want_hk) and torch.equal(half_v, want_hv)
    assert close(got[valid], want[valid], 2e-3)


def _kv_pool(tr, rows: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Random history for every layer: a masked entry that leaks in would show."""
    return {
        key: torch.randn(rows, *shape, generator=g)
        for layer in tr.layers
        for key, shape in layer.self_attn.state_shapes().items()
    }


def _transformer_step(tr, x, pool, pooled: bool):
    """One step of ``tr`` over rows: a cold stream, one younger than the window, a rolling one;
    ragged n_new (one row with no new frame); rows of ``x`` past 3 are padding rows on the
    scratch slot 6. Returns the output and the pool afterwards."""
    pool = {k: v.clone() for k, v in pool.items()}
    pad = len(x) - 3
    slots, n_new = torch.tensor([5, 0, 3] + [6] * pad), torch.tensor([4, 0, 2] + [0] * pad)
    step = Step(pool, slots, n_new, torch.tensor([0, 30, 300] + [0] * pad)) if pooled else None
    return tr(x, step), pool


@pytest.mark.parametrize("pooled", [True, False], ids=["step", "whole-forward"])
@pytest.mark.parametrize("tiles", ["one", "many", "attention-kernel-off"])
def test_transformer_fused_path_equals_eager(monkeypatch, pooled, tiles):
    """The fused path (fused projections + every transformer kernel: in this 4-frame step each
    layer's attention as one kernel, or with ``attention_frames = 0`` rope_kv_cat with the
    history write, then SDPA) against the module code: same output, same pool state afterwards
    (every slot: padding rows on the scratch slot too). With many tiles (attention kernel off)
    rope_kv_cat walks the KV window's 71 history rows in 18 chunks of 4, the last one short."""
    from code2wav.model.choices import LayerChoices

    if tiles == "many":
        monkeypatch.setattr(snake, "BLOCK", 64)
    tr = model(SMALL, torch.float32).pre_transformer
    assert tr.is_fused  # tests/models.py fuses like load_decoder
    monkeypatch.setattr(tr, "choices", LayerChoices(attention_frames=0 if tiles in ("many", "attention-kernel-off") else 4))
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 4, SMALL.latent_dim, generator=g)
    pool = _kv_pool(tr, 7, g)
    fused, fused_pool = _transformer_step(tr, x, pool, pooled)
    monkeypatch.setattr(snake, "fused", lambda x: False)
    eager, eager_pool = _transformer_step(tr, x, pool, pooled)
    assert close(fused, eager)
    for key in pool:
        assert close(fused_pool[key], eager_pool[key]), key
    if pooled:
        assert not close(eager_pool[key], pool[key])  # the step did write history


def test_one_frame_steps_fold_the_norms_into_the_products(monkeypatch):
    """In a step of a few rows (a lone stream's one-frame chunk) every RMSNorm of the fused path,
    with the residual add before it, runs inside the next product's loads: no norm kernel of its
    own, and the same output and pool as the module code (cold, young and rolling rows, one row
    with no new frame, a padding row on the scratch slot)."""
    from code2wav.model.choices import LayerChoices

    tr = model(SMALL, torch.float32).pre_transformer
    monkeypatch.setattr(tr, "choices", LayerChoices(attention_frames=4))
    g = torch.Generator().manual_seed(9)
    x = torch.randn(4, 1, SMALL.latent_dim, generator=g)
    pool = _kv_pool(tr, 7, g)
    slots, n_new, start = torch.tensor([5, 0, 3, 6]), torch.tensor([1, 0, 1, 0]), torch.tensor([0, 30, 300, 0])

    def step(p):
        p = {k: v.clone() for k, v in p.items()}
        return tr(x, Step(p, slots, n_new, start)), p

    def no_norm_kernel(*a, **k):
        raise AssertionError("a norm ran as a kernel of its own")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(skinny, "rms_norm", no_norm_kernel)
        mp.setattr(skinny, "add_rms_norm", no_norm_kernel)
        fused, fused_pool = step(pool)
    monkeypatch.setattr(snake, "fused", lambda x: False)
    eager, eager_pool = step(pool)
    assert close(fused, eager)
    for key in pool:
        assert close(fused_pool[key], eager_pool[key]), key


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
    16, not 10 of 64. ``fill_sms=False`` (``LayerChoices.unit_fill_sms``) keeps the fixed tiles."""
    monkeypatch.setattr(unit, "ACC_ELEMENTS", 128 * 128)
    assert unit.rows_per_program(16 * 25 * 640, 256, 132) == 64
    assert unit.rows_per_program(16 * 25 * 1920, 128, 132) == 128
    assert unit.rows_per_program(640, 256, 132) == 16
    assert unit.rows_per_program(1920, 128, 132) == 16
    assert unit.rows_per_program(5 * 1920, 128, 132) == 128  # 73 rows per SM: the next power of two
    assert unit.rows_per_program(10, 128, 132) == 16
    assert unit.rows_per_program(640, 256, 132, fill_sms=False) == 64 and unit.rows_per_program(1920, 128, 132, fill_sms=False) == 128
    # Channel tiles count as programs: 640 rows of 384 channels in 3 tiles of 128 fill 132 SMs at 16 rows.
    assert unit.rows_per_program(640, 128, 132, n_tiles=3) == 16 and unit.rows_per_program(16 * 25 * 160, 128, 132, n_tiles=3) == 128
    assert unit.rows_per_program(16 * 25 * 160, 128, 132, n_tiles=3, block_m=64) == 64  # a swept tile caps the rows


@pytest.mark.parametrize("rows,k,n", [(1, 300, 70), (3, 64, 129), (4, 1000, 8), (2, 5, 300)])
def test_skinny_products_match_float64(monkeypatch, rows, k, n):
    """``skinny.matmul_t``: ``x @ w.T + bias`` for a few rows, with any strides of ``w`` (a
    ConvTranspose's taps are a transposed view), into a given output or added to it; equal to
    the float64 product to float32 rounding, for K and N that are no multiple of the tiles."""
    monkeypatch.setattr(skinny, "PROGRAMS", 4)  # several programs and several K steps each
    monkeypatch.setattr(skinny, "TILE", 64)
    g = torch.Generator().manual_seed(rows * k)
    x, w, b = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    assert skinny.applies(x, w)
    want = x.double() @ w.double().T
    assert close(skinny.matmul_t(x, w, b), (want + b.double()).float())
    assert close(skinny.matmul_t(x, w), want.float())
    taps = torch.randn(k, 2 * n, generator=g)  # [c_in, s * c_out]: the second half's columns, transposed
    out = torch.randn(rows + 1, n, generator=g)
    before = out.clone()
    skinny.matmul_t(x, taps[:, n:].t(), out=out[1:], accumulate=True)
    assert close(out[1:], (before[1:].double() + x.double() @ taps[:, n:].double()).float()) and torch.equal(out[0], before[0])


@pytest.mark.parametrize("rows", [1, 3, 6])
def test_skinny_gated_product_is_silu_mul_then_the_product(monkeypatch, rows):
    """``skinny.linear(gu, w, gated=True)``: the MLP's down projection of ``silu(gate) * up``
    for ``gu`` = [gate, up], the gate applied while the kernel loads its input (a few rows),
    or by ``silu_mul`` before cuBLAS (more rows); equal to the float64 formula either way. A
    gated product never silently skips the gate: ``matmul_t`` refuses one it cannot run."""
    monkeypatch.setattr(skinny, "PROGRAMS", 4)
    monkeypatch.setattr(skinny, "TILE", 64)
    g = torch.Generator().manual_seed(rows)
    k, n = 96, 40
    gu, w = torch.randn(1, rows, 2 * k, generator=g) * 2, torch.randn(n, k, generator=g)
    gate, up = gu.double().chunk(2, dim=-1)
    want = (F.silu(gate) * up) @ w.double().T
    assert close(skinny.linear(gu, w, gated=True), want.float())
    assert close(skinny.linear(gu, w, gated=True, enabled=False), want.float())  # silu_mul, then cuBLAS
    with pytest.raises(ValueError, match="gated"):
        skinny.matmul_t(gu[0], w, gated=True, enabled=False)


@pytest.mark.parametrize("rows", [1, 4, 6])
def test_skinny_gelu_and_scaled_residual_after_the_product(monkeypatch, rows):
    """``skinny.linear(..., gelu=True)`` is exact GELU of the product (with its bias), and
    ``residual=r, scale=g`` is ``r + g * (x @ W^T + b)``: the ConvNeXt block's MLP and layer
    scale. In the kernel (up to ``MAX_ROWS`` rows) both ride in its epilogue; past that cuBLAS,
    then ``F.gelu`` / ``addcmul``: the float64 formulas either way."""
    monkeypatch.setattr(skinny, "PROGRAMS", 4)
    monkeypatch.setattr(skinny, "TILE", 64)
    g = torch.Generator().manual_seed(rows + 40)
    k, n = 80, 36
    x, w, b = torch.randn(1, rows, k, generator=g), torch.randn(n, k, generator=g) / 5, torch.randn(n, generator=g)
    r, scale = torch.randn(1, rows, n, generator=g), torch.randn(n, generator=g)
    y = x.double() @ w.double().T + b.double()
    assert close(skinny.linear(x, w, b, gelu=True), F.gelu(y).float())
    assert close(skinny.linear(x, w, b, residual=r, scale=scale), (r.double() + scale.double() * y).float())
    rt = r.transpose(1, 2).contiguous().transpose(1, 2)  # any strides of the residual's rows
    assert close(skinny.linear(x, w, b, residual=rt, scale=scale), (r.double() + scale.double() * y).float())


@pytest.mark.parametrize("rows", [1, 3, 4, 6])
@pytest.mark.parametrize("residual", [False, True], ids=["norm", "add-then-norm"])
def test_normed_product_is_the_norm_then_the_product(monkeypatch, rows, residual):
    """``skinny.normed_linear``: the product of ``rms_norm(h + scale * r)`` (or of
    ``rms_norm(h)``) and the new residual stream ``h + scale * r``, equal to the float64
    formulas. Up to ``MAX_ROWS`` rows it is one launch (every program finds the rows' RMS in its
    loads, over several K steps here, and one stores the stream); past that the norm kernels,
    then the product."""
    monkeypatch.setattr(skinny, "PROGRAMS", 4)  # several programs, so the stream has one writer of many
    monkeypatch.setattr(skinny, "TILE", 64)
    g = torch.Generator().manual_seed(rows)
    k, n, eps = 96, 40, 1e-5
    h, r = torch.randn(1, rows, k, generator=g) * 2, torch.randn(1, rows, k, generator=g)
    scale, nw = torch.rand(k, generator=g), torch.randn(k, generator=g)
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    ran: list[str] = []
    for name in ("rms_norm", "add_rms_norm"):
        monkeypatch.setattr(skinny, name, lambda *a, _f=getattr(skinny, name), _n=name: ran.append(_n) or _f(*a))
    y, stream = skinny.normed_linear(h, w, nw, eps, r if residual else None, scale if residual else None, b)
    hs = h.double() + scale.double() * r.double() if residual else h.double()
    normed = hs * torch.rsqrt(hs.pow(2).mean(-1, keepdim=True) + eps) * nw.double()
    assert close(y, (normed @ w.double().T + b.double()).float()) and close(stream, hs.float())
    assert ran == ([] if rows <= skinny.MAX_ROWS else ["add_rms_norm" if residual else "rms_norm"])


def test_skinny_takes_half_products_where_the_model_says(monkeypatch):
    """float16 inputs and weights go through the kernel as they are (float32 products, one
    rounding of the output to float16), mixed dtypes never; the model's ``LayerChoices`` say
    per dtype whether it may (``skinny_half``, on unless unset; float32 follows ``skinny``)."""
    from code2wav.model.choices import LayerChoices

    monkeypatch.setattr(skinny, "PROGRAMS", 4)
    monkeypatch.setattr(skinny, "TILE", 64)
    g = torch.Generator().manual_seed(7)
    x, w, b = torch.randn(2, 200, generator=g), torch.randn(70, 200, generator=g) / 14, torch.randn(70, generator=g)
    xh, wh, bh = x.half(), w.half(), b.half()
    assert skinny.applies(xh, wh) and not skinny.applies(xh, w) and not skinny.applies(x, wh)
    y = skinny.matmul_t(xh, wh, bh)
    want = xh.double() @ wh.double().T + bh.double()
    assert y.dtype == torch.float16 and close(y, want.half(), 1e-3)  # float16's own rounding of the result
    assert LayerChoices().skinny_for(torch.float32) and LayerChoices().skinny_for(torch.float16)
    assert not LayerChoices(skinny_half=False).skinny_for(torch.float16)
    assert LayerChoices(skinny_half=True).skinny_for(torch.bfloat16)
    assert not LayerChoices(skinny=False, skinny_half=True).skinny_for(torch.float16)
    assert not LayerChoices(skinny=False).skinny_for(torch.float32)


def test_skinny_applies_to_few_rows_of_big_float32_weights(monkeypatch):
    """Where the kernel runs (on CUDA; here through the interpreter): float32, at most
    ``MAX_ROWS`` rows, weights of at least ``MIN_WEIGHT`` elements, with about ``PROGRAMS``
    programs; anything else goes to cuBLAS. ``linear`` equals ``F.linear`` either way."""
    monkeypatch.setattr(skinny, "MIN_WEIGHT", 1 << 18)
    monkeypatch.setattr(skinny, "PROGRAMS", 256)  # the GPU's tiling (the fixture's is the interpreter's)
    w, x = torch.randn(1024, 512), torch.randn(4, 512)
    assert skinny.applies(x, w)
    assert not skinny.applies(torch.randn(5, 512), w)  # rows enough for a tensor-core GEMM
    assert not skinny.applies(x.double(), w.double())  # the exact float64 path stays cuBLAS's
    assert not skinny.applies(x, w[:100])  # launch-bound either way
    bn, bk = skinny.tiles(3072, 512)
    assert 128 <= -(-3072 // bn) <= 2 * skinny.PROGRAMS and bn * bk <= skinny.TILE and bk <= 512
    assert skinny.tiles(512, 1024)[0] == 4  # narrow outputs: the fewest columns a program
    x3 = torch.randn(1, 3, 512)
    b = torch.randn(1024)
    assert close(skinny.linear(x3, w, b), F.linear(x3, w, b))  # 3 rows: the kernel
    x6 = torch.randn(2, 3, 512)
    assert close(skinny.linear(x6, w, b), F.linear(x6, w, b))  # 6 rows: cuBLAS


@pytest.mark.parametrize("on", [True, False], ids=["pdl", "plain"])
def test_a_step_asks_for_pdl_launches_where_the_model_says(monkeypatch, on):
    """Every kernel a streaming step launches takes its launch keywords from kernels/pdl.py,
    inside the model's forward, which asks for PDL per ``LayerChoices.pdl``; the launch itself
    stays plain on a CPU tensor (no sm90), and the switch is off again after the forward."""
    from triton.runtime.interpreter import InterpretedFunction

    from code2wav.kernels import pdl
    from code2wav.model.choices import DEFAULT_CHOICES
    from code2wav.stream.pool import StatePool

    m = model(SMALL, torch.float32).set_layer_choices(replace(DEFAULT_CHOICES, pdl=on))
    pool = StatePool(m, max_streams=2)
    codes = torch.stack([random_codes(1, SMALL, seed=s).T for s in range(2)])
    seen: list[tuple[str, bool, bool, bool]] = []
    launch = InterpretedFunction.run

    def recorded(self, *args, **kwargs):
        seen.append((self.__name__, getattr(pdl._local, "on", False), kwargs["PDL"], kwargs["launch_pdl"]))
        return launch(self, *args, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", recorded)
    pool.run(m, codes, torch.tensor([0, 1]), torch.tensor([1, 1]))
    assert len({name for name, *_ in seen}) >= 5
    assert all(asked == on and not flag and not launched for _, asked, flag, launched in seen), seen
    assert not getattr(pdl._local, "on", False)


def test_pdl_launches_only_where_asked_on_sm90_and_later(monkeypatch):
    """A launch gets PDL inside ``launches(True)`` on a CUDA tensor of an sm90+ device only;
    ``launches`` nests and restores the thread's setting."""
    from types import SimpleNamespace

    from code2wav.kernels import pdl

    gpu = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))
    monkeypatch.setattr(pdl, "_capable", lambda index: True)
    assert pdl.options(gpu) == {"PDL": False, "launch_pdl": False}
    with pdl.launches(True):
        assert pdl.options(gpu) == {"PDL": True, "launch_pdl": True}
        assert pdl.options(torch.zeros(1))["PDL"] is False  # a CPU tensor
        with pdl.launches(False):
            assert pdl.options(gpu)["PDL"] is False
        assert pdl.options(gpu)["PDL"] is True
        monkeypatch.setattr(pdl, "_capable", lambda index: False)  # before Hopper
        assert pdl.options(gpu)["PDL"] is False
    assert getattr(pdl._local, "on", False) is False


def test_every_pdl_kernel_waits_before_touching_memory():
    """The PDL contract (kernels/pdl.py): a kernel that takes ``PDL`` runs ``wait_previous(PDL)``
    as its first statement, so nothing it reads or writes races the kernel before it."""
    import ast
    import inspect

    takers = []
    for mod in (convt, history, mono_conv, skinny, snake, unit, unit_conv, tk):
        for node in ast.walk(ast.parse(inspect.getsource(mod))):
            if isinstance(node, ast.FunctionDef) and "PDL" in [a.arg for a in node.args.args]:
                body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
                first = ast.unparse(body[0])
                takers.append(node.name)
                assert first == "wait_previous(PDL)", f"{mod.__name__}.{node.name} starts with {first!r}"
    assert len(takers) == 13, takers


def _random_pool_on_the_kernel(monkeypatch, slots: int, seed: int):
    """A pool of ``slots`` slots whose buffers hold random values, its slot writes by the kernel
    (kernels/slot_copy.py, in Triton's interpreter)."""
    from code2wav.kernels import slot_copy
    from code2wav.stream.pool import StatePool

    monkeypatch.setattr(slot_copy, "applies", lambda device: True)
    monkeypatch.setattr(slot_copy, "BLOCK", 1 << 15)
    pool = StatePool(model(SMALL, torch.float32), slots)
    g = torch.Generator().manual_seed(seed)
    for b in pool.buffers.values():
        b.copy_(torch.randn(b.shape, generator=g))
    return pool


def test_the_slot_write_kernel_restores_every_segment_bit_for_bit(monkeypatch):
    """``StatePool.restore`` as one launch (kernels/slot_copy.py): a snapshot of one slot written
    into another gives that slot every buffer's row and the position bit for bit (float32 rows
    and the int64 position moved as 16-bit units), and leaves the other slots as they were (the
    scratch row, which holds nothing, took the kernel's first, compiling, run)."""
    pool = _random_pool_on_the_kernel(monkeypatch, 3, seed=0)
    pool.position.copy_(torch.tensor([7, 2**40 + 3, 11, 0]))
    before = {k: b.clone() for k, b in pool.buffers.items()}
    snap = pool.snapshot(1)
    pool.restore(2, snap)
    for k, b in pool.buffers.items():
        assert torch.equal(b[2], before[k][1]) and torch.equal(b[:2], before[k][:2]), k
    assert pool.position.tolist()[:3] == [7, 2**40 + 3, 2**40 + 3]


def test_the_slot_write_keeps_a_direct_launch_only_where_it_writes_bit_for_bit(monkeypatch):
    """On CUDA the write kernel is launched by its compiled launcher directly after its first
    launch (``slot_copy._Direct``); ``SlotLayout.warm`` checks that launch once, on the scratch
    row: one that writes the pattern bit for bit is kept, one that writes anything else or raises
    is dropped (Triton's launcher stays), and the scratch row holds zeros after either way. The
    stand-ins here are launchers of each kind."""
    from code2wav.kernels import slot_copy
    from code2wav.stream.pool import StatePool

    def right(layout):
        def launch(slot, flat):
            for t, off, n in zip(layout._rows[slot], layout.offsets, layout.units):
                t.view(torch.int16).view(-1).copy_(flat[off : off + n])
            return True

        return launch

    def nothing(layout):  # writes nothing
        return lambda slot, flat: True

    def off_by_one(layout):
        launch = right(layout)
        return lambda slot, flat: launch(slot, flat + 1)

    def raising(layout):
        def launch(slot, flat):
            raise TypeError("a launcher of another signature")

        return launch

    monkeypatch.setattr(slot_copy, "applies", lambda device: True)
    monkeypatch.setattr(slot_copy, "BLOCK", 1 << 15)
    for kind, kept in ((right, True), (nothing, False), (off_by_one, False), (raising, False)):
        made = []
        monkeypatch.setattr(slot_copy._Direct, "of", staticmethod(lambda kernel, grid, layout, kind=kind, made=made: made.append(kind(layout)) or made[-1]))
        pool = StatePool(model(SMALL, torch.float32), 2)
        for b in pool.buffers.values():
            b[:2].copy_(torch.randn(b[:2].shape))
        before = {k: b.clone() for k, b in pool.buffers.items()}
        layout = pool.layout  # built here: compiled and checked on the scratch row
        assert (layout._direct is made[0]) if kept else (layout._direct is None), kind.__name__
        assert (layout.direct_off is None) == kept and (kept or "direct launch" in layout.direct_off), (kind.__name__, layout.direct_off)
        for k, b in pool.buffers.items():
            assert not b[pool.scratch_slot].any() and torch.equal(b[:2], before[k][:2]), (kind.__name__, k)
        assert pool.position[pool.scratch_slot] == 0
        pool.restore(1, pool.snapshot(0))  # by whichever launch was kept
        for k, b in pool.buffers.items():
            assert torch.equal(b[1], before[k][0]), (kind.__name__, k)


def test_the_direct_launch_stands_aside_only_while_a_launch_hook_is_set():
    """The direct launch skips Triton's launch hooks, so it runs only while none is set: read
    from this Triton's own ``knobs``, where the hooks are an empty chain (Triton 3.6: never None)
    or None until one is set. A hook added (a profiler's) turns it off; removed, on again."""
    knobs = pytest.importorskip("triton.knobs")
    from code2wav.kernels.slot_copy import hooks_set

    runtime = knobs.runtime
    assert not hooks_set(knobs)

    def hook(*args):
        pass

    if hasattr(runtime.launch_enter_hook, "add"):  # a HookChain
        runtime.launch_enter_hook.add(hook)
        try:
            assert hooks_set(knobs)
        finally:
            runtime.launch_enter_hook.remove(hook)
    else:
        runtime.launch_enter_hook = hook
        try:
            assert hooks_set(knobs)
        finally:
            runtime.launch_enter_hook = None
    assert not hooks_set(knobs)


def test_a_stream_restored_by_the_slot_write_kernel_equals_the_forward(monkeypatch):
    """A cache hit through the one-launch restore, then decoding: the whole-utterance forward's
    audio (float32 through the Triton kernels on CPU)."""
    from code2wav.kernels import slot_copy
    from tests.models import forward_audio, stream_alone

    monkeypatch.setattr(slot_copy, "applies", lambda device: True)
    monkeypatch.setattr(slot_copy, "BLOCK", 1 << 15)
    m = model(SMALL, torch.float32)
    voice, tail = random_codes(14, SMALL, seed=21), random_codes(8, SMALL, seed=22)
    engine = StreamEngine(m, max_streams=2, prefix_cache_bytes=64 << 20)
    stream_alone(engine, "miss", torch.cat([voice, tail]), 14, 2, [2])
    got = stream_alone(engine, "hit", torch.cat([voice, tail]), 14, 8, [1, 7])
    assert engine.prefix_cache_stats()["hits"] == 1
    assert close(got, forward_audio(m, torch.cat([voice, tail]))[14 * 1920 :], 1e-4)


def _in_step_engine(monkeypatch, streams: int) -> tuple[StreamEngine, list[str]]:
    """An engine whose cached states go in inside their streams' first steps (the pairs kernel
    in Triton's interpreter), the launches of each kind recorded."""
    from code2wav.kernels import slot_copy

    monkeypatch.setattr(slot_copy, "applies", lambda device: True)
    monkeypatch.setattr(slot_copy, "BLOCK", 1 << 15)
    launches: list[str] = []
    for name in ("write", "write_pairs"):
        real = getattr(slot_copy.SlotLayout, name)
        monkeypatch.setattr(slot_copy.SlotLayout, name, lambda self, *a, real=real, name=name: launches.append(name) or real(self, *a))
    engine = StreamEngine(model(SMALL, torch.float32), max_streams=streams, prefix_cache_bytes=64 << 20, restores_in_step=True)
    launches.clear()  # the pairs kernel's check when the engine was built (enable_restores_in_step)
    return engine, launches


def test_a_cached_state_goes_in_inside_the_streams_first_step_and_equals_the_forward(monkeypatch):
    """``restores_in_step``: a cache hit launches no restore of its own; its first step writes
    the state from the pair in its inputs, and the stream's audio is the whole-utterance
    forward's (float32, the Triton kernels on CPU), with a one-frame first chunk and a ragged
    rest. A step whose inputs name no restore writes nothing (the other streams, a miss)."""
    from tests.models import forward_audio, stream_alone

    engine, launches = _in_step_engine(monkeypatch, 2)
    m = engine.model
    voice, tail = random_codes(14, SMALL, seed=21), random_codes(8, SMALL, seed=22)
    codes = torch.cat([voice, tail])
    want = forward_audio(m, codes)[14 * 1920 :]
    assert close(stream_alone(engine, "miss", codes, 14, 8, [3, 5]), want, 1e-4)
    assert "write" not in launches and engine.prefix_cache_stats()["misses"] == 1
    launches.clear()
    staged, stage = [], engine.stager.stage
    monkeypatch.setattr(engine.stager, "stage", lambda group: staged.append(stage(group)) or staged[-1])
    got = stream_alone(engine, "hit", codes, 14, 8, [1, 4, 3])
    stats = engine.prefix_cache_stats()
    assert stats["hits"] == 1 and (stats["restored_in_step"], stats["restored_alone"]) == (1, 0)
    assert "write" not in launches and launches.count("write_pairs") == 3  # the kernel at every step's head
    assert close(got, want, 1e-4)
    assert len(staged) == 3 and not any(s.held for s in staged), "no snapshot held past its step"


def three_cached_streams_in_one_step(engine: StreamEngine, before_them=lambda: None, audio: dict | None = None) -> dict[str, bool]:
    """A stream prefills a voice (a miss, then cached); three more open with it and decode their
    first 2 frames in one step, the rest in another. Per stream: whether its audio is the
    whole-utterance forward's (float32, 1e-4); ``audio`` gets each one's audio."""
    from tests.models import forward_audio

    voice = random_codes(12, SMALL, seed=31)
    tails = {f"s{i}": random_codes(6, SMALL, seed=40 + i) for i in range(3)}
    engine.open("warm", voice)
    engine.push("warm", tails["s0"][:1])
    engine.finish("warm")
    before_them()
    for rid in tails:
        engine.open(rid, voice)
    out = engine.decode({rid: t[:2] for rid, t in tails.items()})
    rest = engine.decode({rid: t[2:] for rid, t in tails.items()})
    if audio is not None:
        audio.update({rid: torch.cat([out[rid], rest[rid]]) for rid in tails})
    return {rid: close(torch.cat([out[rid], rest[rid]]), forward_audio(engine.model, torch.cat([voice, t]))[12 * 1920 :], 1e-4) for rid, t in tails.items()}


def test_every_cached_first_chunk_of_a_step_goes_in_as_one_of_its_pairs(monkeypatch):
    """Three cached streams whose first chunks share a step: the step's inputs carry a restore
    pair a row, so all three go in inside it and none by a launch of its own (on the GPU each
    such launch on the worker let the event loop take the interpreter lock from the step's host
    path); each stream's audio is the forward's, and bit for bit what the same three get in the
    same slots and rows when each state goes in by a launch of its own before the step (the write
    kernel; bench/restore_cost.py asks the same of a GPU)."""
    engine, launches = _in_step_engine(monkeypatch, 3)
    audio: dict[bool, dict] = {True: {}, False: {}}
    exact = three_cached_streams_in_one_step(engine, before_them=launches.clear, audio=audio[True])
    stats = engine.prefix_cache_stats()
    assert "write" not in launches and stats["hits"] == 3 and (stats["restored_in_step"], stats["restored_alone"]) == (3, 0)
    assert all(exact.values()), exact
    own = StreamEngine(engine.model, max_streams=3, prefix_cache_bytes=64 << 20, restores_in_step=False)
    three_cached_streams_in_one_step(own, before_them=launches.clear, audio=audio[False])
    assert launches.count("write") == 3 and own.prefix_cache_stats()["restored_alone"] == 3
    slots = lambda e: {rid: st.slot for rid, st in e._streams.items()}  # noqa: E731
    assert slots(engine) == slots(own)  # the same slots, so the same rows
    assert all(torch.equal(audio[True][rid], audio[False][rid]) for rid in audio[True])


@pytest.mark.parametrize("broken", ["first pair only", "past the empty pair"])
def test_a_pairs_kernel_that_fails_its_check_leaves_restores_to_their_own_launch(monkeypatch, broken):
    """``StatePool.enable_restores_in_step`` checks the pairs kernel on the scratch row before
    turning it on: where it stops after its first pair, or reads past the empty one that ends
    them, restores inside steps stay off (the reason kept and logged) and every cached state goes
    in by a launch of its own, so three cached streams sharing a step still get the forward's
    audio. The real kernel (Triton's interpreter) passes and leaves the scratch row zero."""
    from code2wav.kernels import slot_copy

    engine, _ = _in_step_engine(monkeypatch, 3)
    assert engine.pool.restores_in_step and engine.pool.in_step_off is None
    assert all(not b[engine.pool.scratch_slot].any() for b in [*engine.pool.buffers.values(), engine.pool.position])
    real = slot_copy.SlotLayout.write_pairs
    kept = (lambda pairs: pairs[:1]) if broken == "first pair only" else (lambda pairs: pairs[pairs[:, 0] != 0])  # noqa: E731
    monkeypatch.setattr(slot_copy.SlotLayout, "write_pairs", lambda self, pairs: real(self, kept(pairs)))
    engine = StreamEngine(engine.model, max_streams=3, prefix_cache_bytes=64 << 20, restores_in_step=True)
    assert not engine.pool.restores_in_step and not engine.stager.restores_in_step
    assert "did not write its pairs bit for bit" in engine.pool.in_step_off
    exact = three_cached_streams_in_one_step(engine)
    stats = engine.prefix_cache_stats()
    assert stats["hits"] == 3 and (stats["restored_in_step"], stats["restored_alone"]) == (0, 3)
    assert all(exact.values()), exact


def test_the_pairs_kernel_writes_the_pairs_before_the_first_empty_one(monkeypatch):
    """``SlotLayout.write_pairs``: the pairs are packed from the front, and the first with
    address 0 ends them: slots named before it get their snapshot bit for bit, a pair after it
    is not read, and the other slots keep their state."""
    pool = _random_pool_on_the_kernel(monkeypatch, 5, seed=1)
    pool.position.copy_(torch.tensor([3, 5, 7, 9, 11, 0]))
    a, c = pool.snapshot(0), pool.snapshot(1)
    before = {k: b.clone() for k, b in pool.buffers.items()}
    pairs = torch.tensor([[a.flat.data_ptr(), 2], [c.flat.data_ptr(), 3], [0, 0], [a.flat.data_ptr(), 4]])
    pool.layout.write_pairs(pairs)
    for k, b in pool.buffers.items():
        assert torch.equal(b[2], before[k][0]) and torch.equal(b[3], before[k][1]), k
        assert torch.equal(b[:2], before[k][:2]) and torch.equal(b[4:], before[k][4:]), k
    assert pool.position.tolist() == [3, 5, 3, 5, 11, 0]
