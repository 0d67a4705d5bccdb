"""The exact streaming engine: streams with per-layer state, decoded together in batched steps.

Concatenated output equals ``forward(prefix + frames)[P * 1920:]`` for any chunk schedule.

Batching choice: a step pads every row to the step's largest piece and passes per-row valid
counts. Causality makes the padding harmless, and histories are cut at each row's own valid
length, so rows of any size (cold, growing, rolling) share one step and one tensor shape per
(rows, frames) pair, which is what CUDA graphs replay. Which rows share a step is the
scheduler's policy (``stream/schedule.py``); what runs a step on the device is the runner
(``stream/runner.py``); a reference prefix is prefilled at the stream's first step, in one batch
with every other stream waiting for its prefill (``stream/prefill.py``).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from code2wav.audio import quantize16
from code2wav.codes import CodesError
from code2wav.model.decoder import Decoder
from code2wav.stream.lifecycle import Lifecycle
from code2wav.stream.order import SlotOrder
from code2wav.stream.pool import StatePool
from code2wav.stream.prefill import Prefill
from code2wav.stream.prefix_cache import PrefixCache
from code2wav.stream.rows import OnReady, Result, Row, Stream, StreamError
from code2wav.stream.runner import EagerRunner, Runner
from code2wav.stream.schedule import Group, SchedulePolicy, Scheduler
from code2wav.stream.staging import Staged, Stager

Deliver = Callable[["Stream | None", str, Result], None]
# A row whose audio holds a NaN (a float16 overflow): ``deliver`` ends its stream.
NON_FINITE = ArithmeticError("non-finite audio")


class StreamEngine(Lifecycle):
    """Synchronous batched streaming decoder. ``runner`` (default: eager over a new pool of
    ``max_streams`` slots) runs each step; a graph runner replays CUDA graphs."""

    def __init__(
        self,
        model: Decoder,
        max_streams: int | None = None,
        runner: Runner | None = None,
        max_step_frames: int = 64,
        max_batch_frames: int = 1024,
        idle_timeout: float | None = None,
        max_prefix_frames: int = 4096,
        policy: SchedulePolicy | None = None,
        bucket_prefill: bool | None = None,
        prefix_cache_bytes: int = 0,
        restores_in_step: bool = False,
    ):
        if runner is None:
            runner = EagerRunner(model, StatePool(model, 64 if max_streams is None else max_streams))
        elif max_streams is not None and max_streams != runner.pool.max_streams:
            raise ValueError(f"max_streams={max_streams} but the runner's pool has {runner.pool.max_streams} slots")
        super().__init__(model, runner.pool.max_streams, idle_timeout, max_prefix_frames)
        self.runner = runner
        self.pool: StatePool = runner.pool
        self.max_step_frames = max_step_frames
        self.max_batch_frames = max(max_batch_frames, max_step_frames)
        self.scheduler = Scheduler(policy or SchedulePolicy(), self._piece(), self._max_rows)
        self.prefill = Prefill(runner, max_step_frames, self.max_batch_frames,
                               bucket=self.device.type == "cuda" if bucket_prefill is None else bucket_prefill,
                               cache=PrefixCache(prefix_cache_bytes, model.config.codebook_size) if prefix_cache_bytes else None,
                               in_step=restores_in_step and prefix_cache_bytes > 0)
        self.stager = Stager(runner.padded_shape, self.pool.scratch_slot, self.cfg.num_quantizers, pin=self.device.type == "cuda",
                             restores_in_step=self.prefill.in_step)
        self._events: list[Any] = []  # CUDA timing events, reused once their step has landed
        self._order = SlotOrder()  # each slot's last work, where the runner has a second (priority) stream
        self._opened: dict[str, Stream] = {}  # found in the prefix cache at open, not in their slots yet (restore_opened)
        # float16 (the conv stack's or the low-rate stages') can overflow where bfloat16 and
        # float32 cannot: each row's audio is then checked on the step's device (_outputs).
        self.overflows = torch.float16 in (model.dtype, model.low_rate_dtype)

    @property
    def policy(self) -> SchedulePolicy:
        return self.scheduler.policy

    @policy.setter
    def policy(self, policy: SchedulePolicy) -> None:
        """Between decodes (e.g. the bench's A/B of the first-chunk wait on one engine)."""
        self.scheduler.policy = policy

    def prefill_shapes(self) -> list[tuple[str, int, int]]:
        """The prefill passes' shapes on CUDA: what a graph runner captures at start."""
        return self.prefill.shapes()

    # -- slots and prefixes (Lifecycle) -------------------------------------------------------------

    def _take_slot(self) -> int:
        return self.pool.acquire()

    def _give_slot(self, slot: int) -> None:
        self.pool.release(slot)

    def _keep_prefix(self, st: Stream, prefix: Tensor) -> None:
        st.prefix = prefix  # prefilled with every other waiting stream at its first step
        if self.prefill.cache is not None:  # unless cached: looked up now (host work, off the first packet)
            st.cached = self.prefill.cache.get(prefix, count_miss=False)
            if st.cached is not None and self.prefill.in_step:
                st.prefix = None  # nothing left for the admission: its first step writes the state in (Stager)
            elif st.cached is not None:
                self._opened[st.request_id] = st  # restore_opened may write it in before its first step

    def _release(self, st: Stream, how: str) -> None:
        with self._lock:
            super()._release(st, how)
            self._opened.pop(st.request_id, None)  # only open streams are there: this one, if any
            st.cached = None  # a state found at open and never written in is not held past its end

    def restore_opened(self) -> None:
        """Start each stream opened with a cached prefix since the last call from that state now,
        on the stepping thread while idle (the async engine's worker after an open). A prefix not
        found at open is looked up again at its first chunk, then prefilled (a miss counted there)."""
        if not self._opened:  # read without the lock: set only under it
            return
        with self._lock:
            opened = list(self._opened.values())
            self._opened.clear()
            self.zero_released()  # a slot given back is zeroed before its new owner's state goes in
            with self._before_first_step([st.slot for st in opened]):
                for st in opened:
                    self.prefill.restore(st)

    @property
    def slots_in_use(self) -> int:
        return self.pool.in_use

    def zero_released(self) -> None:
        """Zero the state of slots given back since the last step (a step does it anyway before
        its first forward; run it on the stepping thread when idle, off the next first packet)."""
        if self.pool.has_stale:  # read without the lock: set only under it
            with self._lock, self._before_first_step(self.pool.stale):
                self.pool.reset_stale()

    @contextlib.contextmanager
    def _before_first_step(self, slots: Any):
        """Device work on new streams' ``slots`` (zeroing, a restore): on the priority stream
        where there is one (a new stream's first step runs there, and need not wait behind the
        large steps queued on the main one), ordered after the slots' last work (``_ordered``)."""
        priority = self.runner.priority_stream
        with torch.cuda.stream(priority) if priority is not None else _SAME, self._ordered(slots, priority):
            yield

    def _ordered(self, slots: Any, stream: Any = None):
        """Device work on ``slots`` queued on ``stream`` (default: the current one) inside the
        block, ordered across the runner's two streams where it has a priority one (SlotOrder)."""
        if self.runner.priority_stream is None:
            return _SAME
        return self._order.ordered(slots, stream or torch.cuda.current_stream(self.device), torch.cuda.Event())

    def state_bytes(self) -> dict[str, int]:
        return {"per_stream": self.pool.bytes_per_stream, "pool": self.pool.nbytes}

    def runner_stats(self) -> dict[str, object] | None:
        return self.runner.stats()

    def prefix_cache_stats(self) -> dict[str, int] | None:
        c = self.prefill.cache  # and how hits went into their slots: a step's restore pairs, or a launch of their own
        return None if c is None else {**c.stats(), "restored_in_step": self.stager.restored_in_step, "restored_alone": self.pool.restored_alone}

    def _piece(self) -> int:
        """The most frames a row launches in one step: the runner's largest (a graph's frames
        bucket), at most ``max_step_frames``; read per decode (a runner may capture later)."""
        return min(self.max_step_frames, self.runner.max_frames or self.max_step_frames)

    def _max_rows(self, frames: int) -> int:
        """Rows one step may hold at this many frames: what the runner replays without falling
        back (graph buckets), else the frame budget."""
        return self.runner.max_rows(frames) or max(1, self.max_batch_frames // frames)

    # -- the batched steps --------------------------------------------------------------------------

    def decode(self, chunks: Mapping[str, object], on_ready: OnReady | None = None,
               more: Callable[[], Mapping[str, object]] | None = None) -> dict[str, Result]:
        """Decode new frames of many streams in batched steps (groups under the frame budget).

        Returns, per request id, its audio or the error that rejected that row alone. A bad row
        never shifts another row's output: rows are matched by id, not by position.
        ``on_ready(request_id, audio or error)`` is called for each row as soon as its audio is
        on the host, which with several steps is before the call returns.

        ``more()`` makes the decode continuous: it is asked for new chunks before every step, and
        what it returns joins the next step, so a stream whose audio just landed (or a new
        stream) waits one step, not for the rest of the call; the call ends when nothing is
        left. A stream may appear in several of those chunks; its rows run in the order given.
        With ``more`` every result goes through ``on_ready`` and none is kept (a call may last
        as long as the load does)."""
        results: dict[str, Result] = {}
        keep = more is None

        def deliver(st: Stream | None, rid: str, res: Result) -> None:
            if st is not None:
                st.last_active = time.monotonic()
                if not self._live(st):  # ended while its row ran (abort, reaper)
                    res = StreamError("stream_ended", f"stream {rid!r} ended while its chunk was decoding")
                elif res is NON_FINITE:
                    # float16 overflowed somewhere in this row: its state holds inf/NaN now, so
                    # every later chunk would be noise. End this stream only (rows are independent).
                    self._release(st, "aborted")
                    res = StreamError("non_finite_audio", f"stream {rid!r}: the decoder produced non-finite samples (float16 overflow); the stream is ended")
            if keep:
                results[rid] = res
            if on_ready is not None:
                on_ready(rid, res)

        self.reap_idle()
        refuse = lambda rid, e: deliver(None, rid, e)  # noqa: E731
        rows = self._admit(chunks, refuse)
        self._run(rows, deliver, (lambda: self._admit(more(), refuse)) if more is not None else None)
        return {rid: results[rid] for rid in chunks} if keep else {}

    def _admit(self, chunks: Mapping[str, object], refuse: Callable[[str, Exception], None]) -> list[Row]:
        """Validate chunks into rows (a stream's first marked ``first``); zero the slots given
        back since the last admission; prefill the streams still waiting for their reference
        prefix (one batch). A rejected row goes to ``refuse`` alone."""
        rows: list[Row] = []
        if not chunks:  # the continuous decode asks before every step; usually nothing came
            return rows
        with self._lock:
            for rid, payload in chunks.items():
                try:
                    st = self._get(rid)
                    if first := not st.started:
                        self._opened.pop(rid, None)  # restore_opened's turn is over
                    rows.append(Row(st, self._frames(payload, f"stream {rid!r}"), first=first, gathers=first))
                    st.started = True
                except (StreamError, CodesError) as e:
                    refuse(rid, e)
            self.zero_released()
        waiting = list({id(r.stream): r.stream for r in rows if r.stream.prefix is not None}.values())
        if waiting:
            try:
                # A stream prefilled now was batched with the others joining now, and their
                # first chunks run together anyway: its first chunk does not wait. (One whose
                # state came from the prefix cache had no prefill: it waits as a fresh one does.)
                with self._ordered([st.slot for st in waiting]):
                    prefilled = {id(st) for st in self.prefill(waiting)}
                for r in rows:
                    if id(r.stream) in prefilled:
                        r.gathers = False
            except BaseException as e:  # their state is half written: those streams end here
                with self._lock:
                    for st in waiting:
                        if self._live(st):
                            self._release(st, "aborted")
                for st in waiting:
                    refuse(st.request_id, StreamError("prefill_failed", f"stream {st.request_id!r}: reference prefix failed: {e}"))
                if not isinstance(e, Exception):
                    raise
                rows = [r for r in rows if r.stream not in waiting]
        return rows

    def _outputs(self, wav: Tensor, group: Group, n_new: Tensor) -> tuple[dict[bool, Tensor], Tensor | None]:
        """A step's audio as its rows take it, keyed by ``pcm16``: float samples, and int16
        ones for ``pcm16`` streams, quantized here on the step's device (one elementwise kernel,
        instead of the host widening and rounding every sample between two steps). Where
        float16 can overflow (``overflows``), also each row's sum over its valid samples: the
        audio is clamped to [-1, 1], so a sum is finite unless the row holds a NaN."""
        outs = {pcm16: quantize16(wav) if pcm16 else wav for pcm16 in {r.stream.pcm16 for r in group.rows}}
        if not self.overflows:
            return outs, None
        if min(group.pieces) != max(group.pieces):  # padded frames are not the row's audio
            valid = n_new[: len(group), None].to(wav.device, non_blocking=True) * self.cfg.samples_per_frame  # pinned: no sync
            wav = wav.masked_fill(torch.arange(wav.shape[1], device=wav.device) >= valid, 0.0)
        return outs, wav.sum(1, dtype=torch.float32)  # float16's own sum of 34+ full-scale frames would overflow

    def _run(self, rows: list[Row], deliver: Deliver, more: Callable[[], list[Row]] | None) -> None:
        """Work through the queue, one step per group, each row's pieces in order.

        On CUDA the steps are pipelined: inputs go up from pinned memory and audio comes down
        into pinned memory asynchronously, in stream order (a pageable copy would synchronise
        the stream on every step, leaving the GPU idle while Python assembles the next one; a
        graph's output buffer is only valid until its next replay, which the in-order copy
        respects). A step runs while the next ones are queued (``SchedulePolicy.steps_ahead``);
        each step's finished rows are delivered as soon as its copy lands, and ``more`` is asked
        for new rows in between. Where the runner has a priority stream, a small step it takes runs
        there while others are in flight, beside them rather than behind them (each slot's work
        kept in order across the two by ``SlotOrder``), and is delivered as soon as it lands."""
        if torch.is_grad_enabled():  # the async engine's worker runs with it off: no context per decode there
            with torch.no_grad():
                return self._run(rows, deliver, more)
        spf = self.cfg.samples_per_frame
        pin = self.device.type == "cuda"
        main = torch.cuda.current_stream(self.device) if pin else None  # looked up once: events record on it
        priority = self.runner.priority_stream
        sched = self.scheduler
        sched.reset(self._piece())
        sched.enqueue(rows)
        landed: deque[_InFlight] = deque()  # in launch order
        dropped = lambda r: deliver(r.stream, r.request_id, StreamError("stream_ended", f"stream {r.request_id!r} ended while its chunk was queued"))  # noqa: E731

        def land(step: _InFlight) -> None:
            landed.remove(step)
            if pin:
                step.end.synchronize()
                if priority is not None:
                    self._order.done(step.slots, step.end)
            if step.sums is not None:  # read once the copy has landed, in one call for every row
                for r, total in zip(step.group.rows, step.sums.tolist()):
                    r.finite = r.finite and math.isfinite(total)
            # Audio first: handing a row over wakes its caller's thread, which then runs while
            # this one does the bookkeeping below.
            for row in step.complete:  # a one-piece row (the usual case) is a view: no copy
                audio = row.pieces[0] if len(row.pieces) == 1 else torch.cat(row.pieces)
                row.pieces = []
                deliver(row.stream, row.request_id, audio if row.finite else NON_FINITE)
            if pin:
                seconds = step.start.elapsed_time(step.end) / 1e3
                self._events += (step.start, step.end)
            else:
                seconds = step.end - step.start
            self.stager.landed(step.staged)
            for hook in self.on_step:
                hook(seconds, len(step.group), step.staged.shape[1])

        while True:
            if more is not None and (new := more()):
                sched.enqueue(new)
            if not sched and not landed:
                break
            group = sched.next_group(self._live, dropped, device_idle=not landed)
            if group:
                staged = self.stager.stage(group)
                slots = [r.slot for r in group.rows]
                if pin:
                    # A priority-pool graph always replays on the priority stream: its static buffers and
                    # its pool's memory are then used by one replay at a time.
                    stream = (self.runner.stream_for(staged.shape) if priority is not None else None) or main
                    start, end = (self._events.pop() if self._events else torch.cuda.Event(enable_timing=True) for _ in range(2))
                    with torch.cuda.stream(stream) if stream is not main else _SAME:
                        if priority is not None:
                            self._order.wait(slots, stream)
                        start.record(stream)
                        wav = self.runner(staged.codes, staged.slots, staged.n_new)[: len(group), : max(group.pieces) * spf]
                        outs, sums = self._outputs(wav, group, staged.n_new)
                        host = lambda w: torch.empty(w.shape, dtype=w.dtype, pin_memory=True).copy_(w, non_blocking=True)  # noqa: E731
                        outs = {k: host(w) for k, w in outs.items()}
                        sums = None if sums is None else host(sums)
                        end.record(stream)
                    if priority is not None:
                        self._order.touched(slots, stream, end)
                else:
                    stream, start = None, time.perf_counter()
                    wav = self.runner(staged.codes, staged.slots, staged.n_new)[: len(group), : max(group.pieces) * spf]
                    outs, sums = self._outputs(wav, group, staged.n_new)
                    end = time.perf_counter()
                complete, left = [], []
                for j, (r, k) in enumerate(zip(group.rows, group.pieces)):
                    r.pieces.append(outs[r.stream.pcm16][j, : k * spf])
                    r.done += k
                    (complete if r.done == r.frames.shape[0] else left).append(r)
                sched.requeue(left)
                landed.append(_InFlight(end, start, complete, group, staged, sums, stream, slots))
            if not pin:
                if landed:
                    land(landed[0])
                continue
            # On CUDA steps stay queued on the GPU (SchedulePolicy.steps_ahead) while the ones
            # before them are delivered. With a priority stream, whatever has finished is delivered
            # first, in launch order (a slot's later step never finishes before its earlier one),
            # and a wait goes to a priority step first: it is short, and a first packet's. (The main
            # queue may then hold a step or two more than steps_ahead for a moment.)
            if priority is not None:
                for step in [st for st in landed if st.end.query()]:
                    land(step)
            on_priority = [st for st in landed if st.stream is priority] if priority is not None else []
            ahead = sched.policy.steps_ahead
            if landed and (len(landed) - len(on_priority) > ahead or len(on_priority) > ahead or not group):
                land(on_priority[0] if on_priority else landed[0])


@dataclass(slots=True, eq=False)  # eq=False: found in ``landed`` by identity, never by comparing tensors
class _InFlight:
    """A step launched and not yet delivered."""

    end: Any  # its copy-done event on CUDA (a time eagerly)
    start: Any
    complete: list[Row]  # the rows it completes
    group: Group
    staged: Staged
    sums: Tensor | None  # each row's sum, where float16 can overflow
    stream: Any  # the CUDA stream it ran on
    slots: list[int]  # its rows' slots


_SAME = contextlib.nullcontext()  # the step runs on the current stream
