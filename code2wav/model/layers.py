"""Convolutional layers of the decoder, each a :class:`StreamingLayer` where it has a past.

Attribute names mirror the checkpoint (``conv``, ``dwconv``, ``pwconv1``, ``block`` ...), so a
state dict loads without renaming.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from code2wav.kernels import convt, instant, mono_conv, skinny, tail_wide, unit, unit_conv, unit_streamed, unit_window
from code2wav.kernels.snake import bias_add, is_channels_last, residual_add, snake_beta, to_layout
from code2wav.model.choices import DEFAULT_CHOICES, LayerChoices
from code2wav.model.streaming import Step, StreamingLayer


def channels_last_(conv: nn.Module) -> None:
    """Store a conv's weight channels-last (same values and shape, [out, k, in] in memory): with
    channels-last activations, cuDNN then runs its NHWC kernels with no layout conversions."""
    conv.weight.data = to_layout(conv.weight.data, channels_last=True)


class CausalConv1d(StreamingLayer):
    """Conv1d with ``(k-1)*d`` samples of left context and none on the right (stride 1).

    A full (``groups == 1``) conv may run *folded* (``LayerChoices.conv_fold``): sample
    ``t = i*d + j`` of the input (history included, zero-padded to a multiple of ``d``) sits at
    ``[i, j]`` of a ``[B, C, T/d, d]`` view, in either layout a view with no copy, where the
    dilated conv is an undilated ``(k, 1)`` conv, a form cuDNN has faster kernels for
    (bench/conv_forms.py). Outputs read no padding before sample ``L``; the ones past it are
    dropped (a view: rows stay ``C`` channels, the batch stride keeps the padding). A small full
    conv may run as one GEMM over its im2col rows instead (``LayerChoices.conv_gemm_rows``).
    """

    choices: LayerChoices = DEFAULT_CHOICES  # Decoder.set_layer_choices sets the model's

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int = 1, groups: int = 1, rate: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, dilation=dilation, groups=groups)
        self.history = (kernel - 1) * dilation
        self.rate = rate

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        if not self.history:
            return {}
        return {self.state_key: (self.conv.in_channels, self.history)}

    def forward(self, x: Tensor, step: Step | None = None, add_bias: bool = True,
                act: SnakeBeta | None = None, act_bias: Tensor | None = None) -> Tensor:
        """``add_bias=False`` leaves the bias to the caller's next fused op (one pass fewer).
        ``act`` (with the previous conv's ``act_bias``) is applied to ``x`` first, fused with
        the history concat."""
        bias = self.conv.bias if add_bias else None
        d, L = self.conv.dilation[0], x.shape[-1]
        c = self.conv
        if instant.active() and (c.groups == 1 or c.groups == c.in_channels == c.out_channels):  # full or depthwise
            return self._by_taps(self._with_history(x, step, act, act_bias), bias, L)
        mono = self.conv.out_channels == 1 and add_bias  # the output conv: cuDNN is slow for one channel
        pool = step.pool[self.state_key] if step is not None and self.history else None
        if mono and self.choices.read_history and act_bias is None and mono_conv.reads_history(x, pool):
            params = (act.alpha, act.beta) if act is not None else None
            return mono_conv.mono_conv_history(x, self.conv.weight, bias, d, params, pool, *_rows_of(step), self.rate)
        folded = not mono and self.conv.groups == 1 and self.history > 0 and self._folds(d, len(x))
        xx = self._with_history(x, step, act, act_bias, multiple=d if folded else 1)
        if mono:
            return mono_conv.mono_conv(xx, self.conv.weight, bias, d)
        if (not folded and self.conv.groups == 1 and len(x) * L <= self.choices.conv_gemm_rows
                and is_channels_last(xx) and is_channels_last(self.conv.weight)):
            return self._as_gemm(xx, bias, L)
        # As 2-D convs: torch's conv1d picks its memory format from the 3-D tensors (always
        # contiguous) and would copy channels-last activations on every call.
        if folded:
            y = F.conv2d(xx.unflatten(-1, (xx.shape[-1] // d, d)), self.conv.weight.unsqueeze(-1), bias)
            return y.flatten(2)[..., :L]
        w = self.conv.weight.unsqueeze(2)
        return F.conv2d(xx.unsqueeze(2), w, bias, dilation=(1, d), groups=self.conv.groups).squeeze(2)

    def _folds(self, d: int, rows: int) -> bool:
        """Whether this (full, stateful) conv runs folded in a step of ``rows`` rows."""
        fold = self.choices.conv_fold
        return fold == "all" or (rows > 1 and (fold == "multi-row" or (fold == "dilated" and d > 1)))

    def _by_taps(self, xx: Tensor, bias: Tensor | None, L: int) -> Tensor:
        """The instant form (kernels/instant.py) of the conv over ``xx`` = [history, new]: the sum
        over taps ``i`` of the input shifted by ``i * d`` times tap ``i``'s weights (a product
        ``[B * L, in] @ [in, out]`` for a full conv, a per-channel scale for a depthwise one),
        summed in float32 or wider. Matrix products and elementwise ops only: nothing is
        prepared per shape, and no im2col buffer is made. The output keeps ``xx``'s layout."""
        k, d, w = self.conv.kernel_size[0], self.conv.dilation[0], self.conv.weight
        acc = torch.promote_types(xx.dtype, torch.float32)
        y = None
        for i in range(k):
            if self.conv.groups == 1:
                term = (xx[..., i * d : i * d + L].transpose(1, 2) @ w[:, :, i].t()).transpose(1, 2)
            else:  # depthwise: groups == channels
                term = xx[..., i * d : i * d + L] * w[:, 0, i, None]
            y = term.to(acc) if y is None else y.add_(term)
        if bias is not None:
            y = y.add_(bias[:, None])
        return to_layout(y.to(xx.dtype), channels_last=is_channels_last(xx))

    def _as_gemm(self, xx: Tensor, bias: Tensor | None, L: int) -> Tensor:
        """The conv over ``xx`` = [history, new] (channels-last) as ``cols @ W^T``: row ``(b, t)``
        of ``cols`` holds the ``k`` input samples output ``t`` reads (``t + i * d``, each ``C``
        channels; one gather copy), ``W`` is the channels-last weight ``[out, k * in]`` (a view).
        The output ``[B * L, out]`` is channels-last ``[B, out, L]`` with no copy."""
        B, C, _ = xx.shape
        k, d, c_out = self.conv.kernel_size[0], self.conv.dilation[0], self.conv.out_channels
        cols = xx.as_strided((B, L, k, C), (xx.stride(0), C, d * C, 1)).reshape(B * L, k * C)
        w = self.conv.weight.permute(0, 2, 1).reshape(c_out, k * C)
        return skinny.matmul_t(cols, w, bias, enabled=self.choices.skinny_for(cols.dtype)).view(B, L, c_out).transpose(1, 2)


def _rows_of(step: Step | None) -> tuple[Tensor | None, Tensor | None]:
    """A step's slots and new frames per row, for the kernels that read their own history (None
    without a step: the whole-utterance forward, zero history)."""
    return (step.slots, step.n_new) if step is not None else (None, None)


class CausalConvTranspose1d(StreamingLayer):
    """ConvTranspose1d(k, s) with the last ``k - s`` samples dropped, for ``s <= k <= 2s``.

    Output block ``n`` (``s`` samples) sees inputs ``n`` and ``n-1`` only, so one previous input
    sample is all the history it needs; a zero history adds nothing, like the plain forward.

    With ``LayerChoices.convt_gemm`` (channels-last input) the layer runs as matrix products
    instead of cuDNN's transposed conv: block ``n`` is ``x[n] @ W_now + x[n-1] @ W_prev + bias``,
    where ``W_now`` and ``W_prev`` are the first and last ``s`` taps of the weight as
    ``[c_in, s * c_out]`` matrices (views of a channels-last weight), and ``[n, s * c_out]`` rows
    are ``[n * s, c_out]`` samples, channels-last, with no copy. cuDNN's transposed-conv kernels
    carry a fixed cost per call that dominates small steps; the GEMMs also need less graph
    memory."""

    choices: LayerChoices = DEFAULT_CHOICES

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, rate: int = 1):
        super().__init__()
        if not stride <= kernel <= 2 * stride:
            raise ValueError(f"causal ConvTranspose needs stride <= kernel <= 2*stride, got k={kernel} s={stride}")
        self.conv = nn.ConvTranspose1d(c_in, c_out, kernel, stride=stride)
        self.stride = stride
        self.history = 1 if kernel > stride else 0
        self.rate = rate
        self.register_buffer("bias_rows", None, persistent=False)  # the bias once per output sample of a block

    def fuse(self) -> None:
        """Derive ``bias_rows`` from the loaded bias (``Decoder.fold`` calls it)."""
        self.bias_rows = self.conv.bias.detach().repeat(self.stride)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        if not self.history:
            return {}
        return {self.state_key: (self.conv.in_channels, self.history)}

    def forward(self, x: Tensor, step: Step | None = None, act: SnakeBeta | None = None) -> Tensor:
        n = x.shape[-1] * self.stride
        start = self.stride if self.history else 0  # the history's own output block is dropped
        x = self._with_history(x, step, act)
        gemm = self.choices.convt_gemm or instant.active()  # the instant form: no cuDNN plan
        if gemm and self.bias_rows is not None and is_channels_last(x) and self.conv.kernel_size[0] in (self.stride, 2 * self.stride):
            return self._as_gemm(x)
        y = F.conv_transpose2d(x.unsqueeze(2), self.conv.weight.unsqueeze(2), None, stride=(1, self.stride)).squeeze(2)
        # Adding the bias to the trimmed view is also the copy that makes it dense (same layout).
        return bias_add(y[..., start : start + n], self.conv.bias)

    def _as_gemm(self, xx: Tensor) -> Tensor:
        """The forward over ``xx`` = [history, new] (channels-last) as one or two GEMMs on its
        rows, all batch rows at once: row ``r`` of the ``[B * T, c_in]`` matrix pairs with row
        ``r - 1``; the pairs that straddle two batch rows give outputs that are dropped (the
        first block of each row, which belongs to the history)."""
        B, C, T = xx.shape
        c_out, s = self.conv.out_channels, self.stride
        rows = xx.transpose(1, 2)
        if rows.stride(0) != T * C:  # a trimmed view: the rows must sit at one stride
            rows = rows.contiguous()
        rows = rows.reshape(B * T, C)
        w = self.conv.weight.permute(0, 2, 1).reshape(C, -1)  # [c_in, k * c_out]: a view when channels-last
        if not self.history:  # k == s: each input sample makes one output block alone
            y = skinny.matmul_t(rows, w.t(), self.bias_rows, enabled=self.choices.skinny_for(rows.dtype))
            return y.view(B, T * s, c_out).transpose(1, 2)
        if convt.applies(rows, self.choices.convt_kernel_rows):  # both products in one pass
            y = convt.convt_pairs(rows, w, self.bias_rows)
        else:
            y = torch.empty(B * T, s * c_out, device=xx.device, dtype=xx.dtype)
            on = self.choices.skinny_for(rows.dtype)
            skinny.matmul_t(rows[:-1], w[:, s * c_out :].t(), self.bias_rows, out=y[1:], enabled=on)  # previous sample, last s taps
            skinny.matmul_t(rows[1:], w[:, : s * c_out].t(), out=y[1:], accumulate=True, enabled=on)  # this sample, first s taps
        # Row 0 of each batch row is the history's block (row 0 overall was never written).
        return y.view(B, T, s * c_out)[:, 1:].reshape(B, (T - 1) * s, c_out).transpose(1, 2)


class SnakeBeta(nn.Module):
    """``x + sin(x * e^alpha)^2 / (e^beta + 1e-9)``, per channel; alpha and beta stored as logs."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        """``bias``: the preceding conv's bias, added here in the same pass."""
        return snake_beta(x, self.alpha, self.beta, bias)


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv k=7, channel LayerNorm (fp32), MLP x4 with exact GELU, gamma, residual."""

    choices: LayerChoices = DEFAULT_CHOICES

    def __init__(self, dim: int, rate: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim, rate=rate)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, step: Step | None = None) -> Tensor:
        h = self.dwconv(x, step).transpose(1, 2)
        # layer_norm accumulates half/bf16 inputs in fp32 internally (and fp64 in fp64).
        h = F.layer_norm(h, (h.shape[-1],), self.norm.weight, self.norm.bias, self.norm.eps)
        on = self.choices.skinny_for(h.dtype)  # in steps of few rows: GELU, gamma and the residual in the products
        h = skinny.linear(h, self.pwconv1.weight, self.pwconv1.bias, enabled=on, gelu=True)
        y = skinny.linear(h, self.pwconv2.weight, self.pwconv2.bias, enabled=on, residual=x.transpose(1, 2), scale=self.gamma)
        return to_layout(y.transpose(1, 2), is_channels_last(x))  # [B, C, L] as x is laid out (a view on the GPU)


class ResidualUnit(nn.Module):
    choices: LayerChoices = DEFAULT_CHOICES

    def __init__(self, dim: int, dilation: int, rate: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation, rate=rate)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1, rate=rate)
        self._packed: dict[str, tuple] = {}  # the CUDA C++ kernels' packed weights, keyed by their sources

    def _pack(self, kernel: str, src: tuple[Tensor, ...], pack) -> tuple[Tensor, Tensor]:
        """``pack(*src)`` for one of the CUDA C++ kernels, packed on first use and again whenever
        a source tensor moves or changes (never inside a graph capture: the warm-up's eager runs
        pack them before)."""
        key = tuple((t.data_ptr(), t._version) for t in src)
        if kernel not in self._packed or self._packed[kernel][0] != key:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"{kernel}'s weights must be packed by an eager run before a graph capture")
            self._packed[kernel] = (key, *pack(*src))
        return self._packed[kernel][1], self._packed[kernel][2]

    def _unit_src(self) -> tuple[Tensor, ...]:
        """What the whole-unit kernels pack, in their ``pack``'s order."""
        c1, c2 = self.conv1.conv, self.conv2.conv
        return (c1.weight, c2.weight, c1.bias, self.act2.alpha, self.act2.beta, c2.bias, self.act1.alpha, self.act1.beta)

    def window_weights(self) -> tuple[Tensor, Tensor]:
        """The weights as kernels/unit_window.pack lays them out."""
        return self._pack("unit_window", self._unit_src(), unit_window.pack)

    def streamed_weights(self) -> tuple[Tensor, Tensor]:
        """The weights as kernels/unit_streamed.pack lays them out."""
        return self._pack("unit_streamed", self._unit_src(), unit_streamed.pack)

    def tail_weights(self) -> tuple[Tensor, Tensor]:
        """The 1x1 conv's weights and the tail's parameters as kernels/tail_wide.pack lays them out."""
        src = (self.conv2.conv.weight, self.conv1.conv.bias, self.act2.alpha, self.act2.beta, self.conv2.conv.bias)
        return self._pack("tail_wide", src, tail_wide.pack)

    def _window_unit(self, x: Tensor, step: Step | None, d: int, run: Callable[..., Tensor], weights: tuple[Tensor, Tensor]) -> Tensor:
        """A CUDA C++ unit (``run``: the 96-channel window kernel, or the 192-channel one with
        streamed weights, from its packed ``weights``): by default it reads the history and
        applies act1 itself (``LayerChoices.read_history``); otherwise after the history concat."""
        pool = step.pool[self.conv1.state_key] if step is not None else None
        if self.choices.read_history and (pool is None or pool.dtype == x.dtype):
            slots, n_new = _rows_of(step)
            return run(x, *weights, d, pool=pool, slots=slots, n_new=n_new, rate=self.conv1.rate)
        return run(x, *weights, d, xx=self.conv1._with_history(x, step, self.act1))

    def forward(self, x: Tensor, step: Step | None = None) -> Tensor:
        d = self.conv1.conv.dilation[0]
        if unit_window.applies(x, self.choices.unit_window_rows, d):
            run = partial(unit_window.unit_window, producers=self.choices.window_producers)
            return self._window_unit(x, step, d, run, self.window_weights())
        if unit_streamed.applies(x, self.choices.unit_streamed_rows, d):
            return self._window_unit(x, step, d, unit_streamed.unit_streamed, self.streamed_weights())
        if unit_conv.applies(x, self.choices.unit_conv_rows):  # the history concat, then the rest in one kernel
            c1 = self.conv1.conv
            return unit_conv.unit_conv(self.conv1._with_history(x, step, self.act1), x, c1.weight, c1.dilation[0], c1.bias,
                                       self.act2.alpha, self.act2.beta, self.conv2.conv.weight, self.conv2.conv.bias)
        h = self.conv1(x, step, add_bias=False, act=self.act1)
        if unit.applies(x, h):  # conv1's bias, act2, conv2 and the residual in one pass (conv2 has no state)
            return unit.unit_tail(h, x, self.conv2.conv.weight, self.conv1.conv.bias, self.act2.alpha, self.act2.beta, self.conv2.conv.bias,
                                  fill_sms=self.choices.unit_fill_sms)
        if tail_wide.applies(x, h, self.choices.tail_wide_rows):  # act2 with conv1's bias, conv2 and the residual in one kernel
            return tail_wide.tail_wide(h, x, *self.tail_weights(), rows=self.choices.tail_wide_tile)
        h = self.act2(h, bias=self.conv1.conv.bias)
        if self.choices.wide_tail and unit.applies_activated(x, h):  # conv2, its bias and the residual in one pass
            return unit.unit_tail(h, x, self.conv2.conv.weight, None, None, None, self.conv2.conv.bias, fill_sms=self.choices.unit_fill_sms)
        return residual_add(x, self.conv2(h, step, add_bias=False), self.conv2.conv.bias)


class DecoderBlock(nn.Module):
    """SnakeBeta, causal ConvTranspose (k=2r, s=r), three residual units (dilation 1, 3, 9)."""

    def __init__(self, c_in: int, c_out: int, upsample: int, rate: int):
        super().__init__()
        out_rate = rate * upsample
        self.block = nn.ModuleList(
            [SnakeBeta(c_in), CausalConvTranspose1d(c_in, c_out, 2 * upsample, upsample, rate=rate)]
            + [ResidualUnit(c_out, d, rate=out_rate) for d in (1, 3, 9)]
        )

    def forward(self, x: Tensor, step: Step | None = None) -> Tensor:
        x = self.block[1](x, step, act=self.block[0])
        for layer in self.block[2:]:
            x = layer(x, step)
        return x
