"""Code2Wav stages for the serving stacks a Qwen3-TTS talker runs in (docs/integrations.md).

Each module is a drop-in replacement for one stack's own Code2Wav stage, backed by code2wav's
exact engine; it imports the stack lazily and checks its version first (:func:`require`), so
``import code2wav`` never needs either stack.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from packaging.specifiers import SpecifierSet


def require(dist: str, spec: str, extra: str) -> str:
    """The installed version of ``dist``; ImportError naming the supported range and the extra
    to install when it is missing or outside ``spec``."""
    try:
        found = version(dist)
    except PackageNotFoundError:
        raise ImportError(f"code2wav's {extra} stage needs {dist}{spec}, which is not installed: pip install 'code2wav[{extra}]'") from None
    if found not in SpecifierSet(spec):
        raise ImportError(f"code2wav's {extra} stage supports {dist}{spec}, found {found}: pip install 'code2wav[{extra}]'")
    return found
