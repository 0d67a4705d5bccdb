"""The code2wav network service (FastAPI + uvicorn): ``code2wav serve``. Needs the ``serve`` extra.

``create_app`` and ``Limits`` load on first use, so a process that only parses request bodies
(``code2wav.server.payloads``) imports neither the web stack nor torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from code2wav.server.app import Limits, create_app

__all__ = ["Limits", "create_app"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from code2wav.server import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
