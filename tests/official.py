"""The official qwen-tts 12 Hz tokenizer, imported as a *reference* for tests only.

``qwen_tts/__init__.py`` imports the whole TTS stack (librosa, the LM, ...). We only need the
tokenizer's configuration and modeling modules, so ``qwen_tts`` and ``qwen_tts.core`` are
registered as bare stub packages whose ``__path__`` points at the installed directories; the
submodules then import normally (including their relative import of ``qwen_tts.core._compat``)
without executing either package ``__init__``.

Nothing from here is copied into ``code2wav``: tests compare against it, that is all.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
_LOCAL_CONFIG = _HERE / "data" / "speech_tokenizer_config.json"
_SHARED_CONFIG = _HERE.parents[1] / "shared" / "reference" / "speech_tokenizer_config.json"


def reference_config_path() -> Path:
    """The released tokenizer's config.json: the copy in tests/data, else ../shared/reference."""
    for p in (_LOCAL_CONFIG, _SHARED_CONFIG):
        if p.is_file():
            return p
    raise FileNotFoundError(f"no speech_tokenizer_config.json at {_LOCAL_CONFIG} or {_SHARED_CONFIG}")


def reference_config() -> dict:
    return json.loads(reference_config_path().read_text())


def _stub_package(name: str, path: list[str]) -> None:
    if name in sys.modules:
        return
    mod = types.ModuleType(name)
    mod.__path__ = list(path)
    mod.__package__ = name
    sys.modules[name] = mod


def _import_official():
    spec = importlib.util.find_spec("qwen_tts")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("qwen-tts-compat is not installed (pip install --no-deps qwen-tts-compat)")
    root = list(spec.submodule_search_locations)
    _stub_package("qwen_tts", root)
    _stub_package("qwen_tts.core", [str(Path(p) / "core") for p in root])
    cfg = importlib.import_module("qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2")
    mdl = importlib.import_module("qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2")
    return cfg, mdl


configuration, modeling = _import_official()
Qwen3TTSTokenizerV2Config = configuration.Qwen3TTSTokenizerV2Config
Qwen3TTSTokenizerV2DecoderConfig = configuration.Qwen3TTSTokenizerV2DecoderConfig
Qwen3TTSTokenizerV2Model = modeling.Qwen3TTSTokenizerV2Model
Qwen3TTSTokenizerV2Decoder = modeling.Qwen3TTSTokenizerV2Decoder
Qwen3TTSTokenizerV2DecoderRMSNorm = modeling.Qwen3TTSTokenizerV2DecoderRMSNorm


def official_full_model(config: dict | None = None) -> "Qwen3TTSTokenizerV2Model":
    """The whole official tokenizer (Mimi encoder + decoder) built from a config.json dict."""
    model = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**(config or reference_config())))
    return model.eval().requires_grad_(False)


def copy_weights(official: torch.nn.Module, ours: torch.nn.Module) -> None:
    """Load our decoder's parameters into the official decoder; the key sets must match exactly."""
    result = official.load_state_dict(ours.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result


def set_attn_implementation(official_dec: torch.nn.Module, impl: str) -> None:
    """Switch the official decoder's attention kernel (read from the config at every forward)."""
    configs = {id(m.config): m.config for m in official_dec.modules() if hasattr(m, "config")}
    for c in configs.values():
        c._attn_implementation = impl
    kinds = {m.config._attn_implementation for m in official_dec.modules() if isinstance(m, modeling.Qwen3TTSTokenizerV2DecoderAttention)}
    assert kinds == {impl}, kinds


def promoted_rmsnorm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """The official RMSNorm formula with its fp32 upcast replaced by ``promote(dtype, fp32)``:
    identical for fp32/bf16/fp16 inputs; fp64 stays fp64 instead of being rounded to fp32."""
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.promote_types(input_dtype, torch.float32))
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)
