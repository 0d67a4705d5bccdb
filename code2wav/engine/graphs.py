"""CUDA-graph replay of the batched streaming step.

A step is captured once per (batch bucket, frames bucket) pair. At run time the real step is
padded up to the smallest bucket that holds it: extra frames are causal padding (discarded),
extra rows point at the pool's scratch slot with zero new frames. State is gathered and
scattered in place inside the graph, so a replay is the whole step. Steps no graph holds run
eagerly (the :class:`EagerRunner` it extends), in the instant forms (kernels/instant.py: such a
shape may be new to this process, and the fast forms' first run at a new shape costs seconds),
and the reason is counted.
"""

from __future__ import annotations

import os
from collections import Counter
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from code2wav.kernels import instant
from code2wav.model.decoder import Decoder
from code2wav.stream.pool import StatePool, packed_base, packed_inputs, restore_pairs
from code2wav.stream.runner import EagerRunner

DEFAULT_FRAMES = (1, 2, 4, 8, 16, 25, 32)
DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
EXPANDABLE_SEGMENTS = "expandable_segments:True"


def use_expandable_segments() -> None:
    """Turn on the CUDA allocator's expandable segments for this process, unless
    ``PYTORCH_CUDA_ALLOC_CONF`` is already set. Graphs of every step shape share one memory
    pool; with fixed-size segments the shapes fragment it to about twice the largest step's
    activations. Read when torch first touches CUDA: the CLI calls this first thing; a library
    user sets the variable before CUDA starts (or gets the smaller default budget)."""
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", EXPANDABLE_SEGMENTS)


def default_batch_frames() -> int:
    """Padded frames per step (rows x frames) that keep the graph pool under 1 GiB in bf16:
    fragmentation without expandable segments costs about half the budget (the measured
    pool sizes are in BENCHMARKS.md; ``bash bench/gpu.sh ab max_batch_frames=N`` is the A/B)."""
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower()
    return 480 if "expandable_segments:true" in conf else 256


def plan_buckets(batch_sizes: tuple[int, ...], frame_sizes: tuple[int, ...], max_batch_frames: int, max_streams: int) -> list[tuple[int, int]]:
    """Every (batch, frames) pair worth capturing: within the frame budget and the pool size.
    Each frames bucket also gets the batch that fills the budget (e.g. 5 x 25 under 128), so
    a full step's groups are not cut to the power of two below it (4 x 25: 22 % less work each)."""
    out = set()
    for t in set(frame_sizes):
        fill = min(max_batch_frames // t, max_streams)
        for b in set(batch_sizes) | ({fill} if fill else set()):
            if b * t <= max_batch_frames and b <= max_streams:
                out.add((b, t))
    return sorted(out, key=lambda bt: (bt[1], bt[0]))


def pick_bucket(buckets: list[tuple[int, int]], batch: int, frames: int) -> tuple[int, int] | None:
    """Smallest padded work (b * t) among buckets holding ``batch`` rows of ``frames`` frames."""
    fits = [(b * t, t, b) for b, t in buckets if b >= batch and t >= frames]
    if not fits:
        return None
    _, t, b = min(fits)
    return b, t


def priority_shapes(buckets: list[tuple[int, int]], priority_step_frames: int) -> set[tuple[int, int]]:
    """The buckets whose graphs go in the priority pool and replay on the priority stream: at most
    ``priority_step_frames`` padded frames (rows x frames; 0: none)."""
    return {(b, t) for b, t in buckets if b * t <= priority_step_frames}


def capture_order(buckets: list[tuple[int, int]], prefill_shapes: list[tuple[str, int, int]] = ()) -> list[tuple[str, int, int]]:
    """Every graph to capture as ``(kind, rows, frames)`` (kind ``step``, ``front`` or
    ``back``), in the order a start that serves meanwhile captures them: a lone stream's first
    chunk (1 frame) and its steady chunks (25 frames, a talker's usual, and the largest frames
    bucket) first, then the lone
    prefilled stream's passes, the steps by size (largest first: the smaller ones reuse its
    memory), and the other prefill passes."""
    steps = [("step", b, t) for b, t in sorted(buckets, key=lambda bt: -bt[0] * bt[1])]
    first = [("step", 1, t) for t in (1, 25, max((t for _, t in buckets), default=1)) if ("step", 1, t) in steps]
    lone = [p for p in prefill_shapes if p[1] == 1]
    return list(dict.fromkeys(first + lone + steps + list(prefill_shapes)))  # each once, at its first place


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[Tensor, ...]  # static: (codes or hidden frames, slots, n_new)
    out: Tensor
    packed: Tensor | None = None  # step graphs: one int64 buffer that codes, slots and n_new view


class GraphRunner(EagerRunner):
    """A runner that replays captured graphs (and, for the engine's batched prefill, graphs of
    the front and back halves alone); what no graph holds runs eagerly, counted by reason."""

    # max_frames' and max_rows' answers (asked per decode and per row a group takes), for the
    # bucket plan they were read from (bench/cold_start.py plans one bucket at a time).
    _limits_of: list[tuple[int, int]] | None = None
    _max_frames: int | None = None
    _max_rows: dict[int, int | None]

    def __init__(
        self,
        model: Decoder,
        pool: StatePool,
        batch_sizes: tuple[int, ...] = DEFAULT_BATCHES,
        frame_sizes: tuple[int, ...] = DEFAULT_FRAMES,
        max_batch_frames: int | None = None,  # default_batch_frames()
        priority_step_frames: int = 0,
    ):
        super().__init__(model, pool)
        self.device = next(model.parameters()).device
        if self.device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.buckets = plan_buckets(batch_sizes, frame_sizes, max_batch_frames or default_batch_frames(), pool.max_streams)
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.prefill_graphs: dict[tuple[str, int, int], _Graph] = {}
        self.mempool = torch.cuda.graph_pool_handle()
        # Small steps (at most priority_step_frames padded frames: first chunks, a lone stream's
        # one-frame steps) replay from a pool of their own on a second, high-priority stream, so that the
        # engine can run them beside a large step instead of behind it (stream/order.py orders
        # each slot's work across the two).
        self.priority_shapes = priority_shapes(self.buckets, priority_step_frames)
        self.priority_mempool = torch.cuda.graph_pool_handle() if self.priority_shapes else None
        self.priority_stream = torch.cuda.Stream(device=self.device, priority=-1) if self.priority_shapes else None
        self._priority_capture: torch.cuda.Stream | None = None  # made on first use (see _capture_shape)
        self.hits = 0
        self.fallbacks: Counter[str] = Counter()
        self.frames = 0  # real frames in the step graphs replayed
        self.padded_frames = 0  # rows x frames of those graphs, padding included
        self.pool_bytes = 0  # the graph pool after capture (memory_bytes() walks a snapshot: not per scrape)
        self._shapes: dict[tuple[int, int], tuple[int, int] | None] = {}  # padded_shape's answers

    @torch.no_grad()
    def capture(self, prefill_shapes: list[tuple[str, int, int]] = ()) -> None:
        """Warm up and capture every bucket, largest first so smaller graphs reuse its memory;
        then the prefill passes' shapes (``StreamEngine.prefill_shapes()``)."""
        stream = torch.cuda.Stream()
        steps = [("step", b, t) for b, t in sorted(self.buckets, key=lambda bt: -bt[0] * bt[1])]
        for shape in steps + list(prefill_shapes):
            self._capture_shape(stream, shape)
        torch.cuda.synchronize()
        self._graphs_changed()

    def plan(self, prefill_shapes: list[tuple[str, int, int]] = ()) -> list[tuple[str, int, int]]:
        """Every graph :meth:`capture` makes, in :func:`capture_order`."""
        return capture_order(self.buckets, prefill_shapes)

    def side_stream(self) -> torch.cuda.Stream:
        """A CUDA stream of its own, for warming or capturing beside the steps (engine/warmup.py)."""
        return torch.cuda.Stream(device=self.device)

    @torch.no_grad()
    def warm(self, shape: tuple[str, int, int], stream: torch.cuda.Stream) -> None:
        """Run ``shape`` twice eagerly on ``stream`` and wait for it: the first run of a shape is
        what costs (kernels loaded or compiled, cuDNN's plans), not its capture. Off the scratch
        slot with no new frames, so it changes no stream's state; safe beside eager steps on
        another thread (it captures nothing)."""
        with torch.cuda.stream(stream):
            fn, inputs, _ = self._shape_inputs(shape)
            for _ in range(2):
                fn(self.model, *inputs)
        stream.synchronize()

    @torch.no_grad()
    def capture_one(self, shape: tuple[str, int, int], stream: torch.cuda.Stream) -> None:
        """Capture ``shape`` (from :meth:`plan`) now; its steps replay it from the next one on."""
        stream = self._capture_shape(stream, shape)
        torch.cuda.current_stream().wait_stream(stream)
        stream.synchronize()
        self._graphs_changed()

    def _graphs_changed(self) -> None:
        """After graphs went in: padded_shape's answers change with them, and the pool grew."""
        self._shapes.clear()
        self.pool_bytes = self.memory_bytes()

    def _shape_inputs(self, shape: tuple[str, int, int]) -> tuple:
        """``(pass, (x, slots, n_new), packed)`` for ``shape``: scratch rows, no new frames;
        ``packed`` is the one buffer a step's three inputs view (None for a prefill pass)."""
        kind, b, t = shape
        q = self.model.config.num_quantizers
        if kind == "step":
            packed, codes, slots, n_new = packed_inputs(b, t, self.pool.scratch_slot, self.device, q=q)
            return self.pool.run, (codes, slots, n_new), packed
        slots = torch.full((b,), self.pool.scratch_slot, dtype=torch.long, device=self.device)
        n_new = torch.zeros(b, dtype=torch.long, device=self.device)
        x = torch.zeros(b, q, t, dtype=torch.long, device=self.device)
        if kind == "back":  # hidden frames, laid out as the front's output is
            x = self.model.front(x).zero_()
        return getattr(self.pool, kind), (x, slots, n_new), None

    def _capture_shape(self, stream: torch.cuda.Stream, shape: tuple[str, int, int]) -> torch.cuda.Stream:
        """Capture ``shape`` on ``stream``, or a priority step on the priority pool's own capture
        stream; returns the stream it was captured on. Graphs captured on one stream cannot run
        at the same time even with pools of their own (on the H200 two such graphs replayed at
        once died with an illegal instruction; something bound to the capture stream, cuBLAS's
        workspace among it, is baked into both: BENCHMARKS.md, session 26), and a priority step
        runs beside the others."""
        fn, inputs, packed = self._shape_inputs(shape)
        priority = shape[0] == "step" and shape[1:] in self.priority_shapes
        if priority:
            if self._priority_capture is None:
                self._priority_capture = torch.cuda.Stream(device=self.device)
            stream = self._priority_capture
            # Its warm-up runs below use that stream's workspace too: after the priority steps in flight.
            stream.wait_stream(self.priority_stream)
        g = self._capture(stream, fn, inputs, self.priority_mempool if priority else self.mempool)
        if packed is None:
            self.prefill_graphs[shape] = g
        else:
            g.packed = packed
            self.graphs[shape[1:]] = g
        return stream

    def _capture(self, stream: torch.cuda.Stream, fn, inputs: tuple[Tensor, Tensor, Tensor], pool: tuple | None = None) -> _Graph:
        """A graph of ``fn(model, x, slots, n_new)`` on scratch rows with no new frames (so the
        warm-up and capture runs change no stream's state). ``thread_local``: a warming thread's
        allocations beside a capture do not end it (they are on another stream)."""
        # The inputs were made on the current stream, and torch's streams do not wait for it by
        # themselves: on a busy worker, its fill may still be queued behind steps.
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: kernels compiled, cuDNN tuned, allocator primed
                fn(self.model, *inputs)
        stream.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool if pool is None else pool, stream=stream, capture_error_mode="thread_local"):
            out = fn(self.model, *inputs)
        return _Graph(g, inputs, out)

    def stream_for(self, shape: tuple[int, int]) -> torch.cuda.Stream | None:
        """The priority stream where a step staged at ``shape`` replays a priority-pool graph; else None."""
        return self.priority_stream if shape in self.priority_shapes and shape in self.graphs else None

    def padded_shape(self, batch: int, frames: int) -> tuple[int, int] | None:
        """The (rows, frames) of the graph a step of this shape replays; None: it runs eagerly.
        The engine stages a group's inputs at this shape, so they go up as they are."""
        key = (batch, frames)
        if key not in self._shapes:
            # The planned bucket, where its graph is in (a start that serves meanwhile, see
            # engine/warmup.py): until then eager, never padded to another captured graph.
            shape = pick_bucket(self.buckets, batch, frames)
            self._shapes[key] = shape if shape in self.graphs else None
        return self._shapes[key]

    def __call__(self, codes: Tensor, slots: Tensor, n_new: Tensor) -> Tensor:
        B, _, T = codes.shape
        shape = self.padded_shape(B, T)
        reason = None
        if shape is None:
            reason = "not captured" if pick_bucket(self.buckets, B, T) else "no bucket"
        elif torch.cuda.is_current_stream_capturing():
            reason = "stream capture active"
        if reason is not None:  # eager, counted
            self.fallbacks[reason] += 1
            with self._eager_forms(reason):
                return super().__call__(codes, slots, n_new)
        g = self.graphs[shape]
        staged = packed_base(codes, slots, n_new) if shape == (B, T) and not codes.is_cuda else None
        if staged is not None:  # the engine staged the step at the graph's shape: one copy up
            g.packed.copy_(staged, non_blocking=True)
            return self._replay(g, shape, n_new, B, T)
        q = codes.shape[1]
        if codes.is_cuda:  # device inputs (the bench's profiles): the graph's own, reset in place
            host, (codes_in, slots_in, n_in), pairs_in = None, g.inputs, restore_pairs(g.packed, shape[0], q, shape[1])
            codes_in.zero_()
            slots_in.fill_(self.pool.scratch_slot)
            n_in.zero_()
            pairs_in.zero_()
        else:  # host inputs of another shape: padded on the host, then one copy up (the caching
            #    host allocator keeps the pinned buffer until that copy has run)
            host, codes_in, slots_in, n_in = packed_inputs(*shape, self.pool.scratch_slot, pin_memory=True, q=q)
            pairs_in = restore_pairs(host, shape[0], q, shape[1])
        codes_in[:B, :, :T].copy_(codes)
        slots_in[:B].copy_(slots)
        n_in[:B].copy_(n_new)
        source = packed_base(codes, slots, n_new)
        if source is not None:  # staged at another shape: its restores too
            pairs_in[:B].copy_(restore_pairs(source, B, q, T))
        if host is not None:
            g.packed.copy_(host, non_blocking=True)
        return self._replay(g, shape, n_new, B, T)

    @staticmethod
    def _eager_forms(reason: str) -> AbstractContextManager[None]:
        """The forms an eager fallback runs: the instant ones (kernels/instant.py) for a shape no
        graph holds (new to this process, maybe: the fast forms' first run at a new shape costs
        seconds); the fast ones inside someone's stream capture (what it captures, it replays)."""
        return nullcontext() if reason == "stream capture active" else instant.forms()

    def _replay(self, g: _Graph, shape: tuple[int, int], n_new: Tensor, B: int, T: int) -> Tensor:
        g.graph.replay()
        self.hits += 1
        # The engine's n_new is on the host (summed as a list: a torch op's dispatch, or even a
        # numpy reduction, costs more); device inputs, as in the bench's profiles, sync here.
        self.frames += int(n_new.sum()) if n_new.is_cuda else sum(n_new.tolist())
        self.padded_frames += shape[0] * shape[1]
        if shape == (B, T):  # staged at the graph's shape (the engine's usual step): no view to make
            return g.out
        return g.out[:B, : T * self.model.config.samples_per_frame]

    def prefill(self, kind: str, x: Tensor, slots: Tensor, n_new: Tensor) -> Tensor:
        """Replay the ``kind`` ("front"/"back") prefill graph of exactly ``x``'s shape; where none
        was captured, the eager pass (a counted fallback)."""
        g = self.prefill_graphs.get((kind, x.shape[0], x.shape[-1]))
        if g is None or torch.cuda.is_current_stream_capturing():
            reason = f"{kind} prefill shape" if g is None else "stream capture active"
            self.fallbacks[reason] += 1
            with self._eager_forms(reason):
                return super().prefill(kind, x, slots, n_new)
        for dst, src in zip(g.inputs, (x, slots, n_new)):
            dst.copy_(src, non_blocking=True)
        g.graph.replay()
        self.hits += 1
        return g.out.clone()  # the static output is overwritten by the next replay

    def _plan_read(self) -> None:
        """Forget max_frames' and max_rows' answers if the bucket plan is another list now."""
        if self._limits_of is not self.buckets:
            self._limits_of, self._max_rows = self.buckets, {}
            self._max_frames = max((t for _, t in self.buckets), default=None)

    @property
    def max_frames(self) -> int | None:
        """The largest planned frames bucket: the engine cuts longer chunks into pieces of this
        (planned, not captured: a warming start schedules as it will once every graph is in)."""
        self._plan_read()
        return self._max_frames

    def max_rows(self, frames: int) -> int | None:
        """Most rows a planned graph holds at ``frames`` frames (None: no bucket fits)."""
        self._plan_read()
        if frames not in self._max_rows:
            rows = [b for b, t in self.buckets if t >= frames]
            self._max_rows[frames] = max(rows) if rows else None
        return self._max_rows[frames]

    def stats(self) -> dict[str, object] | None:
        return {"graphs": len(self.graphs), "prefill_graphs": len(self.prefill_graphs), "hits": self.hits,
                "fallbacks": dict(self.fallbacks), "frames": self.frames, "padded_frames": self.padded_frames,
                "pool_bytes": self.pool_bytes}

    def memory_bytes(self) -> int:
        """Bytes the graph memory pools hold (reserved by the caching allocator)."""
        pools = {tuple(p) for p in (self.mempool, self.priority_mempool) if p is not None}
        try:
            return sum(seg["total_size"] for seg in torch.cuda.memory_snapshot() if tuple(seg.get("segment_pool_id", (0, 0))) in pools)
        except Exception:  # pragma: no cover - snapshot layout differs across versions
            return -1
