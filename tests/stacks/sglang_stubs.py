"""Stand-ins for the engine modules SGLang-Omni's vocoder files import at module level, and the
builders that put both vocoder schedulers (SGLang-Omni's own and code2wav's) on the same weights.

Shared by tests/test_integration_sglang_omni.py and bench/integration_sglang.py. Nothing here is
SGLang-Omni's code: every scheduler, message, payload and stream type is imported from the
installed wheel. Two things are stood in, because their real modules cannot load here:

* ``sglang_omni.platforms``: its ``__init__`` imports ``sglang.srt`` (the SGLang engine) to pick
  the hardware platform. The stand-in is a package over the real folder (so
  ``sglang_omni.platforms.device_graph`` is the real file) whose ``current_platform`` answers the
  few questions the vocoder and config files ask, for CPU or CUDA.
* ``sglang.srt.utils.custom_op.register_custom_op`` (the SGLang engine), which SGLang-Omni's
  fused SnakeBeta kernel is decorated with: the stand-in leaves the function as it is (eager; it
  only matters to torch.compile, which neither scheduler runs here).
* qwen-tts's ``Qwen3TTSTokenizer`` wrapper (its module imports librosa): SGLang-Omni's scheduler
  reads ``tokenizer.model.decoder`` (the official decoder, real here, with the checkpoint's
  weights), the decoder config, the sample rates and, for whole utterances, ``decode``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import torch


class Platform:
    """What ``current_platform`` is asked by the Qwen3-TTS vocoder and config modules."""

    def __init__(self) -> None:
        self.device_type = "cuda" if torch.cuda.is_available() else "cpu"

    def is_cuda(self) -> bool:
        return self.device_type == "cuda"

    def is_cpu(self) -> bool:
        return self.device_type == "cpu"

    def is_npu(self) -> bool:
        return False

    def get_device_graph_backend(self, device):
        if torch.device(device).type != "cuda" or not self.is_cuda():
            return None
        from sglang_omni.platforms.device_graph import CudaDeviceGraphBackend

        return CudaDeviceGraphBackend()

    def enable_tts_vocoder_fast_path(self) -> bool:
        return True

    def enable_tts_predictor_graph(self) -> bool:
        return True

    def supports_graph_captured_host_read(self) -> bool:
        return True

    def supports_torchaudio_resample(self) -> bool:
        return True

    def graph_capture_attention(self):
        import contextlib

        return contextlib.nullcontext()


def register_custom_op(op_name: str, **_ignored):
    return lambda fn: fn


def _package(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__path__ = []
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def install() -> None:
    """Register the stand-ins (idempotent). Needs the sglang-omni wheel installed."""
    if "sglang" not in sys.modules and importlib.util.find_spec("sglang") is None:
        for name in ("sglang", "sglang.srt", "sglang.srt.utils"):
            _package(name)
        _package("sglang.srt.utils.custom_op", register_custom_op=register_custom_op)
    name = "sglang_omni.platforms"
    if name in sys.modules:
        return
    spec = importlib.util.find_spec("sglang_omni")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("sglang-omni is not installed (pip install --no-deps sglang-omni==0.1.9)")
    mod = types.ModuleType(name)
    mod.__path__ = [str(Path(p) / "platforms") for p in spec.submodule_search_locations]
    mod.__package__ = name
    mod.current_platform = Platform()  # type: ignore[attr-defined]
    sys.modules[name] = mod


class Tokenizer:
    """Stand-in for ``qwen_tts.Qwen3TTSTokenizer`` around a real official 12 Hz decoder."""

    def __init__(self, decoder: torch.nn.Module, decoder_config) -> None:
        self.model = types.SimpleNamespace(
            decoder=decoder,
            config=types.SimpleNamespace(decoder_config=decoder_config),
            decode_upsample_rate=int(decoder.total_upsample),
            get_output_sample_rate=lambda: 24000,
        )
        self.device = next(decoder.parameters()).device

    def get_output_sample_rate(self) -> int:
        return 24000

    @torch.no_grad()
    def decode(self, items):
        """The official 12 Hz decode of each item's ``audio_codes`` ``[T, Q]`` (float32 numpy)."""
        wavs = []
        for item in items:
            codes = torch.as_tensor(item["audio_codes"], dtype=torch.long, device=self.device)
            wav = self.model.decoder.chunked_decode(codes.T[None]).reshape(-1)
            wavs.append(wav.float().cpu().numpy())
        return wavs, 24000


def official_decoder(ckpt: Path, device="cpu", dtype=torch.float32, attn: str = "sdpa"):
    """The official decoder (qwen-tts-compat) with the checkpoint's decoder weights; RMSNorm keeps
    float64 in float64 (the formula is unchanged for the other dtypes; see tests/official.py)."""
    from safetensors import safe_open

    from tests.official import (
        Qwen3TTSTokenizerV2Decoder,
        Qwen3TTSTokenizerV2DecoderConfig,
        Qwen3TTSTokenizerV2DecoderRMSNorm,
        promoted_rmsnorm_forward,
        set_attn_implementation,
    )

    cfg_json = json.loads((ckpt / "config.json").read_text())
    cfg = Qwen3TTSTokenizerV2DecoderConfig(**cfg_json.get("decoder_config", cfg_json))
    dec = Qwen3TTSTokenizerV2Decoder._from_config(cfg, attn_implementation=attn)
    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        sd = {k[len("decoder."):]: f.get_tensor(k) for k in f.keys() if k.startswith("decoder.")}
    dec.load_state_dict(sd, strict=True)
    set_attn_implementation(dec, attn)
    for m in dec.modules():  # this instance only: other tests read the stock class
        if isinstance(m, Qwen3TTSTokenizerV2DecoderRMSNorm):
            m.forward = types.MethodType(promoted_rmsnorm_forward, m)
    rot = dec.pre_transformer.rotary_emb
    if hasattr(rot, "_ensure_inv_freq"):  # qwen-tts-compat's per-forward host read; inv_freq is valid here
        rot._ensure_inv_freq = lambda ref: None
    return dec.to(device=device, dtype=dtype).eval().requires_grad_(False), cfg


def their_scheduler(ckpt: Path, device="cpu", dtype=torch.float32, **kwargs):
    """SGLang-Omni 0.1.9's ``Qwen3TTSStreamingVocoderScheduler`` on the checkpoint's weights,
    with the stateful (incremental) codec decoder its factory turns on by default."""
    install()
    from sglang_omni.models.qwen3_tts.streaming_vocoder import Qwen3TTSStreamingVocoderScheduler

    dec, cfg = official_decoder(ckpt, device, dtype)
    on_cuda = torch.device(device).type == "cuda"
    opts = dict(device=str(device), enable_stateful_codec_decoder=True, incremental_codec_cuda_graph=on_cuda, initial_cuda_graph=on_cuda,
                followup_cuda_graph=on_cuda, has_reference_prefixed_first_chunks=True)
    opts.update(kwargs)
    sched = Qwen3TTSStreamingVocoderScheduler(Tokenizer(dec, cfg), **opts)
    sched.warmup_now()
    return sched
