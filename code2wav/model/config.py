"""Decoder configuration, read from the tokenizer's ``config.json`` (``decoder_config``)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

DTYPES: tuple[str, ...] = ("float32", "float64", "bfloat16", "float16")  # torch dtypes a decoder runs in, by name


@dataclass(frozen=True)
class DecoderConfig:
    """Hyper-parameters of the Qwen3-TTS-Tokenizer-12Hz decoder.

    Defaults are the released checkpoint's values; a loaded model always takes them from its
    ``config.json`` instead.
    """

    codebook_size: int = 2048
    codebook_dim: int = 512  # the split RVQ's output width; each codebook is codebook_dim // 2 wide
    num_quantizers: int = 16
    num_semantic_quantizers: int = 1
    latent_dim: int = 1024
    hidden_size: int = 512
    intermediate_size: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 72
    decoder_dim: int = 1536
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    sample_rate: int = 24000
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any], sample_rate: int = 24000) -> "DecoderConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        kw: dict[str, Any] = {}
        for k, v in d.items():
            if k in known and k != "extra":
                kw[k] = tuple(v) if isinstance(v, list) else v
        if "rope_theta" not in d and isinstance(d.get("rope_parameters"), dict):
            kw["rope_theta"] = d["rope_parameters"].get("rope_theta", cls.rope_theta)
        if "head_dim" not in d and "hidden_size" in d and "num_attention_heads" in d:
            kw["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
        kw["sample_rate"] = sample_rate
        cfg = cls(**kw)
        cfg.validate()
        return cfg

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("extra")
        d.pop("sample_rate")
        d["upsample_rates"] = list(self.upsample_rates)
        d["upsampling_ratios"] = list(self.upsampling_ratios)
        return d

    def validate(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if not 0 < self.num_semantic_quantizers < self.num_quantizers:
            raise ValueError("need 0 < num_semantic_quantizers < num_quantizers")
        if self.decoder_dim % 2 ** len(self.upsample_rates):
            raise ValueError("decoder_dim must halve once per upsample rate")

    @property
    def samples_per_frame(self) -> int:
        """Output samples per codec frame (1920 for the released model)."""
        return math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)

    @property
    def kv_window(self) -> int:
        """Past frames a frame attends to besides itself (the KV cache length)."""
        return self.sliding_window - 1

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.samples_per_frame
