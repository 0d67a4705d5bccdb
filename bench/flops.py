"""The decoder's arithmetic per frame, layer by layer: the floor a step's time is measured against.

``python bench/flops.py [B T] [TFLOP/s]`` (CPU, no weights run): for the released architecture,
each conv, ConvTranspose and linear layer's multiply-adds per frame of audio (a layer at input
rate ``r`` samples per frame makes ``r`` outputs a frame, ``r * s`` for an upsampler of stride
``s``; attention over the 72-frame window counted at full length), grouped by where they sit, with
the share of the whole and the time they would take at the given matmul rate (default: the H200's
measured bf16 775 TFLOP/s) for a step of ``B`` rows of ``T`` frames (default 16 x 25).
"""

from __future__ import annotations

import sys
from collections import defaultdict

from torch import nn

from code2wav.model.config import DecoderConfig
from code2wav.model.decoder import Decoder
from code2wav.model.layers import CausalConv1d, CausalConvTranspose1d


def macs_per_frame(model: Decoder) -> dict[str, float]:
    """Multiply-adds per frame, keyed by the layer's place (its module path, shortened)."""
    out: dict[str, float] = defaultdict(float)
    cfg = model.config
    for name, m in model.named_modules():
        if isinstance(m, CausalConv1d):
            c = m.conv
            out[name] += c.in_channels // c.groups * c.out_channels * c.kernel_size[0] * m.rate
        elif isinstance(m, CausalConvTranspose1d):
            c = m.conv
            out[name] += c.in_channels * c.out_channels * c.kernel_size[0] * m.rate
        elif isinstance(m, nn.Linear):
            rate = 1  # the transformer's and the ConvNeXt blocks' linears: per frame at their stage's rate
            parent = name.rsplit(".", 2)[0]
            owner = model.get_submodule(parent) if parent != name else None
            block = getattr(owner, "dwconv", None) if owner is not None else None
            if block is not None:
                rate = block.rate
            out[name] += m.in_features * m.out_features * rate
    window = 72  # the attention of each transformer layer: q.k and p.v over the window
    heads, dim = cfg.num_attention_heads, cfg.head_dim
    for i in range(cfg.num_hidden_layers):
        out[f"pre_transformer.layers.{i}.attention (window {window})"] += 2 * heads * dim * window
    return dict(out)


def group_of(name: str) -> str:
    """Where a layer sits: a decoder block's upsampler, its 7-tap convs, its 1x1 convs; the rest by stage."""
    parts = name.split(".")
    if parts[0] == "decoder" and len(parts) >= 3 and parts[2] == "block":
        if parts[-1] == "conv1":
            return f"decoder block {parts[1]}: residual 7-tap convs"
        if parts[-1] == "conv2":
            return f"decoder block {parts[1]}: residual 1x1 convs"
        return f"decoder block {parts[1]}: ConvTranspose"
    if parts[0] == "decoder":
        return "decoder: input and output convs"
    return parts[0]


def main(argv: list[str]) -> None:
    b, t = (int(argv[0]), int(argv[1])) if len(argv) >= 2 else (16, 25)
    rate = float(argv[2]) if len(argv) >= 3 else 775.0
    model = Decoder(DecoderConfig())
    per = macs_per_frame(model)
    groups: dict[str, float] = defaultdict(float)
    for name, macs in per.items():
        groups[group_of(name)] += macs
    total = sum(per.values())
    frames = b * t
    print(f"{2 * total / 1e9:.2f} GFLOP per frame ({2 * total * 12.5 / 1e9:.1f} GFLOP per audio second); "
          f"a {b} x {t} step: {2 * total * frames / 1e12:.2f} TFLOP, {2 * total * frames / (rate * 1e12) * 1e3:.2f} ms at {rate:.0f} TFLOP/s")
    print(f"{'where':<44} {'GFLOP/frame':>11} {'share':>7} {'ms/step':>8}")
    for g, macs in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"{g:<44} {2 * macs / 1e9:11.3f} {macs / total:7.1%} {2 * macs * frames / (rate * 1e12) * 1e3:8.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
