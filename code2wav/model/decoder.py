"""Qwen3-TTS-Tokenizer-12Hz decoder: codec frames [B, 16, T] -> 24 kHz audio [B, 1, T*1920].

Module names mirror the checkpoint's ``decoder.*`` keys. The forward is split where streaming
needs it: ``front`` (dequantize, pre_conv, transformer; state includes the KV window) and
``back`` (upsamplers and the conv decoder; state is conv history only, a few frames deep).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from code2wav.kernels import pdl
from code2wav.kernels.snake import to_layout
from code2wav.model.choices import DEFAULT_CHOICES, LayerChoices
from code2wav.model.config import DecoderConfig
from code2wav.model.layers import CausalConv1d, CausalConvTranspose1d, ConvNeXtBlock, DecoderBlock, SnakeBeta, channels_last_
from code2wav.model.streaming import Step, StreamingLayer, assign_state_keys, state_shapes
from code2wav.model.transformer import Transformer


class Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def embedding(self) -> Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _VQLayer(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(size, dim)


class _VQStack(nn.Module):
    def __init__(self, n: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList([_VQLayer(size, dim) for _ in range(n)])


class RVQGroup(nn.Module):
    """One group of the split RVQ: codebooks summed, then a 1x1 ``output_proj``.
    ``input_proj`` belongs to the encoder side and is loaded but never used."""

    def __init__(self, n: int, size: int, dim: int, out_dim: int):
        super().__init__()
        self.input_proj = nn.Conv1d(out_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, out_dim, 1, bias=False)
        self.vq = _VQStack(n, size, dim)

    def projected_tables(self) -> Tensor:
        """[n, size, out_dim]: each codebook already passed through ``output_proj`` (it is linear)."""
        w = self.output_proj.weight[:, :, 0].double()
        return torch.stack([layer._codebook.embedding().double() @ w.T for layer in self.vq.layers])


class SplitRVQ(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        dim = cfg.codebook_dim // 2
        n_sem = cfg.num_semantic_quantizers
        self.rvq_first = RVQGroup(n_sem, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = RVQGroup(cfg.num_quantizers - n_sem, cfg.codebook_size, dim, cfg.codebook_dim)
        self.codebook_size = cfg.codebook_size
        self.register_buffer("table", None, persistent=False)
        self.register_buffer(
            "offsets", torch.arange(cfg.num_quantizers) * cfg.codebook_size, persistent=False
        )

    @torch.no_grad()
    def fold(self, dtype: torch.dtype | None = None) -> None:
        """Fold ``embedding_sum / cluster_usage`` and ``output_proj`` into one lookup table (in
        float64, then ``dtype``): dequantizing becomes a single embedding-bag sum."""
        tables = torch.cat([self.rvq_first.projected_tables(), self.rvq_rest.projected_tables()])
        self.table = tables.flatten(0, 1).to(dtype or self.rvq_first.output_proj.weight.dtype)

    def forward(self, codes: Tensor) -> Tensor:
        """codes [B, Q, T] in [0, codebook_size) -> [B, codebook_dim, T]."""
        if self.table is None:
            raise RuntimeError("codebooks are not folded: call Decoder.fold() after loading weights")
        B, Q, T = codes.shape
        idx = codes.transpose(1, 2) + self.offsets  # [B, T, Q] rows of the stacked table
        return F.embedding(idx, self.table).sum(2).transpose(1, 2)


class Decoder(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.config = cfg
        self.quantizer = SplitRVQ(cfg)
        self.pre_conv = CausalConv1d(cfg.codebook_dim, cfg.latent_dim, 3, rate=1)
        self.pre_transformer = Transformer(cfg)
        rate = 1
        upsample = []
        for f in cfg.upsampling_ratios:
            upsample.append(
                nn.ModuleList(
                    [CausalConvTranspose1d(cfg.latent_dim, cfg.latent_dim, f, f, rate=rate), ConvNeXtBlock(cfg.latent_dim, rate * f)]
                )
            )
            rate *= f
        self.upsample = nn.ModuleList(upsample)
        decoder: list[nn.Module] = [CausalConv1d(cfg.latent_dim, cfg.decoder_dim, 7, rate=rate)]
        for i, r in enumerate(cfg.upsample_rates):
            decoder.append(DecoderBlock(cfg.decoder_dim >> i, cfg.decoder_dim >> (i + 1), r, rate))
            rate *= r
        out_dim = cfg.decoder_dim >> len(cfg.upsample_rates)
        decoder += [SnakeBeta(out_dim), CausalConv1d(out_dim, 1, 7, rate=rate)]
        self.decoder = nn.ModuleList(decoder)
        self.is_channels_last = False  # activation layout of the conv stack, see channels_last()
        self.layer_choices = DEFAULT_CHOICES
        self.low_rate_peak: float | None = None  # set where low_rate_dtype="auto" measured it (model/low_rate.py)
        assign_state_keys(self)

    def set_layer_choices(self, choices: LayerChoices) -> "Decoder":
        """Which kernel or layer form each layer runs (``model/choices.py``): set on every layer
        that has a choice, so the choice belongs to this model, not to the process."""
        self.layer_choices = choices
        for m in self.modules():
            if hasattr(m, "choices"):
                m.choices = choices
        return self

    # -- streaming metadata ---------------------------------------------------------------------

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-stream state: pool key -> shape of one stream's entry."""
        return state_shapes(self)

    def back_context_frames(self) -> int:
        """Frames of transformer output the ``back`` stack must see to rebuild its state exactly:
        the sum over its layers of history / input rate (in frames), rounded up. Everything past
        that horizon has no influence on the state, so a long reference prefix costs the conv
        stack only this many frames (tests check both the bound and that one less is not enough)."""
        frames = sum(
            m.history / m.rate for m in self.back_modules() if isinstance(m, StreamingLayer)
        )
        return math.ceil(frames)

    def back_modules(self):
        yield from self.upsample.modules()
        yield from self.decoder.modules()

    def fold(self, dtype: torch.dtype | None = None) -> None:
        """Derive the inference-only weights from the loaded ones (call after loading, and again
        if they change): the codebooks folded into one lookup table (in ``dtype``), and the
        transformer's fused q/k/v and gate/up matrices for its CUDA path."""
        self.quantizer.fold(dtype)
        self.pre_transformer.fuse_projections()
        for m in self.modules():
            if isinstance(m, CausalConvTranspose1d):
                m.fuse()

    def low_rate_modules(self) -> tuple[nn.Module, ...]:
        """The stages before the conv stack: dequantizer, pre_conv, transformer, upsampling (at most
        4 samples per frame, a few percent of the FLOPs: ``bench/bf16_stages.py --frames 25``)."""
        return (self.quantizer, self.pre_conv, self.pre_transformer, self.upsample)

    def to_dtypes(self, dtype: torch.dtype, device: torch.device | str | None = None,
                  low_rate_dtype: torch.dtype | None = None) -> "Decoder":
        """Fold (see ``fold``) and move to ``device``: the conv stack in ``dtype``, the low-rate
        stages in ``low_rate_dtype``, by default float32 when ``dtype`` is a half type. Both are
        cast from float32 (float64 if either dtype is), so neither part is rounded through the
        other's dtype: call it on the loaded weights.

        Why float32 below the conv stack: on random weights of this architecture, running the
        low-rate stages in float32 raises the bf16 decoder's SNR vs float64 by several dB
        (``bench/bf16_stages.py``; figures in BENCHMARKS.md) at a few percent of the FLOPs; the state pool stays in
        ``dtype`` (attention keys and values are most of it), and attention runs in it. On CUDA
        their matmuls and convs run in TF32 (see ``low_rate_precision``)."""
        half = dtype in (torch.bfloat16, torch.float16)
        low = low_rate_dtype or (torch.float32 if half else dtype)
        self.to(torch.float64 if torch.float64 in (dtype, low) else torch.float32)
        self.fold(low)  # the codebook table from the unrounded weights, in its own dtype
        self.decoder.to(device=device, dtype=dtype)
        self._low_rate_in(low, device)
        if device is not None:
            self.to(device=device)  # anything outside both parts follows the device
        return self.eval().requires_grad_(False)

    def cast_low_rate(self, low_rate_dtype: torch.dtype) -> "Decoder":
        """Cast low-rate stages that ``to_dtypes`` left in float32 (or float64) to
        ``low_rate_dtype``: the same weights as ``to_dtypes`` with that dtype gives, the codebook
        table folded again from the unrounded codebooks (``model/low_rate.py`` decides after
        measuring the float32 stages)."""
        self.quantizer.fold(low_rate_dtype)
        return self._low_rate_in(low_rate_dtype)

    def _low_rate_in(self, low: torch.dtype, device: torch.device | str | None = None) -> "Decoder":
        for m in self.low_rate_modules():
            m.to(device=device, dtype=low)
        self.pre_transformer.attend_in(self.dtype if low != self.dtype else None)  # in the dtype K/V are kept in
        return self

    @property
    def dtype(self) -> torch.dtype:
        """The conv stack's dtype: the audio's, and the state pool's."""
        return self.decoder[0].conv.weight.dtype

    @property
    def low_rate_dtype(self) -> torch.dtype:
        return self.pre_conv.conv.weight.dtype

    def precision(self) -> dict[str, object]:
        """The dtypes it runs, by name (``dtype``: the conv stack's, the audio's), and, where
        ``low_rate_dtype="auto"`` measured it, the probe's peak: what ``/health`` and the bench
        report."""
        names = {"dtype": self.dtype, "low_rate_dtype": self.low_rate_dtype}
        out: dict[str, object] = {k: str(v).removeprefix("torch.") for k, v in names.items()}
        if self.low_rate_peak is not None:
            out["low_rate_peak"] = round(self.low_rate_peak, 3)
        return out

    def low_rate_precision(self) -> contextlib.AbstractContextManager:
        """TF32 (10-bit mantissa inputs, float32 accumulation and range) for the low-rate stages'
        matmuls and convs while they run in float32 under a half-precision conv stack: IEEE
        float32 GEMMs are far slower on tensor-core GPUs, and TF32's rounding is fp16-sized, far
        under the conv stack's own bf16 error. Plain float32 (exact) models are untouched."""
        if self.low_rate_dtype != torch.float32 or self.dtype == torch.float32 or not self.pre_conv.conv.weight.is_cuda:
            return contextlib.nullcontext()
        return _tf32()

    def channels_last(self) -> "Decoder":
        """Run the conv stack channels-last: weights stored [out, k, in], activations [B, L, C] in
        memory (the transformer's output already is; every layer keeps its input's layout), so
        cuDNN's NHWC kernels need no NCHW<->NHWC conversions. Values unchanged."""
        for m in self.modules():
            if isinstance(m, (CausalConv1d, CausalConvTranspose1d)):
                channels_last_(m.conv)
        self.is_channels_last = True
        return self

    # -- compute --------------------------------------------------------------------------------

    def front(self, codes: Tensor, step: Step | None = None) -> Tensor:
        """codes [B, Q, T] -> transformer output [B, latent_dim, T] (in ``low_rate_dtype``)."""
        with self.low_rate_precision(), pdl.launches(self.layer_choices.pdl):
            h = self.pre_conv(self.quantizer(codes), step)
            return self.pre_transformer(h.transpose(1, 2), step).transpose(1, 2)

    def upsampled(self, hidden: Tensor, step: Step | None = None) -> Tensor:
        """[B, latent_dim, T] -> the upsampling stages' output, [B, latent_dim, T * r] with ``r``
        the product of ``upsampling_ratios`` (in ``low_rate_dtype``, laid out for the conv stack)."""
        # The transformer's output is [B, T, C] in memory: kept as it is for a channels-last conv
        # stack, made contiguous otherwise (every layer below keeps its input's layout). Hidden
        # frames joined along time (the engine's prefill) arrive contiguous: laid out here too.
        h = to_layout(hidden, self.is_channels_last)
        with self.low_rate_precision():
            for convt, block in self.upsample:
                h = block(convt(h, step), step)
        return h

    def back(self, hidden: Tensor, step: Step | None = None) -> Tensor:
        """[B, latent_dim, T] -> audio [B, 1, T * samples_per_frame], clamped to [-1, 1]."""
        with pdl.launches(self.layer_choices.pdl):
            h = self.upsampled(hidden, step).to(self.dtype)  # keeps the layout
            act = None
            for layer in self.decoder:
                if isinstance(layer, SnakeBeta):  # fused into the next conv's input pass
                    act = layer
                    continue
                h = layer(h, step) if act is None else layer(h, step, act=act)
                act = None
            return h.clamp(-1.0, 1.0)

    def forward(self, codes: Tensor, step: Step | None = None) -> Tensor:
        """Whole-utterance forward (``step=None``) or one streaming step."""
        return self.back(self.front(codes, step), step)


@contextlib.contextmanager
def _tf32():
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
