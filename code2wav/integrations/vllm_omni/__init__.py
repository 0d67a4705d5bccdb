"""code2wav's Code2Wav stage for vLLM-Omni (docs/integrations.md).

A deploy config selects it for the Qwen3-TTS code2wav stage with one line,
``model_arch: Code2WavQwen3TTSCode2Wav``. The class lives in :mod:`.stage`; this module holds
only what vLLM loads in every process through the ``vllm.general_plugins`` entry point
(pyproject.toml): :func:`register`, which names the class to vLLM-Omni's model registry without
importing it (so neither torch work nor the version check runs until a stage selects it).
"""

from __future__ import annotations

ARCH = "Code2WavQwen3TTSCode2Wav"
CLASS_PATH = "code2wav.integrations.vllm_omni.stage:Code2WavQwen3TTSCode2Wav"


def register() -> None:
    """Register :data:`ARCH` with vLLM-Omni's model registry (the one its stage configs resolve
    ``model_arch`` in) and with vLLM's own ``ModelRegistry`` (what vLLM-Omni's own plugin fills too). Safe to call many times (vLLM loads
    plugins once per process, in several processes). Without vLLM-Omni installed it does
    nothing: code2wav may be installed beside a plain vLLM."""
    try:
        from vllm_omni.model_executor.models.registry import OmniModelRegistry
    except ImportError:
        return
    OmniModelRegistry.register_model(ARCH, CLASS_PATH)
    try:
        from vllm.model_executor.models import ModelRegistry
    except ImportError:  # pragma: no cover - vllm_omni imports vllm
        return
    if ModelRegistry is not OmniModelRegistry:
        ModelRegistry.register_model(ARCH, CLASS_PATH)
