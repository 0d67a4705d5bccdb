"""Which work on another CUDA stream a step must wait for before it touches its rows' slots.

A slot's state must see its passes in order: the zeroing after its last owner, the prefill of a
reference prefix, then each step. On one CUDA stream that order is free. With a second stream
(small steps beside the large ones, ``GraphRunner.priority_stream``), a step on one stream waits for the
last work on the other that touched any of its slots, and for nothing else: the steps of other
streams run side by side. Pure bookkeeping over opaque stream and event objects (CUDA's in the
engine); the engine records the events.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any


class SlotOrder:
    """The last (stream, event) that touched each slot, for the work still possibly running."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[Any, Any]] = {}

    def waits(self, slots: Iterable[int], stream: Any) -> list[Any]:
        """Events on other streams than ``stream`` that work touching ``slots`` must wait for
        (each once, in the order first met)."""
        out: dict[int, Any] = {}
        for s in slots:
            last = self._last.get(s)
            if last is not None and last[0] != stream:  # torch's Stream objects compare by the stream they name
                out.setdefault(id(last[1]), last[1])
        return list(out.values())

    def wait(self, slots: Iterable[int], stream: Any) -> None:
        """Make ``stream`` wait for those events (``waits``)."""
        for event in self.waits(slots, stream):
            stream.wait_event(event)

    @contextlib.contextmanager
    def ordered(self, slots: list[int], stream: Any, event: Any) -> Iterator[None]:
        """Work on ``slots`` queued on ``stream`` inside the block: after their last work on
        another stream, and then theirs (``event``, recorded on ``stream`` at the block's end)."""
        self.wait(slots, stream)
        yield
        event.record(stream)
        self.touched(slots, stream, event)

    def touched(self, slots: Iterable[int], stream: Any, event: Any) -> None:
        """Work on ``stream`` that ends at ``event`` touched ``slots`` (after what they waited for)."""
        for s in slots:
            self._last[s] = (stream, event)

    def done(self, slots: Iterable[int], event: Any) -> None:
        """``event`` has completed (its step landed): nothing need wait for it. Forgotten for the
        slots it is still the last of, so that the event may be recorded again for other work."""
        for s in slots:
            last = self._last.get(s)
            if last is not None and last[1] is event:
                del self._last[s]

    def __len__(self) -> int:
        return len(self._last)
