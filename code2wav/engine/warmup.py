"""Graphs captured while the engine serves, so that a cold start answers in seconds.

Capturing a graph is quick. The first run of each new step shape is what costs: cuDNN makes its
plans for each convolution, Triton loads (or compiles) the kernels of that specialisation. A
serve start has dozens of shapes, so capturing them all before serving keeps the first request
waiting for all of their first runs. With ``EngineConfig.graph_capture = "background"`` the service answers at
once. A :class:`Warmup` thread gives each planned shape its first runs, eagerly, on its own
CUDA stream, off the scratch slot, so no stream's state changes. It then hands the shape to the
engine's worker, which captures it between two steps, where nothing else is on the GPU queue.
Steps whose graph is not in yet run eagerly, in the instant forms (the runner's counted ``not
captured`` fallback, kernels/instant.py), and the audio is exact either way. ``/health`` reports ``warming`` until the last graph is in,
then ``ready``. Only one shape is between its warm-up and its capture at any time, so a capture
never overlaps a warm-up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from code2wav.engine.graphs import GraphRunner

log = logging.getLogger("code2wav.engine")
Shape = tuple[str, int, int]  # (kind, rows, frames): GraphRunner.plan's


class Warmup:
    """Warms ``shapes`` (in order) on its thread; :meth:`capture_ready`, called on the engine's
    worker between steps, captures the one that is warm. ``wake``: tells the worker there is
    one (it may be idle)."""

    def __init__(self, runner: GraphRunner, shapes: list[Shape], wake: Callable[[], None]):
        self.runner, self.shapes, self.wake = runner, list(shapes), wake
        self.captured = 0
        self.failed: list[Shape] = []  # shapes whose warm-up or capture raised: they stay eager
        self.seconds: float | None = None  # start to the last graph, once it is in
        self._ready: Shape | None = None  # warm, waiting for the worker
        self._taken = threading.Event()  # the worker captured (or gave up on) the ready shape
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._capture_stream: Any = None  # the runner's side_stream(), made on the worker
        self._t0 = 0.0

    @property
    def state(self) -> str:
        """``warming`` until every planned shape is captured or has failed, then ``ready``."""
        return "ready" if self.captured + len(self.failed) >= len(self.shapes) else "warming"

    def status(self) -> dict[str, object]:
        """What ``/health`` reports of it."""
        return {"state": self.state, "captured": self.captured, "planned": len(self.shapes), "failed": len(self.failed)}

    def start(self) -> None:
        if self._thread is None and self.shapes:
            self._t0 = time.perf_counter()
            self._thread = threading.Thread(target=self._run, name="code2wav-warmup", daemon=True)
            self._thread.start()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stop(self) -> None:
        """Stop warming (graphs captured so far stay); returns once the thread has ended."""
        self._stopping = True
        self._taken.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        stream = self.runner.side_stream()
        for shape in self.shapes:
            if self._stopping:
                return
            try:
                self.runner.warm(shape, stream)
                if self._stopping:
                    return
            except Exception:  # this shape stays eager; the rest go on
                log.warning("warming graph %s failed; its steps run eagerly", shape, exc_info=True)
                self.failed.append(shape)
                continue
            self._taken.clear()
            self._ready = shape
            self.wake()
            self._taken.wait()
        self._finished()

    def capture_ready(self) -> None:
        """On the engine's worker, between steps: capture the shape that is warm, if any."""
        shape, self._ready = self._ready, None
        if shape is None:
            return
        try:
            if self._capture_stream is None:
                self._capture_stream = self.runner.side_stream()
            self.runner.capture_one(shape, self._capture_stream)
            self.captured += 1
        except Exception:
            log.warning("capturing graph %s failed; its steps run eagerly", shape, exc_info=True)
            self.failed.append(shape)
        finally:
            self._taken.set()
        self._finished()

    def _finished(self) -> None:
        if self.state == "ready" and self.seconds is None:
            self.seconds = time.perf_counter() - self._t0
            log.info("captured %d graphs while serving in %.0f s (%d failed, eager)", self.captured, self.seconds, len(self.failed))
