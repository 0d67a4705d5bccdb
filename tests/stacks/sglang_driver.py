"""Drive a vocoder scheduler the way SGLang-Omni's stage runtime does, with the stack's own types.

The runtime (``sglang_omni.pipeline.stage.runtime``) runs ``scheduler.start()`` on its own
thread, puts ``IncomingMessage``s (``new_request`` with a ``StagePayload``, ``stream_chunk`` with
a ``StreamItem``, ``stream_done``) into ``scheduler.inbox``, calls ``scheduler.abort(id)``
directly, and reads ``scheduler.outbox``. ``StageDriver`` does exactly that. To know when
everything sent so far is handled, it queues a ``wakeup`` message after each batch: the
scheduler's loop answers a message type it does not serve with an ``error`` for that message's
request id, in order, so that error marks the point (it is not passed on).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from tests.stacks import sglang_stubs

sglang_stubs.install()

from sglang_omni.pipeline.stage.stream_queue import StreamItem  # noqa: E402
from sglang_omni.proto import OmniRequest, StagePayload  # noqa: E402
from sglang_omni.scheduling.message import IncomingMessage, OutgoingMessage, put_messages  # noqa: E402

BARRIER = "__barrier-"
BARRIERS = itertools.count()  # one id each, process-wide: the scheduler remembers the ids it answered


def _not_a_barrier(record: logging.LogRecord) -> bool:
    return not any(isinstance(a, str) and a.startswith(BARRIER) for a in (record.args or ()))


logging.getLogger("sglang_omni.scheduling.streaming_simple_scheduler").addFilter(_not_a_barrier)


@dataclass
class Request:
    """One talker request as the vocoder stage sees it: reference codes, generated codes, and the
    sizes of the chunks the talker streams them in."""

    rid: str
    ref: torch.Tensor  # [P, Q] (P may be 0)
    gen: torch.Tensor  # [N, Q]
    sizes: list[int]
    start: int = 0  # the talker step of its first chunk
    sent: int = 0  # chunks sent
    params: dict = field(default_factory=lambda: {"stream": True})

    def chunk(self, i: int) -> IncomingMessage:
        at = sum(self.sizes[:i])
        codes = self.gen[at : at + self.sizes[i]]
        meta: dict[str, object] = {"modality": "audio_codes", "stream": True, "num_quantizers": int(codes.shape[-1])}
        if i == 0:
            meta["ref_code_len"] = int(self.ref.shape[0])
            codes = torch.cat([self.ref, codes]) if self.ref.shape[0] else codes
        return IncomingMessage(self.rid, "stream_chunk", StreamItem(chunk_id=i, data=codes, from_stage="tts_engine", metadata=meta))

    def payload(self) -> IncomingMessage:
        """The talker's terminal result, routed to the vocoder as its ``new_request``."""
        data = {"audio_codes": torch.cat([self.ref, self.gen]), "ref_code_len": int(self.ref.shape[0]), "prompt_tokens": int(self.ref.shape[0]),
                "completion_tokens": int(self.gen.shape[0]), "sample_rate": 24000, "finish_reason": "stop"}
        return IncomingMessage(self.rid, "new_request", StagePayload(self.rid, OmniRequest(inputs=None, params=dict(self.params)), data))

    def done(self) -> IncomingMessage:
        return IncomingMessage(self.rid, "stream_done")


def waveform(msg: OutgoingMessage) -> np.ndarray:
    """A ``stream`` message's audio (``audio_waveform_payload``'s float32 bytes)."""
    d = msg.data
    assert d["audio_waveform_dtype"] == "float32" and d["modality"] == "audio" and d["sample_rate"] == 24000, d.keys()
    arr = np.frombuffer(d["audio_waveform"], dtype=np.float32)
    assert list(arr.shape) == list(d["audio_waveform_shape"])
    return arr


class StageDriver:
    def __init__(self, scheduler, timeout: float = 120.0):
        self.s = scheduler
        self.timeout = timeout
        self.out: dict[str, list[OutgoingMessage]] = {}
        self.thread = threading.Thread(target=scheduler.start, name="scheduler-vocoder", daemon=True)
        self.thread.start()

    def send(self, msgs: list[IncomingMessage]) -> None:
        """Queue ``msgs`` together (as a burst of talker output arrives), then wait until the
        scheduler has handled them."""
        put_messages(self.s.inbox, msgs)  # type: ignore[arg-type]
        self.settle()

    def settle(self) -> None:
        mark = f"{BARRIER}{next(BARRIERS)}"
        self.s.inbox.put(IncomingMessage(mark, "wakeup"))
        while True:
            try:
                msg = self.s.outbox.get(timeout=self.timeout)
            except queue.Empty:
                raise TimeoutError("the scheduler did not answer") from None
            if msg.request_id == mark:
                return
            self.out.setdefault(msg.request_id, []).append(msg)

    def abort(self, rid: str) -> None:
        self.s.abort(rid)  # what the runtime calls on a cancelled request

    def close(self) -> None:
        self.s.stop()
        self.thread.join(timeout=self.timeout)

    def audio(self, rid: str) -> np.ndarray:
        parts = [waveform(m) for m in self.out.get(rid, []) if m.type == "stream"]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def kinds(self, rid: str) -> list[str]:
        return [m.type for m in self.out.get(rid, [])]

    def errors(self, rid: str) -> list[BaseException]:
        return [m.data for m in self.out.get(rid, []) if m.type == "error"]


def run(scheduler, requests: list[Request], payload_first: set[str] = frozenset(), abort_at: dict[str, int] | None = None) -> StageDriver:
    """Step a talker: at each step every started request sends its next chunk (all of a step's
    chunks queued together); after its last chunk a request sends ``stream_done`` and its
    payload (the payload first for ids in ``payload_first``). ``abort_at[id] = k``: abort it
    after its k-th chunk. A request that got an error sends nothing more (the runtime fails it)."""
    d = StageDriver(scheduler)
    abort_at = abort_at or {}
    try:
        step = 0
        while any(r.sent < len(r.sizes) for r in requests):
            msgs = []
            for r in requests:
                if d.errors(r.rid):
                    r.sent = len(r.sizes)  # the runtime fails the request: the talker sends no more
                if r.start > step or r.sent >= len(r.sizes):
                    continue
                msgs.append(r.chunk(r.sent))
                r.sent += 1
                if r.sent == len(r.sizes):
                    msgs.extend([r.payload(), r.done()] if r.rid in payload_first else [r.done(), r.payload()])
            d.send(msgs)
            for rid, k in abort_at.items():
                r = next(x for x in requests if x.rid == rid)
                if r.sent == k:
                    d.abort(rid)
                    r.sent = len(r.sizes)  # nothing more from the talker
            step += 1
    finally:
        d.close()
    return d
