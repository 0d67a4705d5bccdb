"""``low_rate_dtype="auto"``: float16 low-rate stages where the loaded weights leave float16 room.

The stages before the conv stack (dequantizer, pre_conv, transformer, upsampling) run in float32
(TF32 on CUDA) under a half conv stack by default. float16 there keeps the bf16 decoder's SNR vs
float64 (10 mantissa bits, like TF32's inputs) and runs its products at twice TF32's rate, but
it overflows at 65,504, and how large these stages' values get depends on the weights. So "auto"
measures it on the weights actually loaded: the float32 stages decode random codes
(``PROBE_ROWS`` x ``PROBE_FRAMES``, every codebook drawn uniformly) while every float32 tensor
a torch function reads or returns is read, weights included, and float16 is used only if the largest
magnitude times ``FLOAT16_HEADROOM`` is still inside float16's range; otherwise (or if the probe
fails: a warning) the stages stay float32. Only on CUDA under a half conv stack (float16 products
on a CPU are slower).

The probe runs the instant forms (``kernels/instant.py``: torch's own formulas, convolutions as
products of shifted views), so it costs no Triton compile and no cuDNN plan before the first
audio. They compute the same values and store every one the float16 path stores, and more
(partial sums of the shifted products, a layer scale's product before its residual add), so the
peak is at or above the float16 path's. Skipped: what that path never stores (``_NOT_READ_INSIDE``);
attention runs in the conv stack's dtype, its scores in SDPA's float32 accumulators.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from code2wav.kernels import instant
from code2wav.model.decoder import Decoder
from code2wav.model.transformer import RMSNorm, Rotary

# Knob: how far under float16's largest value the probe's peak must stay (codes a talker sends
# may reach higher than random ones).
FLOAT16_HEADROOM = 32.0
PROBE_ROWS, PROBE_FRAMES, PROBE_SEED = 2, 128, 0
# Modules whose insides the probe does not read: the float16 path keeps RMSNorm's sum of squares
# in a kernel's float32 registers (its input and output are read outside it), and RoPE's
# positions and angles are float32 in every dtype (``Rotary``).
_NOT_READ_INSIDE = (RMSNorm, Rotary)
_UNWRITTEN = {torch.empty, torch.empty_like, torch.empty_strided, Tensor.new_empty, Tensor.new_empty_strided}


class _Peak(TorchFunctionMode):  # (a TorchDispatchMode imports torch._dynamo: seconds at load)
    """The largest magnitude of any ``dtype`` tensor a torch function reads or returns (a fresh
    empty tensor's garbage aside), kept on the device: no sync per call."""

    def __init__(self, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.dtype, self.peak = dtype, torch.zeros((), dtype=torch.float64, device=device)
        self.paused = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        made = [t for t in tree_leaves(out) if isinstance(t, Tensor)]
        if self.paused or not made:  # no tensor made (``.shape``, ``promote_types``): nothing new to read
            return out
        for t in tree_leaves((args, kwargs)) + ([] if func in _UNWRITTEN else made):
            if isinstance(t, Tensor) and t.dtype == self.dtype and t.numel():
                self.peak = torch.maximum(self.peak, torch.linalg.vector_norm(t, float("inf")).double())
        return out


@torch.no_grad()
def low_rate_peak(model: Decoder, codes: Tensor | None = None) -> float:
    """The largest magnitude any torch function of ``model``'s low-rate stages reads or returns in
    their dtype while they decode ``codes`` ([B, Q, T]; default: the probe's random codes) whole.
    For a half model, whose stages attend in its half dtype: a float32 model's attention masks
    (-inf) are float32 too and read as inf."""
    cfg = model.config
    if codes is None:
        g = torch.Generator().manual_seed(PROBE_SEED)
        codes = torch.randint(0, cfg.codebook_size, (PROBE_ROWS, cfg.num_quantizers, PROBE_FRAMES), generator=g)
    device = model.pre_conv.conv.weight.device
    probe = _Peak(model.low_rate_dtype, device)
    hooks = []
    for m in model.pre_transformer.modules():
        if isinstance(m, _NOT_READ_INSIDE):
            hooks += [m.register_forward_pre_hook(lambda *_: setattr(probe, "paused", True)),
                      m.register_forward_hook(lambda *_: setattr(probe, "paused", False))]
    try:
        with instant.forms(), probe:
            model.upsampled(model.front(codes.to(device)))  # its output is a torch function's: read
    finally:
        for h in hooks:
            h.remove()
    return float(probe.peak)


def float16_fits(peak: float) -> bool:
    return peak * FLOAT16_HEADROOM <= torch.finfo(torch.float16).max


def auto_low_rate(model: Decoder, cuda_only: bool = True) -> torch.dtype:
    """For a model ``to_dtypes`` left with float32 low-rate stages: on CUDA (any device if not
    ``cuda_only``) under a half conv stack, the probe's peak (kept as ``model.low_rate_peak``),
    and the stages cast to float16 if it fits. Returns the low-rate dtype the model runs."""
    half = model.dtype in (torch.bfloat16, torch.float16)
    if half and model.low_rate_dtype == torch.float32 and (model.pre_conv.conv.weight.is_cuda or not cuda_only):
        try:
            model.low_rate_peak = low_rate_peak(model)
        except Exception as e:  # the stages stay float32, the safe side; the start goes on
            warnings.warn(f"low_rate_dtype auto: the probe failed ({type(e).__name__}: {e}); the low-rate stages stay float32",
                          RuntimeWarning, stacklevel=2)
            return model.low_rate_dtype
        if float16_fits(model.low_rate_peak):
            model.cast_low_rate(torch.float16)
    return model.low_rate_dtype
