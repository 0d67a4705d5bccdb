"""The code2wav network service (FastAPI + uvicorn): ``code2wav serve``. Needs the ``serve`` extra."""

from code2wav.server.app import Limits, create_app

__all__ = ["Limits", "create_app"]
