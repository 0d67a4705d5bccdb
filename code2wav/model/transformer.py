"""The decoder's ``pre_transformer``: 8 pre-norm layers with sliding-window causal attention.

Streaming state per layer is the rotated keys and the values of the last ``sliding_window - 1``
frames; cache entries whose absolute position is negative (a stream younger than the window)
are masked, which is what makes cold, growing and rolling streams share one step.

On CUDA, after :meth:`Transformer.fuse_projections`, the forward takes a fused path with the same
math: q/k/v and gate/up as one GEMM each, and the glue between GEMMs as one Triton kernel per
group (``code2wav/kernels/transformer.py``): ~10 launches per layer instead of ~60. Float64 and
CPU run the module code below unchanged (the exactness reference).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from code2wav.kernels import attention, skinny, snake
from code2wav.kernels.history import window
from code2wav.kernels.transformer import rms_norm_eager, rope_kv_cat, rotate_eager
from code2wav.model.choices import DEFAULT_CHOICES, LayerChoices
from code2wav.model.config import DecoderConfig
from code2wav.model.streaming import Step, StreamingLayer


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm_eager(x, self.weight, self.eps)


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


class Rotary(nn.Module):
    """RoPE on absolute frame positions. Angles are computed in fp32, as the reference model does,
    from float32 frequencies whatever the module's dtype: a cast to a half dtype would round
    them to 8 or 11 bits (``_apply`` puts them back)."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.register_buffer("inv_freq", self._frequencies(), persistent=False)

    def _frequencies(self, device: torch.device | None = None) -> Tensor:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float() / self.head_dim
        return 1.0 / (self.theta ** exponents)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        if self.inv_freq.dtype != torch.float32:
            self.inv_freq = self._frequencies(self.inv_freq.device)
        return self

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        freqs = positions.float()[..., None] * self.inv_freq.float()
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos(), emb.sin()  # [B, T, head_dim]


class Attention(StreamingLayer):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        self.sliding_window = cfg.sliding_window
        self.history = cfg.kv_window
        self.attention_dtype: torch.dtype | None = None  # SDPA's inputs; None: the input's dtype
        # [q; k; v] weights as one matrix, built by fuse(); derived, so not in the state dict.
        self.register_buffer("qkv_weight", None, persistent=False)

    @torch.no_grad()
    def fuse(self) -> None:
        """Build the fused q/k/v weight from the loaded projections (redo after reloading them)."""
        self.qkv_weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        shape = (self.n_kv, self.history, self.head_dim)
        return {f"{self.state_key}.k": shape, f"{self.state_key}.v": shape}

    def key_positions(self, q_pos: Tensor, step: Step | None) -> Tensor:
        """Absolute positions of the keys a step attends to: [cache window, new frames]."""
        if step is None:
            return q_pos
        T = q_pos.shape[1]
        return step.start[:, None] - self.history + torch.arange(self.history + T, device=q_pos.device)

    def mask(self, q_pos: Tensor, step: Step | None) -> Tensor:
        """[B, 1, T, keys]: causal, within the sliding window, and no key before position 0."""
        qp, kp = q_pos[:, :, None], self.key_positions(q_pos, step)[:, None, :]
        return ((kp <= qp) & (kp > qp - self.sliding_window) & (kp >= 0))[:, None]

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor, step: Step | None) -> Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = rotate_eager(q, *rope), rotate_eager(k, *rope)
        if step is not None:
            W = self.history
            k = torch.cat([step.gather(f"{self.state_key}.k").to(k.dtype), k], dim=2)
            v = torch.cat([step.gather(f"{self.state_key}.v").to(v.dtype), v], dim=2)
            step.scatter(f"{self.state_key}.k", window(k, step.n_new, W, dim=2))
            step.scatter(f"{self.state_key}.v", window(v, step.n_new, W, dim=2))
        if self.n_kv != self.n_heads:
            k = k.repeat_interleave(self.n_heads // self.n_kv, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        ad = self.attention_dtype or x.dtype
        out = F.scaled_dot_product_attention(q.to(ad), k.to(ad), v.to(ad), attn_mask=mask, scale=1.0 / math.sqrt(self.head_dim))
        return self.o_proj(out.to(x.dtype).transpose(1, 2).reshape(B, T, -1))

    def pool_kv(self, step: Step) -> tuple[Tensor, Tensor]:
        """This layer's key and value histories in ``step``'s pool."""
        return step.pool[f"{self.state_key}.k"], step.pool[f"{self.state_key}.v"]

    def attend_one_kernel(self, qkv: Tensor, inv_freq: Tensor, step: Step, skinny_on: bool = True) -> Tensor:
        """:meth:`attend_fused` in a step of few frames (``Transformer._forward_fused``):
        everything between the two projections is one kernel (kernels/attention.py), RoPE at
        the rows' positions with Rotary's ``inv_freq``."""
        out = attention.attend(qkv, self.n_heads, self.n_kv, inv_freq, *self.pool_kv(step), step.slots, step.n_new,
                               step.start, self.sliding_window, qkv.dtype)
        return skinny.linear(out, self.o_proj.weight, enabled=skinny_on)

    def attend_fused(self, qkv: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor, step: Step | None, skinny_on: bool = True) -> Tensor:
        """:meth:`forward` after :meth:`fuse`, from the fused q/k/v product ``qkv`` [B, T, E]
        (``Transformer._forward_fused`` makes it, the input norm in its loads where it can):
        RoPE, the history concat and the history write in one kernel, SDPA, the output
        projection (``skinny_on``: ``LayerChoices.skinny_for``)."""
        B, T, _ = qkv.shape
        if step is None:
            q, k, v = rope_kv_cat(qkv, self.n_heads, self.n_kv, *rope, out_dtype=self.attention_dtype)
        else:
            q, k, v = rope_kv_cat(qkv, self.n_heads, self.n_kv, *rope, *self.pool_kv(step), step.slots, self.attention_dtype, step.n_new)
        if self.n_kv != self.n_heads:
            k = k.repeat_interleave(self.n_heads // self.n_kv, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(self.head_dim))
        return skinny.linear(out.to(qkv.dtype).transpose(1, 2).reshape(B, T, -1), self.o_proj.weight, enabled=skinny_on)


class MLP(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.register_buffer("gate_up_weight", None, persistent=False)  # [gate; up], see fuse()

    @torch.no_grad()
    def fuse(self) -> None:
        self.gate_up_weight = torch.cat([self.gate_proj.weight, self.up_proj.weight])

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor, step: Step | None) -> Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), rope, mask, step))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class Transformer(nn.Module):
    choices: LayerChoices = DEFAULT_CHOICES  # Decoder.set_layer_choices sets the model's

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.layers = nn.ModuleList([TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta)

    def fuse_projections(self) -> Transformer:
        """Concatenate each layer's q/k/v and gate/up weights for the fused CUDA path. Call after
        the weights are loaded (and again if they change); parameters and checkpoint names stay
        as they are, the fused copies are non-persistent buffers that follow ``.to()``."""
        for layer in self.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
        return self

    def attend_in(self, dtype: torch.dtype | None) -> Transformer:
        """Run attention (SDPA) in ``dtype`` whatever the layers' dtype (None: theirs). A half
        model's float32 transformer attends in the half dtype its keys and values are stored in:
        the float32 attention kernel is several times slower, for no measurable SNR gain
        (BENCHMARKS.md)."""
        for layer in self.layers:
            layer.self_attn.attention_dtype = dtype
        return self

    @property
    def is_fused(self) -> bool:
        return all(layer.self_attn.qkv_weight is not None and layer.mlp.gate_up_weight is not None for layer in self.layers)

    def forward(self, x: Tensor, step: Step | None = None) -> Tensor:
        """``x``: [B, T, latent_dim] -> [B, T, latent_dim]."""
        if snake.fused(x) and self.is_fused:
            return self._forward_fused(x, step)
        q_pos = self.positions(x, step)
        rope = self.rotary(q_pos)
        mask = self.layers[0].self_attn.mask(q_pos, step)  # the same for every layer
        h = self.input_proj(x)
        for layer in self.layers:
            h = layer(h, rope, mask, step)
        return self.output_proj(self.norm(h))

    def positions(self, x: Tensor, step: Step | None) -> Tensor:
        """[B, T] absolute frame positions of ``x``'s frames (from each row's start in a step)."""
        B, T, _ = x.shape
        q_pos = torch.arange(T, device=x.device).expand(B, T)
        return q_pos if step is None else step.start[:, None] + q_pos

    def _forward_fused(self, x: Tensor, step: Step | None) -> Tensor:
        """The layers' math regrouped so each residual add + layer scale shares a kernel with the
        RMSNorm that follows it (the next layer's input norm, or the final norm), and in steps
        of a few rows that kernel is the next product itself (``skinny.normed_linear``: the norm
        in its loads). In steps of few frames (``LayerChoices.attention_frames``) attention is
        one kernel that rotates and masks by position itself: no RoPE tables, no mask."""
        on = self.choices.skinny_for(x.dtype)
        h = skinny.linear(x, self.input_proj.weight, self.input_proj.bias, enabled=on)
        first = self.layers[0].self_attn
        dtype = first.attention_dtype or h.dtype
        one_kernel = step is not None and attention.applies(h, *first.pool_kv(step), dtype, self.choices.attention_frames)
        if not one_kernel:
            q_pos = self.positions(x, step)
            rope, bias = self.rotary(q_pos), _additive_mask(first.mask(q_pos, step), dtype)
        # The residual add waiting for the next norm: h + scale * res (none before the first layer).
        res: Tensor | None = None
        scale: Tensor | None = None
        for layer in self.layers:
            attn, mlp, pre = layer.self_attn, layer.mlp, layer.input_layernorm
            qkv, h = skinny.normed_linear(h, attn.qkv_weight, pre.weight, pre.eps, res, scale, enabled=on)
            a = attn.attend_one_kernel(qkv, self.rotary.inv_freq, step, on) if one_kernel else attn.attend_fused(qkv, rope, bias, step, on)
            post = layer.post_attention_layernorm
            gu, h = skinny.normed_linear(h, mlp.gate_up_weight, post.weight, post.eps, a, layer.self_attn_layer_scale.scale, enabled=on)
            res, scale = skinny.linear(gu, mlp.down_proj.weight, enabled=on, gated=True), layer.mlp_layer_scale.scale
        return skinny.normed_linear(h, self.output_proj.weight, self.norm.weight, self.norm.eps, res, scale, self.output_proj.bias, on)[0]


def _additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """The boolean mask as SDPA converts it (0 where allowed, -inf elsewhere), once per step
    instead of once per layer inside SDPA. The key axis is padded to a multiple of 8 and sliced
    back, so the memory-efficient kernel finds it aligned and does not pad a copy every layer."""
    B, one, T, K = mask.shape
    bias = torch.zeros(B, one, T, -(-K // 8) * 8, dtype=dtype, device=mask.device)[..., :K]
    return bias.masked_fill_(~mask, float("-inf"))
