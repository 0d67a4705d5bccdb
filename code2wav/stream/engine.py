"""Streams keyed by request id, decoded together in batched steps.

Contract (delta input): ``open(id, prefix)`` once, with an optional voice-clone reference prefix
``[P, 16]``; each ``push`` carries only newly generated frames ``[n, 16]`` and returns exactly
their ``n * 1920`` samples; ``finish`` decodes what it is given and frees the stream; ``abort``
frees it at once. Concatenated output equals ``forward(prefix + frames)[P * 1920:]``.

Batching choice: a step pads every row to the step's largest chunk and passes per-row valid
counts. Causality makes the padding harmless, and histories are cut at each row's own valid
length, so rows of any size (cold, growing, rolling) share one step and one tensor shape per
(batch, frames) pair, which is what CUDA graphs replay. Grouping by size would multiply steps.

A reference prefix is validated at ``open`` and prefilled at the stream's first step, in one
batch with every other stream waiting for its prefill (see ``_prefill``).

Modes: ``exact`` keeps per-layer state (this project); ``windowed`` re-decodes 72 frames of left
context plus the new frames with the plain forward (inexact; what vLLM-Omni did before its cached
decode); ``full`` re-decodes everything so far. The last two exist as benchmark baselines.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import numpy as np
import torch
from torch import Tensor

from code2wav.codes import CodesError, as_frames
from code2wav.model.decoder import Decoder
from code2wav.kernels.history import window
from code2wav.stream.pool import PoolFull, StatePool, empty_step, packed_inputs

Mode = Literal["exact", "windowed", "full"]
OnReady = Callable[[str, "Tensor | Exception"], None]  # (request id, its audio or error)
MODES: tuple[str, ...] = ("exact", "windowed", "full")
# StreamEngine(first_chunk_wait=...), see there. H200, c=64 / 256 without a prefix: +2-14 %
# throughput for one more forward of waiting (~10 ms) on a first packet, only while the device is
# saturated; no gain measured with a 72-frame prefix (BENCHMARKS.md, eighth round).
FIRST_CHUNK_WAIT_S = 0.005


class StreamError(ValueError):
    """A request-level error; ``code`` is machine-readable, the message names the stream."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class _Stream:
    request_id: str
    slot: int
    last_active: float = field(default_factory=time.monotonic)
    history: list[Tensor] = field(default_factory=list)  # codes, baselines only
    prefix: Tensor | None = None  # exact mode: reference frames not prefilled yet (next step does it)
    started: bool = False  # a chunk of it has joined a step


@dataclass
class _Row:
    """One chunk of one stream inside a step: its frames, how many are launched, audio pieces."""

    stream: _Stream
    frames: Tensor
    first: bool = False  # the stream's first chunk: nothing of it is playing yet
    gathers: bool = False  # a first chunk that may wait for others (see StreamEngine.first_chunk_wait)
    admitted: float = field(default_factory=time.monotonic)  # joined a step (first chunks gather by it)
    done: int = 0
    pieces: list[tuple[Tensor, int]] = field(default_factory=list)  # (padded audio row, valid samples)

    def next_piece(self, piece: int) -> int:
        """Frames of this row's next launch: what is left, at most ``piece``."""
        return min(self.frames.shape[0] - self.done, piece)


@dataclass
class _Staged:
    """A group's host inputs: codes [B, Q, T], slots [B], n_new [B] as views of one buffer
    (``packed_inputs``), and numpy views of the same memory to write them with."""

    shape: tuple[int, int]
    codes: Tensor
    slots: Tensor
    n_new: Tensor
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray]

    @classmethod
    def new(cls, b: int, t: int, scratch_slot: int, q: int, pin: bool) -> "_Staged":
        _, codes, slots, n_new = packed_inputs(b, t, scratch_slot, pin_memory=pin, q=q)
        return cls((b, t), codes, slots, n_new, (codes.numpy(), slots.numpy(), n_new.numpy()))


class StreamEngine:
    """Synchronous batched streaming decoder (eager; the GPU engine adds graphs and a loop)."""

    def __init__(
        self,
        model: Decoder,
        max_streams: int = 64,
        mode: Mode = "exact",
        max_step_frames: int = 64,
        max_batch_frames: int = 1024,
        idle_timeout: float | None = None,
        max_prefix_frames: int = 4096,
        group_by_size: bool = True,
        split_lone_group: bool = False,
        first_chunk_wait: float = FIRST_CHUNK_WAIT_S,
        first_chunk_rows: int = 16,
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.model = model
        self.cfg = model.config
        self.mode = mode
        self.max_step_frames = max_step_frames
        self.max_batch_frames = max(max_batch_frames, max_step_frames)
        self.idle_timeout = idle_timeout
        self.max_prefix_frames = max_prefix_frames
        # Groups of one size class each: a 1-frame first chunk is not padded to a 25-frame row's
        # length. Measured on the H200: +9 % throughput and half the first-packet time at c=256.
        self.group_by_size = group_by_size
        # With nothing on the GPU, a group that takes every ready row leaves the GPU idle while
        # its audio is delivered and its streams push again; as two halves, the second runs
        # meanwhile. Off: on an H200 it gave +2 % at c=16, within the spread between runs
        # (BENCHMARKS.md, sixth round; bench --split-lone-group is the A/B).
        self.split_lone_group = split_lone_group
        # First chunks gather: while the device is saturated (more rows of playing streams wait
        # than the next forward holds), a first chunk waits up to ``first_chunk_wait`` seconds
        # (or until ``first_chunk_rows`` of them wait) so that they share one forward, instead of
        # one ~1 ms forward each for a few frames of audio displacing a full one. Below saturation
        # a first chunk runs in the next forward: the device has room, waiting would buy nothing.
        # Streams opened with a reference prefix do not wait: their prefill already batches them
        # (on an H200 waiting cost them 3-9 % at 64-256 streams; BENCHMARKS.md, eighth round).
        self.first_chunk_wait = first_chunk_wait
        self.first_chunk_rows = first_chunk_rows
        p = next(model.parameters())
        self.device, self.dtype = p.device, model.dtype  # the audio's dtype (the conv stack's)
        self.pool = StatePool(model, max_streams) if mode == "exact" else None
        self.max_streams = max_streams
        self._streams: dict[str, _Stream] = {}
        self._free_slots = list(range(max_streams - 1, -1, -1))  # baselines: slots only count streams
        self._ended: OrderedDict[str, str] = OrderedDict()  # recently ended id -> "finished"/"aborted"
        self.back_context = model.back_context_frames()
        # Pad eager prefill batches to bucketed shapes: with cuDNN autotune (on for CUDA) every
        # new shape is timed once, so the set of shapes must stay small.
        self.bucket_prefill = self.device.type == "cuda"
        # (codes [B, Q, T] cpu, slots [B], n_new [B]) -> audio [B, T * spf]; a graph runner
        # replaces it on GPU.
        self.runner = self._run_eager
        self.on_group: list[Callable[[float, int, int], None]] = []  # (seconds of one batched forward, rows, padded frames a row)
        # open/finish/abort may come from another thread than the one running steps (the async
        # engine opens on its event loop while a continuous step runs on its worker).
        self._lock = threading.RLock()
        # Host inputs of graph-shaped groups, reused once their group has landed (its copy up is
        # done): allocating pinned memory and building views per group cost more host time on
        # a first packet's path than writing the inputs. Likewise the timing events.
        self._staged: dict[tuple[int, int], list[_Staged]] = {}
        self._events: list[Any] = []

    # -- lifecycle --------------------------------------------------------------------------------

    @property
    def active(self) -> int:
        return len(self._streams)

    def is_open(self, request_id: str) -> bool:
        """Whether the stream is open (not finished, aborted or reaped for idling)."""
        return request_id in self._streams

    def open(self, request_id: str, prefix: object = None) -> None:
        """Start a stream; ``prefix`` is ``[P, 16]`` reference codes (P may be 0) or None."""
        with self._lock:
            self.reap_idle()
            if not isinstance(request_id, str) or not request_id:
                raise StreamError("bad_request_id", f"request id must be a non-empty string, got {request_id!r}")
            if request_id in self._streams:
                raise StreamError("duplicate_request_id", f"stream {request_id!r} is already open")
            pre = self._frames(prefix, f"stream {request_id!r} prefix", allow_empty=True) if prefix is not None else None
            if pre is not None and pre.shape[0] > self.max_prefix_frames:
                raise StreamError("prefix_too_long", f"stream {request_id!r} prefix has {pre.shape[0]} frames, limit {self.max_prefix_frames}")
            if self.pool is not None:
                try:
                    slot = self.pool.acquire()
                except PoolFull as e:
                    raise PoolFull(f"cannot open stream {request_id!r}: {e}") from None
            else:
                if not self._free_slots:
                    raise PoolFull(f"cannot open stream {request_id!r}: all {self.max_streams} stream slots are in use")
                slot = self._free_slots.pop()
            st = _Stream(request_id, slot)
            self._streams[request_id] = st
            self._ended.pop(request_id, None)
            if pre is not None and pre.shape[0]:
                if self.pool is not None:
                    st.prefix = pre  # prefilled with every other waiting stream at its first step
                else:
                    st.history.append(pre)

    def push(self, request_id: str, frames: object) -> Tensor:
        """Decode one stream's new frames; returns their audio (``n * 1920`` samples)."""
        out = self.step({request_id: frames})[request_id]
        if isinstance(out, Exception):
            raise out
        return out

    def finish(self, request_id: str, frames: object = None) -> Tensor:
        """Decode the last frames (if any) and free the stream. Nothing is held back: the decoder
        has no lookahead, so every pushed frame was already returned in full."""
        self._get(request_id)
        audio = torch.zeros(0, dtype=self.dtype)
        has_frames = frames is not None and not (hasattr(frames, "__len__") and len(frames) == 0)  # type: ignore[arg-type]
        try:
            if has_frames:
                audio = self.push(request_id, frames)
        finally:
            with self._lock:
                if request_id in self._streams:
                    self._release(self._streams[request_id], "finished")
        return audio

    def abort(self, request_id: str) -> None:
        """Free the stream's state at once (client gone, request cancelled). Safe while a step
        runs on another thread: a row of the stream not yet launched is dropped, and the slot
        is zeroed before anyone else's first pass over it."""
        with self._lock:
            self._release(self._get(request_id), "aborted")

    def reap_idle(self, now: float | None = None) -> list[str]:
        """Abort streams idle longer than ``idle_timeout``; returns their ids."""
        if self.idle_timeout is None:
            return []
        now = time.monotonic() if now is None else now
        with self._lock:
            stale = [rid for rid, s in self._streams.items() if now - s.last_active > self.idle_timeout]
            for rid in stale:
                self._release(self._streams[rid], "timed out")
        return stale

    def zero_released(self) -> None:
        """Zero the state of slots given back since the last step (a step does it anyway before
        its first forward; run it on the stepping thread when idle, off the next first packet)."""
        if self.pool is not None and self.pool.has_stale:  # read without the lock: set only under it
            with self._lock:
                self.pool.reset_stale()

    def state_bytes(self) -> dict[str, int]:
        if self.pool is None:
            return {"per_stream": 0, "pool": 0}
        return {"per_stream": self.pool.bytes_per_stream, "pool": self.pool.nbytes}

    # -- the batched step -------------------------------------------------------------------------

    def step(
        self, chunks: Mapping[str, object], on_ready: OnReady | None = None, more: Callable[[], Mapping[str, object]] | None = None
    ) -> dict[str, Tensor | Exception]:
        """Decode new frames of many streams in batched forwards (groups under the frame budget).

        Returns, per request id, its audio or the error that rejected that row alone. A bad row
        never shifts another row's output: rows are matched by id, not by position.
        ``on_ready(request_id, audio or error)`` is called for each row as soon as its audio is
        on the host, which in a step of several groups is before the step ends.

        ``more()`` makes the step continuous: it is asked for new chunks before every group, and
        what it returns joins the next group, so a stream whose audio just landed (or a new
        stream) waits one group, not for the rest of the step; the step ends when nothing is
        left. A stream may appear in several of those chunks; its rows run in the order given.
        With ``more`` every result goes through ``on_ready`` and none is kept (a step may last
        as long as the load does)."""
        results: dict[str, Tensor | Exception] = {}
        keep = more is None

        def deliver(st: _Stream | None, rid: str, res: Tensor | Exception) -> None:
            if st is not None:
                st.last_active = time.monotonic()
                if self._streams.get(rid) is not st:  # ended while its row ran (abort, reaper)
                    res = StreamError("stream_ended", f"stream {rid!r} ended while its chunk was decoding")
                elif self.dtype == torch.float16 and isinstance(res, Tensor) and not bool(torch.isfinite(res).all()):
                    # float16 overflowed somewhere in this row: its state holds inf/NaN now, so
                    # every later chunk would be noise. End this stream only (rows are independent).
                    self._release(st, "aborted")
                    res = StreamError(
                        "non_finite_audio", f"stream {rid!r}: the decoder produced non-finite samples (float16 overflow); the stream is ended"
                    )
            if keep:
                results[rid] = res
            if on_ready is not None:
                on_ready(rid, res)

        self.reap_idle()
        admit = lambda c: self._admit(c, lambda rid, e: deliver(None, rid, e))  # noqa: E731
        rows = admit(chunks)
        if self.mode == "exact":
            self._decode_exact(rows, deliver, (lambda: admit(more())) if more is not None else None)
        elif rows:
            for row, audio in zip(rows, self._decode_baseline([(r.stream, r.frames) for r in rows])):
                deliver(row.stream, row.stream.request_id, audio)
        return {rid: results[rid] for rid in chunks} if keep else {}

    def _admit(self, chunks: Mapping[str, object], refuse: Callable[[str, Exception], None]) -> "list[_Row]":
        """Validate chunks into rows (a stream's first row is marked ``first``); zero the slots
        given back since the last admission; prefill the streams that still wait for their
        reference prefix (one batch). A rejected row goes to ``refuse`` alone."""
        rows: list[_Row] = []
        if not chunks:  # the continuous step asks before every group; usually nothing came
            return rows
        with self._lock:
            for rid, payload in chunks.items():
                try:
                    st = self._get(rid)
                    first = not st.started
                    # A stream with a reference prefix is prefilled with the others joining now,
                    # and their first chunks run together anyway: its first chunk does not wait.
                    rows.append(_Row(st, self._frames(payload, f"stream {rid!r}"), first=first, gathers=first and st.prefix is None))
                    st.started = True
                except (StreamError, CodesError) as e:
                    refuse(rid, e)
            self.zero_released()
        waiting = list({id(r.stream): r.stream for r in rows if r.stream.prefix is not None}.values())
        if waiting:
            try:
                self._prefill(waiting)
            except BaseException as e:  # their state is half written: those streams end here
                with self._lock:
                    for st in waiting:
                        if self._streams.get(st.request_id) is st:
                            self._release(st, "aborted")
                for st in waiting:
                    refuse(st.request_id, StreamError("prefill_failed", f"stream {st.request_id!r}: reference prefix failed: {e}"))
                if not isinstance(e, Exception):
                    raise
                rows = [r for r in rows if r.stream not in waiting]
        return rows

    @torch.no_grad()
    def _decode_exact(
        self, rows: "list[_Row]", deliver: Callable[["_Stream", str, "Tensor | Exception"], None], more: "Callable[[], list[_Row]] | None"
    ) -> None:
        """Rows are queued and taken in order, in pieces of at most ``max_step_frames``, into
        groups of at most ``max_batch_frames`` padded frames (and what the runner holds); a row
        with frames left goes back to the queue's front after each piece, so each stream's rows
        run in order.

        On CUDA the groups are pipelined: inputs go up from pinned memory and audio comes down
        into pinned memory asynchronously, in stream order (a pageable copy would synchronise
        the stream on every group, leaving the GPU idle while Python assembles the next one; a
        graph's output buffer is only valid until its next replay, which the in-order copy
        respects). One group runs while the next is queued; each group's finished rows are
        delivered as soon as its copy lands, and ``more`` is asked for new rows in between."""
        spf = self.cfg.samples_per_frame
        pin = self.device.type == "cuda"
        stream = torch.cuda.current_stream(self.device) if pin else None  # looked up once: events record on it
        piece = min(self.max_step_frames, getattr(self.runner, "max_frames", None) or self.max_step_frames)
        padded_shape = getattr(self.runner, "padded_shape", None)  # a graph runner's bucket for a group
        queue: deque[_Row] = deque()

        def enqueue(new: list[_Row]) -> None:
            # First chunks go to the front: a stream with nothing playing waits for one group,
            # while streams already playing have their last chunk's audio (seconds of it) in
            # hand. The same work in another order: throughput is unchanged.
            queue.extendleft(reversed([r for r in new if r.first]))
            queue.extend(r for r in new if not r.first)

        enqueue(rows)
        landed: deque[tuple[Any, Any, list[_Row], int, _Staged]] = deque()  # (copy done, start, rows it completes, rows in it, inputs)
        halved = False  # the last group was the first half of a split one: the second half runs whole

        def land() -> None:
            end, start, complete, n, staged = landed.popleft()
            if pin:
                end.synchronize()
            # Audio first: handing a row over wakes its caller's thread, which then runs while
            # this one does the bookkeeping below.
            for row in complete:  # a one-piece row (the usual case) is a view: no copy
                audio = row.pieces[0][0][: row.pieces[0][1]] if len(row.pieces) == 1 else torch.cat([w[:k] for w, k in row.pieces])
                row.pieces = []
                deliver(row.stream, row.stream.request_id, audio)
            if pin:
                seconds = start.elapsed_time(end) / 1e3
                self._events += (start, end)
            else:
                seconds = end - start
            if padded_shape is not None and padded_shape(*staged.shape) == staged.shape:  # a graph's shape: few, so kept
                self._staged.setdefault(staged.shape, []).append(staged)
            for hook in self.on_group:
                hook(seconds, n, staged.shape[1])

        while True:
            if more is not None:
                enqueue(more())
            if not queue and not landed:
                break
            group, full = self._next_group(queue, piece, deliver, self._gathering(queue, piece))
            split = self.split_lone_group and not landed and not halved and len(group) > 1 and not full
            if split:  # the group took every ready row it could (the budget did not cut it)
                h = (len(group) + 1) // 2
                queue.extendleft(reversed(group[h:]))  # at the front: each stream's order holds
                group = group[:h]
            halved = split
            if group:
                n = [r.next_piece(piece) for r in group]
                staged = self._stage(group, n, padded_shape, pin)
                if pin:
                    start, end = (self._events.pop() if self._events else torch.cuda.Event(enable_timing=True) for _ in range(2))
                    start.record(stream)
                else:
                    start = time.perf_counter()
                wav = self.runner(staged.codes, staged.slots, staged.n_new)[: len(group), : max(n) * spf]
                if pin:
                    wav = torch.empty(wav.shape, dtype=wav.dtype, pin_memory=True).copy_(wav, non_blocking=True)
                    end.record(stream)
                else:
                    end = time.perf_counter()
                complete, left = [], []
                for j, (r, k) in enumerate(zip(group, n)):
                    r.pieces.append((wav[j], k * spf))
                    r.done += k
                    (complete if r.done == r.frames.shape[0] else left).append(r)
                queue.extendleft(reversed(left))  # next pieces first: ahead of their streams' later rows
                landed.append((end, start, complete, len(group), staged))
            # On CUDA one group stays queued on the GPU while the one before it is delivered.
            if landed and (not pin or len(landed) > 1 or not group):
                land()

    def _stage(self, group: "list[_Row]", n: list[int], padded_shape: "Callable[[int, int], tuple[int, int] | None] | None",
               pin: bool) -> _Staged:
        """A group's inputs on the host (pinned on CUDA, so they go up asynchronously), written
        with numpy (a torch op per row costs more host time than the copy). At the runner's
        padded shape where it has one (a graph's: then the buffer goes up as it is, and is
        reused); padding rows are scratch rows with no new frames, padding frames are zero codes
        the causal step never lets into a real sample."""
        assert self.pool is not None
        b, t = len(group), max(n)
        b, t = (padded_shape(b, t) if padded_shape is not None else None) or (b, t)
        free = self._staged.get((b, t))
        reused = bool(free)
        staged = free.pop() if free else _Staged.new(b, t, self.pool.scratch_slot, self.cfg.num_quantizers, pin)
        codes, slots, n_new = staged.arrays
        if reused:
            empty_step(codes, slots, n_new, self.pool.scratch_slot)
        for j, (r, k) in enumerate(zip(group, n)):
            codes[j, :, :k] = r.frames.numpy()[r.done : r.done + k].T
        slots[: len(group)] = [r.stream.slot for r in group]
        n_new[: len(group)] = n
        return staged

    def _gathering(self, queue: "deque[_Row]", piece: int) -> set[int]:
        """Slots of the first chunks at the queue's head that wait for more to join them (see
        ``first_chunk_wait``): none once enough wait, once the oldest has waited long enough, or
        unless other streams' rows fill the next forward and more wait behind it."""
        if self.first_chunk_wait <= 0 or len(queue) < 2 or not queue[0].gathers:  # one row cannot saturate
            return set()
        firsts = list(itertools.takewhile(lambda r: r.gathers, queue))
        if len(firsts) >= self.first_chunk_rows or time.monotonic() - min(r.admitted for r in firsts) >= self.first_chunk_wait:
            return set()
        held = {r.stream.slot for r in firsts}
        others, room = 0, 0  # rows of other streams; what the next forward holds (read at the first)
        for r in itertools.islice(queue, len(firsts), None):  # stops after ~one forward's rows
            if r.stream.slot not in held:
                room = room or self._max_rows(r.next_piece(piece))
                others += 1
                if others > room:
                    return held
        return set()

    def _next_group(self, queue: "deque[_Row]", piece: int, deliver: Callable[["_Stream", str, "Tensor | Exception"], None],
                    held: set[int] = frozenset()) -> "tuple[list[_Row], bool]":  # type: ignore[assignment]
        """The next group from the queue's head, and whether the budget cut it (a row that could
        have joined was left for lack of room): as many rows as the runner (or the frame
        budget) holds at their largest piece, one row per stream, streams ended meanwhile
        dropped. With ``group_by_size`` only rows whose piece is in the head's size class (the
        same power of two) join; the others keep their places (and block their streams' later
        rows, so each stream's order holds): a 1-frame first chunk is then not padded to 25.
        Rows of ``held`` slots (first chunks gathering) keep their places too."""
        group: list[_Row] = []
        slots: set[int] = set()
        passed: list[_Row] = []  # left in the queue, in order
        size_class, widest, full = None, 0, False
        while queue:
            r = queue.popleft()
            if self._streams.get(r.stream.request_id) is not r.stream:  # aborted: its slot may be someone else's now
                deliver(r.stream, r.stream.request_id, StreamError("stream_ended", f"stream {r.stream.request_id!r} ended while its chunk was queued"))
                continue
            if r.stream.slot in held:
                passed.append(r)
                continue
            n = r.next_piece(piece)
            other_class = self.group_by_size and size_class is not None and _bucket(n) != size_class
            if r.stream.slot in slots or other_class:
                if not self.group_by_size:  # the same stream's next rows wait for this one's
                    queue.appendleft(r)
                    break
                passed.append(r)
                slots.add(r.stream.slot)
                continue
            if group and len(group) + 1 > self._max_rows(max(widest, n)):
                queue.appendleft(r)
                full = True
                break
            group.append(r)
            slots.add(r.stream.slot)
            size_class, widest = _bucket(n), max(widest, n)
        queue.extendleft(reversed(passed))
        return group, full

    def _eager_max_rows(self, frames: int) -> int:
        return max(1, self.max_batch_frames // frames)

    def _max_rows(self, frames: int) -> int:
        """Rows one step may hold at this many frames: what the runner replays without falling
        back (graph buckets), else the eager frame budget."""
        limit = getattr(self.runner, "max_rows", None)
        return (limit(frames) if limit else None) or self._eager_max_rows(frames)

    def _run_eager(self, codes: Tensor, slots: Tensor, n_new: Tensor) -> Tensor:
        assert self.pool is not None
        return self.pool.run(self.model, codes, slots, n_new)

    def prefill_shapes(self) -> list[tuple[str, int, int]]:
        """Every (pass, rows, frames) shape ``_prefill`` runs on CUDA, where rows and frames are
        bucketed: what a graph runner captures so that no request pays for a new shape."""
        K, group_rows = self.back_context, self._prefill_rows()
        rows = [1 << i for i in range(group_rows.bit_length())]
        return [("front", b, self.max_step_frames) for b in rows] + [("back", b, K) for b in rows]

    def _prefill_rows(self) -> int:
        return min(_bucket(max(1, self.max_batch_frames // max(self.back_context, 1)), floor=True), _bucket(self.max_streams))

    def _up(self, values: list[int]) -> Tensor:
        """Small index tensors to the device without stalling it: a pageable copy would wait
        for every queued group (a prefill joins a running step between groups)."""
        t = torch.tensor(values)
        return t.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else t

    def _pass(self, kind: str, x: Tensor, slots: Tensor, n_new: Tensor) -> Tensor:
        """``pool.front`` / ``pool.back`` through the runner's graphs where it has one."""
        graphs = getattr(self.runner, "prefill", None)
        out = graphs(kind, x, slots, n_new) if graphs is not None else None
        return out if out is not None else getattr(self.pool, kind)(self.model, x, slots, n_new)

    @torch.no_grad()
    def _prefill(self, streams: list[_Stream]) -> None:
        """Build the state of streams opened with a reference prefix, all in one batch: the
        transformer over each whole prefix (its KV depends on all of it), then the conv stack over
        only each prefix's last ``back_context`` frames, which is enough to make its state exact.

        Deferred from ``open`` to the stream's first step so that streams opening together share
        these passes instead of queueing one prefill each. On CUDA, rows and frames are padded to
        the shapes of ``prefill_shapes`` (scratch rows, causal padding), which a graph runner has
        captured."""
        assert self.pool is not None
        K = self.back_context
        group_rows = self._prefill_rows()
        for g in range(0, len(streams), group_rows):
            group = streams[g : g + group_rows]
            prefixes = [st.prefix for st in group]
            for st in group:
                st.prefix = None
            B = _bucket(len(group)) if self.bucket_prefill else len(group)
            lengths = [p.shape[0] for p in prefixes] + [0] * (B - len(group))
            slots = self._up([st.slot for st in group] + [self.pool.scratch_slot] * (B - len(group)))
            hidden, done, longest = [], 0, max(lengths)
            while done < longest:
                t = min(self.max_step_frames, longest - done)
                codes = torch.zeros(B, self.cfg.num_quantizers, self.max_step_frames if self.bucket_prefill else t, dtype=torch.long,
                                    pin_memory=self.device.type == "cuda")
                n = [min(max(P - done, 0), t) for P in lengths]
                for b, p in enumerate(prefixes):
                    codes[b, :, : n[b]] = p[done : done + n[b]].T
                hidden.append(self._pass("front", codes, slots, self._up(n))[..., :t])
                done += t
            h = torch.cat(hidden, dim=-1)
            if h.shape[-1] < K:  # every prefix is shorter than the horizon: pad (causal, unread)
                h = torch.nn.functional.pad(h, (0, K - h.shape[-1]))
            tail_n = self._up([min(P, K) for P in lengths])
            starts = self._up([P - min(P, K) for P in lengths])
            tail = window(h, starts, K, dim=-1)  # row b: its last min(P_b, K) frames, left-aligned
            self._pass("back", tail, slots, tail_n)

    def _decode_baseline(self, rows: list[tuple[_Stream, Tensor]]) -> list[Tensor]:
        """``windowed``/``full``: the plain forward over (context + new), right-padded batch,
        grouped under the same ``max_batch_frames`` budget as the exact path."""
        spf = self.cfg.samples_per_frame
        seqs, ctx = [], []
        for st, fr in rows:
            past = torch.cat(st.history) if st.history else fr[:0]
            if self.mode == "windowed":
                past = past[-self.cfg.sliding_window :]
            seqs.append(torch.cat([past, fr]))
            ctx.append(past.shape[0])
            keep = seqs[-1][-self.cfg.sliding_window :] if self.mode == "windowed" else seqs[-1]
            st.history = [keep]
        out: list[Tensor] = [fr[:0] for _, fr in rows]
        lengths = {j: s.shape[0] for j, s in enumerate(seqs)}
        for group in _groups(list(lengths), lengths, self._eager_max_rows):
            L = max(lengths[j] for j in group)
            codes = torch.zeros(len(group), self.cfg.num_quantizers, L, dtype=torch.long)
            for k, j in enumerate(group):
                codes[k, :, : lengths[j]] = seqs[j].T
            wav = self.model(codes.to(self.device))[:, 0].cpu()
            for k, j in enumerate(group):
                out[j] = wav[k, ctx[j] * spf : lengths[j] * spf]
        return out

    # -- helpers ----------------------------------------------------------------------------------

    def _frames(self, payload: object, what: str, allow_empty: bool = False) -> Tensor:
        return as_frames(payload, self.cfg.num_quantizers, self.cfg.codebook_size, what, allow_empty)

    def _get(self, request_id: str) -> _Stream:
        st = self._streams.get(request_id)
        if st is None:
            how = self._ended.get(request_id)
            if how is not None:
                raise StreamError("stream_ended", f"stream {request_id!r} already {how}")
            raise StreamError("unknown_request_id", f"no open stream {request_id!r}")
        return st

    def _release(self, st: _Stream, how: str) -> None:
        with self._lock:
            del self._streams[st.request_id]
            if self.pool is not None:
                self.pool.release(st.slot)
            else:
                self._free_slots.append(st.slot)
            self._ended[st.request_id] = how
            while len(self._ended) > 4096:
                self._ended.popitem(last=False)


def _bucket(n: int, floor: bool = False) -> int:
    """``n`` rounded to a power of two (up, or down with ``floor``)."""
    p = 1 << (n - 1).bit_length()
    return p // 2 if floor and p > n else p


def _groups(rows: list[int], take: dict[int, int], max_rows: Callable[[int], int]) -> list[list[int]]:
    """Split rows (in order) so that each group holds at most ``max_rows(its largest chunk)``."""
    groups: list[list[int]] = []
    cur: list[int] = []
    for i in rows:
        if cur and len(cur) + 1 > max_rows(max(take[i], *(take[j] for j in cur))):
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    return groups
