"""Graphs captured while the engine serves (engine/warmup.py), on CPU.

The CUDA parts (a warm-up run on a side stream, a capture) are the GraphRunner's and are checked
on the H200 (bench/warm_check.py). Here the runner is the eager one with those two calls
recorded, so what is tested is the hand-off: which thread does what, in which order, that a
capture never overlaps a warm-up, that streams decode exactly all along, what ``/health`` says,
and that failures and a stop mid-way leave a working engine.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from code2wav.engine.async_engine import AsyncEngine
from code2wav.engine.build import EngineConfig, build_async_engine
from code2wav.engine.graphs import capture_order, plan_buckets
from code2wav.engine.warmup import Warmup
from code2wav.server.service import Service
from code2wav.stream.engine import StreamEngine
from code2wav.stream.pool import StatePool
from code2wav.stream.runner import EagerRunner
from code2wav.stream.schedule import SchedulePolicy
from tests.models import SMALL, forward_audio, random_codes

SPF = 1920
SHAPES = [("step", 1, 1), ("step", 1, 25), ("front", 1, 10), ("back", 1, 10), ("step", 4, 8), ("step", 2, 16)]


class Recorded(EagerRunner):
    """The eager runner with GraphRunner's warm/capture calls recorded as (event, shape, thread).
    ``gate``: a warm-up waits for it (a warm-up that takes as long as the test wants);
    ``bad``: shapes whose warm-up or capture raises."""

    def __init__(self, m, max_streams, bad: dict[str, set] | None = None, gate: threading.Event | None = None):
        super().__init__(m, StatePool(m, max_streams))
        self.events: list[tuple[str, tuple, str]] = []
        self.bad = bad or {}
        self.gate = gate
        self.busy = threading.Lock()  # held during a warm-up and during a capture: both at once is a failure

    def side_stream(self):
        return object()

    def _record(self, what, shape):
        if not self.busy.acquire(blocking=False):
            raise AssertionError(f"{what} of {shape} overlaps another warm-up or capture")
        try:
            self.events.append((what, shape, threading.current_thread().name))
            if what == "warm" and self.gate is not None:
                self.gate.wait(30)
            if shape in self.bad.get(what, ()):
                raise RuntimeError(f"{what} {shape} failed")
        finally:
            self.busy.release()

    def warm(self, shape, stream):
        self._record("warm", shape)

    def capture_one(self, shape, stream):
        self._record("capture", shape)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def warming_engine(m, runner, shapes=SHAPES):
    engine = StreamEngine(m, runner=runner, max_step_frames=32, max_batch_frames=256, policy=SchedulePolicy(first_chunk_wait=0.0))
    async_engine = AsyncEngine(engine)
    async_engine.warmup = Warmup(runner, shapes, async_engine.wake)
    async_engine.between_steps.append(async_engine.warmup.capture_ready)
    return async_engine


async def decode_streams(eng, codes, n_streams=3, prefix=10):
    """Streams with and without a prefix, chunks of 1 then 7 frames; each one's audio."""

    async def one(i):
        rid, pre = f"s{i}", prefix if i % 2 else 0
        await eng.open(rid, codes[:pre] if pre else None)
        out, at = [], pre
        for n in [1] + [7] * ((codes.shape[0] - pre - 1) // 7):
            out.append(await eng.push(rid, codes[at : at + n]))
            at += n
        await eng.finish(rid)
        return pre, at, torch.cat(out)

    return await asyncio.gather(*(one(i) for i in range(n_streams)))


def test_the_capture_order_puts_a_lone_streams_shapes_first_and_keeps_every_graph_once():
    buckets = plan_buckets((1, 2, 4, 8, 16), (1, 2, 4, 8, 16, 25, 32), 128, 16)
    prefill = [("front", 1, 10), ("back", 1, 10), ("front", 4, 10), ("back", 4, 10)]
    order = capture_order(buckets, prefill)
    assert order[:5] == [("step", 1, 1), ("step", 1, 25), ("step", 1, 32), ("front", 1, 10), ("back", 1, 10)]
    assert sorted(order) == sorted({("step", b, t) for b, t in buckets} | set(prefill))  # each graph, once
    steps = [b * t for kind, b, t in order[5:] if kind == "step"]
    assert steps == sorted(steps, reverse=True)  # then largest first: the smaller graphs reuse its memory


def test_streams_decode_exactly_while_graphs_are_warmed_on_a_thread_and_captured_between_steps(small_f64):
    m = small_f64
    codes = random_codes(60, SMALL, seed=3)
    gate = threading.Event()
    runner = Recorded(m, 4, gate=gate)
    eng = warming_engine(m, runner)
    full = forward_audio(m, codes)

    async def go():
        async with eng:
            assert eng.warmup.status() == {"state": "warming", "captured": 0, "planned": len(SHAPES), "failed": 0}
            first = await decode_streams(eng, codes)  # the first warm-up is held: every step so far was eager
            gate.set()
            while eng.warmup.state == "warming":
                await asyncio.sleep(0.01)
            return first, await decode_streams(eng, codes)

    for results in asyncio.run(go()):
        for pre, end, audio in results:
            assert (audio - full[pre * SPF : end * SPF]).abs().max() <= 1e-9
    events = runner.events
    assert [(what, shape) for what, shape, _ in events] == [(w, s) for s in SHAPES for w in ("warm", "capture")]
    assert {thread for what, _, thread in events if what == "warm"} == {"code2wav-warmup"}
    assert {thread for what, _, thread in events if what == "capture"} == {"code2wav-step"}  # the engine's worker
    assert eng.warmup.status() == {"state": "ready", "captured": len(SHAPES), "planned": len(SHAPES), "failed": 0}
    assert eng.warmup.seconds is not None


def test_a_shape_that_fails_to_warm_or_capture_stays_eager_and_the_rest_go_on(small_f64):
    m = small_f64
    codes = random_codes(40, SMALL, seed=4)
    runner = Recorded(m, 4, bad={"warm": {SHAPES[1]}, "capture": {SHAPES[3]}})
    eng = warming_engine(m, runner)

    async def go():
        async with eng:
            while eng.warmup.state == "warming":
                await asyncio.sleep(0.01)
            return await decode_streams(eng, codes, n_streams=2)

    full = forward_audio(m, codes)
    for pre, end, audio in asyncio.run(go()):
        assert (audio - full[pre * SPF : end * SPF]).abs().max() <= 1e-9
    assert eng.warmup.status() == {"state": "ready", "captured": len(SHAPES) - 2, "planned": len(SHAPES), "failed": 2}
    assert sorted(eng.warmup.failed) == sorted([SHAPES[1], SHAPES[3]])
    assert ("capture", SHAPES[1]) not in [(w, s) for w, s, _ in runner.events]  # never captured unwarmed


def test_stopping_the_engine_mid_warm_up_ends_the_warm_up_thread(small_f64):
    m = small_f64
    gate = threading.Event()
    runner = Recorded(m, 2, gate=gate)
    eng = warming_engine(m, runner)

    async def go():
        await eng.start()
        while not runner.events:
            await asyncio.sleep(0.01)
        thread = eng.warmup._thread
        stopping = asyncio.ensure_future(eng.stop())
        while not eng.warmup.stopping:
            await asyncio.sleep(0.01)
        gate.set()  # the warm-up in progress returns; nothing more is captured or warmed
        await stopping
        return thread

    thread = asyncio.run(go())
    assert not thread.is_alive()
    assert eng.warmup.state == "warming" and eng.warmup.captured == 0 and [w for w, _, _ in runner.events] == ["warm"]


def test_health_reports_the_graphs_while_warming_and_once_ready(small_f64):
    m = small_f64
    gate = threading.Event()
    eng = warming_engine(m, Recorded(m, 2, gate=gate), shapes=SHAPES[:2])

    async def go():
        service = Service(eng)
        await service.start()
        try:
            status, warming = service.health()
            gate.set()
            while eng.warmup.state == "warming":
                await asyncio.sleep(0.01)
            return status, warming, service.health()
        finally:
            await service.stop()

    status, warming, (status_ready, ready) = asyncio.run(go())
    assert status == 200 and warming["status"] == "ok" and warming["graphs"]["state"] == "warming"  # it serves while warming
    assert status_ready == 200 and ready["graphs"] == {"state": "ready", "captured": 2, "planned": 2, "failed": 0}
    assert ready["precision"] == {"dtype": "float64", "low_rate_dtype": "float64"}  # no probe: not auto's case


def test_graph_capture_is_configured_by_name_and_only_graphs_warm_in_the_background(ckpt):
    with pytest.raises(ValueError, match="graph_capture"):
        EngineConfig(graph_capture="later")
    assert EngineConfig().graph_capture == "background"  # a service answers seconds after its start
    eng = build_async_engine(EngineConfig(model=str(ckpt), max_streams=2, graph_capture="background"))  # CPU: no graphs, nothing to warm
    assert eng.warmup is None and not eng.between_steps
