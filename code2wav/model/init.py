"""A non-trivial deterministic random initialisation of the real architecture.

The official init zeroes the codebooks (silent output); this one gives audio-like signal ranges so
tests compare real numbers, not clamped constants: weights ~ N(0, 1/fan_in), codebooks ~ N(0, 1),
cluster usage ~ U(0.5, 2), residual-unit convs at half
gain (at full gain the conv stack amplifies fp32 rounding ~5000x, so no fp32 check means much),
Snake alpha/beta ~ N(0, 0.3), layer scales/gamma ~ N(0.3, 0.1), and the
final conv rescaled so the output std is about 0.3.
"""

from __future__ import annotations

import torch

from code2wav.model.config import DecoderConfig
from code2wav.model.decoder import Decoder


@torch.no_grad()
def random_decoder(cfg: DecoderConfig, seed: int = 0, target_std: float = 0.3) -> Decoder:
    g = torch.Generator().manual_seed(seed)
    model = Decoder(cfg)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "embedding_sum":
            p.copy_(torch.randn(p.shape, generator=g))
        elif leaf == "cluster_usage":
            p.copy_(torch.rand(p.shape, generator=g) * 1.5 + 0.5)
        elif leaf in ("alpha", "beta"):
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        elif leaf in ("scale", "gamma"):
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + 0.3)
        elif leaf == "bias":
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        elif p.dim() == 1:  # norm weights
            p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)
        else:
            fan_in = p.shape[1] * (p.shape[2] if p.dim() == 3 else 1)
            if name.endswith("conv.weight") and isinstance(_owner(model, name), torch.nn.ConvTranspose1d):
                fan_in = p.shape[0] * p.shape[2] // _owner(model, name).stride[0]
            if name.endswith("dwconv.conv.weight"):
                fan_in = p.shape[2]
            gain = 0.5 if ".conv1." in name or ".conv2." in name else 1.0  # residual branches
            p.copy_(torch.randn(p.shape, generator=g) * gain / fan_in**0.5)
    # Rescale the last conv so the (unclamped) output has the target spread.
    model.fold()
    codes = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, 8), generator=g)
    captured: list[torch.Tensor] = []
    handle = model.decoder[-1].register_forward_hook(lambda m, i, o: captured.append(o))  # pre-clamp
    final = model.decoder[-1].conv
    model(codes)
    handle.remove()
    out = captured[0]
    final.weight.mul_(target_std / out.std())
    final.bias.fill_(0.0)
    return model


def _owner(model: torch.nn.Module, param_name: str) -> torch.nn.Module:
    return model.get_submodule(param_name.rsplit(".", 1)[0])
