"""Which kernel or layer form runs where several compute the same values.

Every choice here changes speed, never the maths: each form is checked against the others (and
the float64 forward) in the tests, so flipping one is an A/B, not a different model. They belong
to a model (``Decoder.set_layer_choices``, ``load_decoder(..., layers=...)``), not to the process,
so two engines in one process may differ. The A/B of any field on a GPU:
``bash bench/gpu.sh ab layers.FIELD=VALUE``; figures live in BENCHMARKS.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from code2wav.kernels.tail_wide import TILINGS

Fold = Literal["multi-row", "dilated", "all", "none"]
FOLDS: tuple[str, ...] = ("multi-row", "dilated", "all", "none")


@dataclass(frozen=True)
class LayerChoices:
    # Which full convs run folded (a dilated conv as an undilated (k, 1) conv over a free
    # [B, C, T/d, d] view): "multi-row" (any d, in steps of two rows or more: at d = 1 the view is
    # [B, C, T, 1], for which cuDNN picks a faster kernel than for the (1, k) form at 96
    # channels), "dilated" (d > 1 only, in steps of two rows or more), "all", "none".
    # One-row steps stay unfolded: cuDNN added layout conversions there (CausalConv1d).
    conv_fold: Fold = "multi-row"
    # Full convs whose output has at most this many samples (rows x time) run as one GEMM over
    # their im2col rows (0: never): small steps' big convs are weight reads with a tiny M, where
    # cuDNN's implicit-GEMM tiles leave most SMs idle and cuBLAS splits K.
    conv_gemm_rows: int = 64
    # ConvTranspose upsamplers as one or two GEMMs over channels-last rows instead of cuDNN's
    # transposed conv (each output block is x[n] @ W_now + x[n-1] @ W_prev + bias).
    convt_gemm: bool = True
    # The residual units' fused tails (kernels/unit.py) take fewer rows per program in small
    # steps, until there are about as many programs as SMs (False: fixed 128-row tiles).
    unit_fill_sms: bool = True
    # At the widths that fused tail does not take (384 and 768 channels: SnakeBeta in its loads
    # was slower), the 1x1 conv, its bias and the residual add as that kernel's plain GEMM after
    # the separate SnakeBeta pass (False: cuDNN's 1x1 conv, then the residual add kernel).
    wide_tail: bool = False
    # At 384 channels, that whole tail (SnakeBeta with conv1's bias, the 1x1 conv, its bias and
    # the residual) as kernels/tail_wide.py's CUDA C++ kernel in steps of at least this many
    # output samples (0: never). bf16 on sm90 only; it takes precedence over ``wide_tail``.
    tail_wide_rows: int = 0
    # That kernel's tile rows, a key of kernels/tail_wide.TILINGS (128 or 64).
    tail_wide_tile: int = 128
    # A residual unit runs as one kernel after its history concat (kernels/unit_conv.py: the
    # dilated conv as an implicit GEMM, its tail in registers) in steps of at least this many
    # output samples (rows x time at the unit's rate; 0: never, cuDNN's conv then the fused
    # tail). 1: every step, at the widths kernels/unit_conv.TILES has tiles for.
    unit_conv_rows: int = 1
    # The 96-channel residual units as kernels/unit_window.py's CUDA C++ kernel (Hopper wgmma:
    # both convs' weights resident in shared memory, each tile's input window copied once and
    # read by all seven taps) in steps of at least this many output samples (0: never, and
    # ``unit_conv_rows`` decides). bf16 on sm90 only; elsewhere ``unit_conv_rows`` decides.
    # 1: every step (bench/replay_ab.py: faster than the Triton unit at multi-row steps, one-frame
    # steps the same within noise).
    unit_window_rows: int = 1
    # The 192-channel residual units as kernels/unit_streamed.py's CUDA C++ kernel (wgmma; the
    # weights, too large for shared memory, streamed through it in stages by the TMA unit; each
    # tile's window filled once, its history read from the pool as the window unit's) in steps of
    # at least this many output samples (0: never, and ``unit_conv_rows`` decides). bf16 on sm90.
    # 16384: about a 128-sample tile for every SM; in smaller steps a tile's 27 weight stages in
    # turn take longer than the Triton unit's many small programs (BENCHMARKS.md, session 35).
    unit_streamed_rows: int = 16384
    # The window unit (above) and the output conv (kernels/mono_conv.py) read their input
    # themselves: each row's history from the state pool, then SnakeBeta of the layer's input,
    # and write the new history back (False: kernels/history.py's history concat first, an extra
    # pass writing and reading the activation).
    read_history: bool = True
    # Warpgroups of the window unit that fill its windows (1 or 2) beside the two that run its
    # products: 2 splits the register file unevenly between them (setmaxnreg); the unit 11-14 %
    # faster at 16 x 25 (BENCHMARKS.md, session 34).
    window_producers: int = 2
    # A ConvTranspose upsampler with history (k = 2s) as one Triton GEMM over row pairs
    # (kernels/convt.py) in steps of at least this many input rows (0: never; its two cuBLAS
    # products, the second reading the output back). 1: every step, at the widths
    # kernels/convt.TILES has tiles for (where bench/convt.py found the kernel faster).
    convt_kernel_rows: int = 1
    # Few-row float32 products (the low-rate stages of small steps) through the Triton
    # GEMV-style kernel (kernels/skinny.py) instead of cuBLAS.
    skinny: bool = True
    # The same for float16/bfloat16 products (float16 low-rate stages, a bf16 conv stack's
    # few-row convs and ConvTransposes), where ``skinny`` is on too. With it a one-frame step's
    # transformer launches no norm or gate kernel: each RMSNorm (and the residual add before it)
    # rides in the next product's loads, the MLP's silu * up in the down projection's.
    skinny_half: bool = True
    # Streaming steps of at most this many frames a row run each layer's attention as one
    # kernel (kernels/attention.py: RoPE, the KV history read and write, the position mask,
    # softmax, the output in the projection's rows) instead of rope_kv_cat, a mask, SDPA and a
    # copy (0: never). Its keys must fit one tile: W + this many rows.
    attention_frames: int = 32
    # Triton kernels launched with programmatic dependent launch on sm90+ (kernels/pdl.py): the
    # next kernel is placed while the one before it finishes, and waits for its writes there.
    pdl: bool = False

    def skinny_for(self, dtype: torch.dtype) -> bool:
        """Whether few-row products in ``dtype`` may take the skinny kernel."""
        return self.skinny and (self.skinny_half or dtype == torch.float32)

    def __post_init__(self) -> None:
        if self.conv_fold not in FOLDS:
            raise ValueError(f"conv_fold must be one of {FOLDS}, got {self.conv_fold!r}")
        for name in ("conv_gemm_rows", "unit_conv_rows", "unit_window_rows", "unit_streamed_rows", "tail_wide_rows", "convt_kernel_rows",
                     "attention_frames"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.tail_wide_tile not in TILINGS:
            raise ValueError(f"tail_wide_tile must be one of {sorted(TILINGS)}, got {self.tail_wide_tile}")
        if self.window_producers not in (1, 2):
            raise ValueError(f"window_producers must be 1 or 2, got {self.window_producers}")


DEFAULT_CHOICES = LayerChoices()
