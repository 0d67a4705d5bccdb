"""Stand-ins for the vLLM engine modules that vLLM-Omni's Qwen3-TTS files import at module level.

vLLM-Omni's talker-side chunker (``stage_input_processors/qwen3_tts.py``), its own Code2Wav stage
(``models/qwen3_tts/qwen3_tts_code2wav.py``) and its model registry import a handful of names
from ``vllm``; the tests and ``bench/integration_vllm.py`` run them without vLLM installed.
:func:`install` puts minimal stand-ins for exactly those names in ``sys.modules`` (only where the
real ``vllm`` is missing), and makes the ``vllm_omni`` package importable without running its
``__init__`` (which pulls in vLLM's whole engine). Nothing here is vLLM code; each stand-in does
only what those files need of it:

- ``vllm.logger.init_logger``: a stdlib logger with the ``*_once`` helpers;
- ``vllm.config.VllmConfig``, ``vllm.sequence.IntermediateTensors``: names for annotations;
- ``vllm.forward_context``: no forward context is available (no micro-batching);
- ``vllm.platforms.current_platform``: one CUDA graph memory pool (their decoder's graphs);
- ``vllm.model_executor.model_loader.DefaultModelLoader`` and
  ``vllm.model_executor.models.utils.{AutoWeightsLoader, WeightsMapper}``: read a checkpoint
  subfolder's safetensors and copy tensors into a module by name (their ``load_weights``);
- ``vllm.model_executor.models.registry``: a registry of lazily imported model classes by
  architecture name, with ``register_model`` (their registry module; vLLM's ``ModelRegistry``).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = sys.modules.get(name)
    if mod is None:
        mod = types.ModuleType(name)
        mod.__path__ = []  # a package, so submodules can hang below it
        mod._code2wav_stand_in = True
        sys.modules[name] = mod
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(_module(parent), child, mod)
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


# -- vllm.logger ---------------------------------------------------------------------------------


class _Logger(logging.LoggerAdapter):
    _seen: set = set()

    def _once(self, level: int, msg: str, *args: Any, **kwargs: Any) -> None:
        if (level, msg) not in self._seen:
            self._seen.add((level, msg))
            self.log(level, msg, *args, **kwargs)

    def warning_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._once(logging.WARNING, msg, *args, **kwargs)

    def info_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._once(logging.INFO, msg, *args, **kwargs)

    def debug_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._once(logging.DEBUG, msg, *args, **kwargs)


def init_logger(name: str) -> _Logger:
    return _Logger(logging.getLogger(name), {})


# -- vllm.platforms ------------------------------------------------------------------------------


class _Platform:
    _pool = None

    def get_global_graph_pool(self):
        if _Platform._pool is None:
            _Platform._pool = torch.cuda.graph_pool_handle()
        return _Platform._pool

    def is_cuda(self) -> bool:
        return torch.cuda.is_available()


# -- weights -------------------------------------------------------------------------------------


class DefaultModelLoader:
    @dataclass
    class Source:
        model_or_path: str
        revision: str | None = None
        subfolder: str | None = None
        prefix: str = ""

    def __init__(self, load_config: Any = None):
        self.load_config = load_config

    def _get_weights_iterator(self, source: Source):
        from safetensors.torch import load_file

        folder = Path(source.model_or_path) / (source.subfolder or "")
        for f in sorted(folder.glob("*.safetensors")):
            yield from load_file(str(f)).items()


@dataclass
class WeightsMapper:
    orig_to_new_prefix: dict[str, str | None] = field(default_factory=dict)

    def apply(self, weights):
        for name, tensor in weights:
            for old, new in self.orig_to_new_prefix.items():
                if name.startswith(old):
                    name = None if new is None else new + name[len(old):]
                    break
            if name is not None:
                yield name, tensor


class AutoWeightsLoader:
    def __init__(self, module: torch.nn.Module):
        self.module = module

    def load_weights(self, weights, mapper: WeightsMapper | None = None) -> set[str]:
        targets = dict(self.module.named_parameters()) | dict(self.module.named_buffers())
        loaded: set[str] = set()
        with torch.no_grad():
            for name, tensor in mapper.apply(weights) if mapper else weights:
                if name in targets:
                    targets[name].copy_(tensor)
                    loaded.add(name)
        return loaded


# -- the model registry --------------------------------------------------------------------------


@dataclass
class _LazyRegisteredModel:
    module_name: str
    class_name: str

    def load_model_cls(self) -> type:
        return getattr(importlib.import_module(self.module_name), self.class_name)


@dataclass
class _ModelRegistry:
    models: dict[str, Any] = field(default_factory=dict)

    def register_model(self, model_arch: str, model_cls: type | str) -> None:
        if isinstance(model_cls, str):
            module_name, _, class_name = model_cls.partition(":")
            model_cls = _LazyRegisteredModel(module_name, class_name)
        self.models[model_arch] = model_cls

    def get_supported_archs(self):
        return self.models.keys()


def _resolve_module_name(relname: str) -> str:
    return f"vllm.model_executor.models.{relname}"


# -- install -------------------------------------------------------------------------------------


def _bare_package(name: str) -> None:
    """Register package ``name`` with its installed ``__path__`` but without running its
    ``__init__`` (vllm_omni's imports vLLM's engine); its submodules then import normally."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{name} is not installed (pip install --no-deps vllm-omni==0.30.0)")
    mod = types.ModuleType(name)
    mod.__path__ = list(spec.submodule_search_locations)
    mod.__package__ = name
    sys.modules[name] = mod


def install() -> bool:
    """Make vLLM-Omni's Qwen3-TTS modules importable. Returns whether stand-ins were installed
    (False: the real vLLM is importable and is used as it is)."""
    if "vllm" in sys.modules and not getattr(sys.modules["vllm"], "_code2wav_stand_in", False):
        return False
    if "vllm" not in sys.modules and importlib.util.find_spec("vllm") is not None:
        return False
    registry = _ModelRegistry()
    _module("vllm", ModelRegistry=registry)
    _module("vllm.logger", init_logger=init_logger)
    _module("vllm.config", VllmConfig=type("VllmConfig", (), {}))
    _module("vllm.sequence", IntermediateTensors=type("IntermediateTensors", (), {}))
    _module("vllm.platforms", current_platform=_Platform())

    def get_forward_context():
        raise RuntimeError("no vLLM forward context outside vLLM")

    _module("vllm.forward_context", is_forward_context_available=lambda: False, get_forward_context=get_forward_context)
    _module("vllm.model_executor.model_loader", DefaultModelLoader=DefaultModelLoader)
    _module("vllm.model_executor.models", ModelRegistry=registry)
    _module("vllm.model_executor.models.utils", AutoWeightsLoader=AutoWeightsLoader, WeightsMapper=WeightsMapper)
    _module("vllm.model_executor.models.registry", _VLLM_MODELS={}, _LazyRegisteredModel=_LazyRegisteredModel,
            _ModelRegistry=_ModelRegistry, _resolve_module_name=_resolve_module_name)
    _bare_package("vllm_omni")
    return True


def remove() -> None:
    """Take the stand-ins out of ``sys.modules`` again (modules imported meanwhile keep what
    they imported), so later imports of ``vllm`` elsewhere in the process do not see them."""
    for name in [n for n, m in sys.modules.items() if (n == "vllm" or n.startswith("vllm.")) and getattr(m, "_code2wav_stand_in", False)]:
        del sys.modules[name]
