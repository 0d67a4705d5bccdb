"""The async engine (continuous batching) and the graph path's shape decisions, on CPU."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

import numpy as np
import pytest
import torch

from code2wav.codes import CodesError
from code2wav.engine.async_engine import AsyncEngine, Backpressure
from code2wav.engine.build import EngineConfig
from code2wav.engine.graphs import DEFAULT_BATCHES, DEFAULT_FRAMES, pick_bucket, plan_buckets, priority_shapes
from code2wav.stream.engine import StreamEngine
from code2wav.stream.order import SlotOrder
from code2wav.stream.pool import PoolFull, StatePool, packed_base, packed_inputs, restore_pairs
from code2wav.stream.rows import StreamError
from code2wav.stream.runner import EagerRunner
from code2wav.stream.schedule import SchedulePolicy, split_groups
from tests.models import SMALL, forward_audio, model, random_codes, stream_alone


class Spy(EagerRunner):
    """The eager runner over a new pool of ``max_streams`` slots that calls ``before(codes, slots,
    n_new)`` ahead of every step; where that returns audio, the step returns it instead."""

    def __init__(self, m, max_streams, before):
        super().__init__(m, StatePool(m, max_streams))
        self.before = before

    def __call__(self, codes, slots, n_new):
        out = self.before(codes, slots, n_new)
        return super().__call__(codes, slots, n_new) if out is None else out

SPF = 1920


class GatherFirst(AsyncEngine):
    """An :class:`AsyncEngine` whose worker takes nothing until ``first`` chunks are queued, then
    works as usual: which rows share the first step then does not depend on when the worker
    thread happens to wake (a loaded machine may wake it between two pushes)."""

    def __init__(self, *a, first: int, **k):
        super().__init__(*a, **k)
        self._first = first

    def _take(self, in_flight, futures, encoders):
        if self._first and sum(len(q) for q in self._pending.values()) < self._first:
            return {}  # the worker sleeps until the next push wakes it
        self._first = 0
        return super()._take(in_flight, futures, encoders)


class VirtualClock:
    """A clock that only a simulated device moves: each step the runner takes advances it by
    ``step_s``. Patched in as the bench's clock, it makes which chunks fall inside a measured
    window a matter of step counts, not of how fast this machine runs them."""

    def __init__(self, step_s: float):
        self.now, self.step_s = 0.0, step_s

    def perf_counter(self) -> float:
        return self.now

    def step(self, c, slots, n_new) -> None:  # a Spy ``before``: the step then decodes for real
        self.now += self.step_s


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def m(small_f64):
    return small_f64


@pytest.fixture(scope="module")
def codes():
    return random_codes(300, SMALL, seed=5)


def test_concurrent_streams_equal_each_alone(m, codes):
    """12 streams with their own prefixes and schedules push concurrently; the scheduler batches
    whatever is pending; each stream's audio equals its own whole-utterance forward."""
    specs = [(i * 7 % 40, [1 + i % 5, 25 - i]) for i in range(12)]
    n = 60

    async def main():
        core = StreamEngine(m, max_streams=12, max_step_frames=16, max_batch_frames=64)
        async with GatherFirst(core, first=12) as eng:  # every first chunk queued before the first step
            seen: list[int] = []
            eng.on_step.append(lambda seconds, rows, frames: seen.append(rows))

            async def one(i):
                p, sched = specs[i]
                await asyncio.sleep(0.001 * i)
                await eng.open(f"s{i}", codes[:p])
                out, at, k = [], p, 0
                while at < p + n:
                    size = min(sched[min(k, 1)], p + n - at)
                    out.append(await eng.push(f"s{i}", codes[at : at + size]))
                    at, k = at + size, k + 1
                await eng.finish(f"s{i}")
                return torch.cat(out)

            outs = await asyncio.gather(*(one(i) for i in range(12)))
            steps, rows = eng.stats.steps, eng.stats.rows
            assert len(seen) == steps and sum(seen) == rows  # the per-step hook (metrics) saw every step
        return outs, steps, rows, core

    outs, steps, rows, core = asyncio.run(main())
    ref = forward_audio(m, codes[: 40 + n])
    for i, (p, _) in enumerate(specs):
        assert (outs[i] - ref[p * SPF : (p + n) * SPF]).abs().max() <= 1e-9, i
    assert rows > steps, "streams were batched together"  # the first step alone holds 12 rows in fewer forwards
    assert core.active == 0 and core.pool.in_use == 0


def test_per_stream_order_with_many_chunks_in_flight(m, codes):
    """Chunks pushed without awaiting come back in order, one per step, exact."""

    async def main():
        core = StreamEngine(m, max_streams=2)
        async with AsyncEngine(core, max_pending_chunks=8) as eng:
            await eng.open("a")
            futs = [asyncio.ensure_future(eng.push("a", codes[3 * k : 3 * k + 3])) for k in range(6)]
            outs = await asyncio.gather(*futs)
            await eng.finish("a")
        return torch.cat(outs)

    out = asyncio.run(main())
    assert (out - forward_audio(m, codes[:18])).abs().max() <= 1e-9


def test_encode_runs_on_the_worker_per_row(m, codes):
    """``encode`` turns a row's audio into its result after the step, on the worker thread; a
    failing encode fails that row alone, and the stats still count the decoded audio."""
    import threading

    threads: set[str] = set()

    def to_bytes(audio: torch.Tensor) -> bytes:
        threads.add(threading.current_thread().name)
        return audio.numpy().tobytes()

    def broken(audio: torch.Tensor) -> bytes:
        raise RuntimeError("encode failed")

    async def main():
        core = StreamEngine(m, max_streams=3)
        async with AsyncEngine(core) as eng:
            for rid in ("a", "b", "c"):
                await eng.open(rid)
            futs = [eng.submit("a", codes[:4], to_bytes), eng.submit("b", codes[:4], broken), eng.submit("c", codes[:4])]
            done = await asyncio.gather(*futs, return_exceptions=True)
            for rid in ("a", "b", "c"):
                await eng.finish(rid)
            return done, eng.stats

    (a, b, c), stats = asyncio.run(main())
    assert isinstance(a, bytes) and a == c.numpy().tobytes()
    assert (c - forward_audio(m, codes[:4])).abs().max() <= 1e-9
    assert isinstance(b, RuntimeError)
    assert threads and all(t.startswith("code2wav-step") for t in threads)
    assert stats.rows == 3 and stats.frames == 12


def test_backpressure_and_refusals(m, codes):
    async def main():
        core = StreamEngine(m, max_streams=1)
        idle = AsyncEngine(core)
        await idle.open("a")
        with pytest.raises(StreamError, match="not running"):  # nothing would ever decode it
            idle.submit("a", codes[:1])
        await idle.abort("a")
        async with AsyncEngine(core, max_pending_chunks=2) as eng:
            await eng.open("a")
            with pytest.raises(PoolFull):
                await eng.open("b")
            with pytest.raises(StreamError, match="no open stream 'zzz'"):
                await eng.push("zzz", codes[:1])
            futs = [asyncio.ensure_future(eng.push("a", codes[k : k + 1])) for k in range(2)]
            await asyncio.sleep(0)  # both queued
            with pytest.raises(Backpressure, match="'a' has 2 chunks in flight"):
                await eng.push("a", codes[2:3])
            first = await asyncio.gather(*futs)
            with pytest.raises(CodesError, match="outside"):
                await eng.push("a", np.full((1, 16), 4096))
            third = await eng.push("a", codes[2:3])  # the stream survives a bad chunk
            await eng.finish("a")
            with pytest.raises(StreamError, match="already finished"):
                await eng.push("a", codes[:1])
            errors = dict(eng.stats.errors)
        return torch.cat([*first, third]), errors

    out, errors = asyncio.run(main())
    assert (out - forward_audio(m, codes[:3])).abs().max() <= 1e-9
    assert errors["queue_full"] == 1 and errors["out_of_range"] == 1


def test_abort_drops_queued_chunks_and_frees(m, codes):
    async def main():
        core = StreamEngine(m, max_streams=1)
        async with AsyncEngine(core, max_pending_chunks=8) as eng:
            await eng.open("a")
            futs = [asyncio.ensure_future(eng.push("a", codes[k : k + 1])) for k in range(5)]
            await asyncio.sleep(0)
            await eng.abort("a")
            done = await asyncio.gather(*futs, return_exceptions=True)
            await eng.open("b")  # the slot is free again
            out = await eng.push("b", codes[:2])
        return done, out, core

    done, out, core = asyncio.run(main())
    assert any(isinstance(d, StreamError) and d.code == "aborted" for d in done)
    assert (out - forward_audio(m, codes[:2])).abs().max() <= 1e-9
    assert core.active == 0


def test_rows_are_handed_over_as_their_group_finishes(m, codes):
    """A step bigger than the frame budget runs as several groups; ``on_ready`` gets each row as
    soon as its group is done (before later groups run), exactly once, with the audio the step
    returns. Rows cut into several pieces are handed over after their last piece."""
    log: list[tuple[str, object]] = []
    core = StreamEngine(m, runner=Spy(m, 6, lambda c, slots, n_new: log.append(("run", tuple(slots.tolist())))), max_step_frames=8, max_batch_frames=16)
    sizes = [8, 8, 8, 3, 12, 5]  # 12 frames: two pieces of at most 8
    for i in range(6):
        core.open(f"s{i}")
    got: dict[str, torch.Tensor] = {}
    out = core.decode(
        {f"s{i}": codes[:n] for i, n in enumerate(sizes)},
        on_ready=lambda rid, a: (log.append(("ready", rid)), got.__setitem__(rid, a)),
    )
    assert sorted(got) == sorted(out) and all(torch.equal(got[r], out[r]) for r in out)
    readies = [x for kind, x in log if kind == "ready"]
    assert len(readies) == len(set(readies)) == 6
    first_run = log.index(("run", (0, 1)))  # the first group: two rows of 8 under a budget of 16
    assert log[first_run + 1 : first_run + 3] == [("ready", "s0"), ("ready", "s1")]
    assert log.index(("ready", "s4")) > max(i for i, (kind, _) in enumerate(log) if kind == "run" and 4 in _)
    for i, n in enumerate(sizes):
        assert (out[f"s{i}"] - forward_audio(m, codes[:n])).abs().max() <= 1e-9


def test_async_chunk_resolves_before_its_step_ends(m, codes):
    """Through the async engine: while a step's later group is still running, the chunks of its
    first group are already resolved (time to audio does not wait for the whole step)."""
    import threading

    async def main():
        release = threading.Event()

        def wait_at_the_second(c, slots, n_new):
            if slots.tolist() == [1]:  # the second group waits until the test has looked
                assert release.wait(10)

        core = StreamEngine(m, runner=Spy(m, 2, wait_at_the_second), max_step_frames=8, max_batch_frames=8)  # one row per group
        async with AsyncEngine(core) as eng:
            await eng.open("a")
            await eng.open("b")
            fa, fb = eng.submit("a", codes[:8]), eng.submit("b", codes[:8])
            first = await asyncio.wait_for(fa, 10)  # resolves while "b" is held
            assert not fb.done()
            release.set()
            second = await asyncio.wait_for(fb, 10)
            return first, second

    a, b = asyncio.run(main())
    ref = forward_audio(m, codes[:8])
    assert (a - ref).abs().max() <= 1e-9 and (b - ref).abs().max() <= 1e-9


def test_new_chunks_join_a_running_step(m, codes):
    """Continuous batching: while a step's group is running, a stream opens (at once: opening
    does not queue behind the step) and pushes; its chunk and the next chunk of a stream whose
    audio already came back join the same step's later groups. Every output stays exact."""
    async def main():
        runner, hold, held = _hold_runner(m, 3, lambda slots: slots == [1])  # the first group of stream "b" waits
        core = StreamEngine(m, runner=runner, max_step_frames=8, max_batch_frames=8)  # one row per group
        calls: list[int] = []
        core.decode = _counting(core.decode, calls)
        async with AsyncEngine(core) as eng:
            await eng.open("a")
            await eng.open("b")
            fa, fb = eng.submit("a", codes[:8]), eng.submit("b", codes[:8])
            a1 = await asyncio.wait_for(fa, 10)  # "a" is back while "b" is held
            while not held.is_set():
                await asyncio.sleep(0.001)
            await asyncio.wait_for(eng.open("c"), 5)  # does not wait for the step (held until hold is set, up to 10 s)
            fc, fa2 = eng.submit("c", codes[:5]), eng.submit("a", codes[8:13])
            hold.set()
            outs = await asyncio.wait_for(asyncio.gather(fb, fc, fa2), 10)
            for rid in "abc":
                await eng.finish(rid)
            return a1, outs, calls, eng.stats

    a1, (b, c, a2), calls, stats = asyncio.run(main())
    assert len(calls) == 1, "the later chunks joined the running step"
    assert stats.chunks == 4 and stats.steps == 4  # four groups of one row
    ref = forward_audio(m, codes[:13])
    assert (torch.cat([a1, a2]) - ref).abs().max() <= 1e-9
    assert (b - ref[: 8 * SPF]).abs().max() <= 1e-9 and (c - ref[: 5 * SPF]).abs().max() <= 1e-9


def test_abort_during_a_step_leaves_the_reused_slot_cold(m, codes):
    """A stream aborted while its row waits in a running step: the row is dropped, the slot is
    freed at once, and a stream that takes the same slot mid-step starts from cold state."""
    async def main():
        runner, hold, held = _hold_runner(m, 2, lambda slots: True)  # the first group waits
        core = StreamEngine(m, runner=runner, max_step_frames=8, max_batch_frames=8)
        async with AsyncEngine(core) as eng:
            await eng.open("a")
            await eng.open("b")
            fa = eng.submit("a", codes[:8])
            fb = eng.submit("b", codes[100:116])  # two pieces: its second waits in the queue
            while not held.is_set():
                await asyncio.sleep(0.001)
            await eng.abort("b")
            await eng.open("c")  # takes b's slot
            fc = eng.submit("c", codes[:6])
            hold.set()
            done = await asyncio.wait_for(asyncio.gather(fa, fb, fc, return_exceptions=True), 10)
            await eng.finish("a")
            await eng.finish("c")
            return done, core

    (a, b, c), core = asyncio.run(main())
    ref = forward_audio(m, codes[:8])
    assert isinstance(b, StreamError) and b.code in ("aborted", "stream_ended")
    assert (a - ref).abs().max() <= 1e-9
    assert (c - ref[: 6 * SPF]).abs().max() <= 1e-9  # not b's history
    assert core.active == 0 and core.pool.in_use == 0


def test_step_polls_for_more_rows_and_keeps_each_streams_order(m, codes):
    """``StreamEngine.decode(more=...)``: asked before every group; rows it returns join; two
    chunks of one stream never share a group and run in the order given."""
    core = StreamEngine(m, max_streams=2, max_step_frames=4, max_batch_frames=8)
    core.open("a")
    core.open("b")
    extra = [{"a": codes[6:9], "b": codes[4:7]}, {"a": codes[9:10]}]
    asked, got = [], {"a": [], "b": []}
    out = core.decode({"a": codes[:6], "b": codes[:4]}, on_ready=lambda rid, x: got[rid].append(x),
                    more=lambda: (asked.append(1), extra.pop(0) if extra else {})[1])
    assert out == {} and len(asked) >= 3
    ref = forward_audio(m, codes[:10])
    assert (torch.cat(got["a"]) - ref).abs().max() <= 1e-9
    assert (torch.cat(got["b"]) - ref[: 7 * SPF]).abs().max() <= 1e-9


def test_finishing_many_streams_during_a_long_step_queues_one_zeroing_job(m, codes):
    """Streams ending while a step runs leave their slots to be zeroed by one queued job (not one
    each: a continuous step may last as long as the load), and a new stream on a reused slot
    still starts cold."""

    async def main():
        runner, hold, held = _hold_runner(m, 6, lambda slots: slots == [5])
        core = StreamEngine(m, runner=runner, max_step_frames=8, max_batch_frames=8)
        async with AsyncEngine(core) as eng:
            for i in range(6):
                await eng.open(f"s{i}")
            futs = [eng.submit(f"s{i}", codes[:2]) for i in range(5)]
            await asyncio.gather(*futs)
            long = eng.submit("s5", codes[:3])  # holds the worker
            while not held.is_set():
                await asyncio.sleep(0.001)
            for i in range(5):
                await eng.finish(f"s{i}")
            queued = eng._idle_work_queued  # one request, however many streams ended
            await eng.open("new")
            fn = eng.submit("new", codes[:4])
            hold.set()
            await long
            out = await fn
            return queued, out

    queued, out = asyncio.run(main())
    assert queued is True
    assert (out - forward_audio(m, codes[:4])).abs().max() <= 1e-9


def test_a_cancelled_chunk_is_dropped_and_the_stream_goes_on(m, codes):
    """A queued chunk whose future the caller cancels is never decoded; the stream's next chunk
    still runs, right after the one before the cancelled one."""

    async def main():
        runner, hold, held = _hold_runner(m, 1, lambda slots: True)
        core = StreamEngine(m, runner=runner)
        async with AsyncEngine(core, max_pending_chunks=4) as eng:
            await eng.open("a")
            f1 = eng.submit("a", codes[:3])
            while not held.is_set():
                await asyncio.sleep(0.001)
            f2, f3 = eng.submit("a", codes[3:5]), eng.submit("a", codes[5:9])
            f2.cancel()
            hold.set()
            a1, a3 = await asyncio.wait_for(asyncio.gather(f1, f3), 10)
            await eng.finish("a")
            return a1, a3, eng.stats.chunks

    a1, a3, chunks = asyncio.run(main())
    kept = torch.cat([codes[:3], codes[5:9]])
    assert chunks == 2
    assert (torch.cat([a1, a3]) - forward_audio(m, kept)).abs().max() <= 1e-9


def test_churn_of_streams_during_continuous_steps_stays_exact_and_leaks_nothing(m, codes):
    """16 streams open, push ragged chunks (some pipelined), get aborted or finish, and reuse
    each other's slots while steps run continuously on the worker: every stream that finishes
    has exactly its own audio, aborted ones end with an error, and every slot comes back."""
    import random

    rnd = random.Random(7)
    plans = [(rnd.choice([0, 0, 5, 12]), [rnd.randint(1, 9) for _ in range(rnd.randint(2, 5))], rnd.random() < 0.25) for _ in range(16)]

    async def main():
        core = StreamEngine(m, max_streams=6, max_step_frames=8, max_batch_frames=24)
        async with AsyncEngine(core, max_pending_chunks=8) as eng:
            gate = asyncio.Semaphore(6)  # never more streams than slots

            async def one(i):
                p, sizes, abort = plans[i]
                async with gate:
                    await asyncio.sleep(rnd.random() * 0.01)
                    await eng.open(f"s{i}", codes[:p])
                    at, futs = p, []
                    for k, n in enumerate(sizes):
                        futs.append(eng.submit(f"s{i}", codes[at : at + n]))
                        at += n
                        if k % 2 == 0:  # some chunks pipelined, some awaited
                            await futs[-1]
                        if abort and k == 1:
                            await eng.abort(f"s{i}")
                            return None, await asyncio.gather(*futs, return_exceptions=True)
                    outs = await asyncio.gather(*futs)
                    await eng.finish(f"s{i}")
                    return torch.cat(outs), None

            results = await asyncio.gather(*(one(i) for i in range(16)))
        return results, core

    results, core = asyncio.run(main())
    ref = forward_audio(m, codes[: 12 + 45])
    for (p, sizes, abort), (audio, aborted) in zip(plans, results):
        if abort:  # each of its two chunks: its exact audio, or the abort's error
            at = p
            for n, x in zip(sizes, aborted):
                if isinstance(x, Exception):
                    assert isinstance(x, StreamError) and x.code in ("aborted", "stream_ended"), x
                else:
                    assert (x - ref[at * SPF : (at + n) * SPF]).abs().max() <= 1e-9
                at += n
        else:
            assert (audio - ref[p * SPF : (p + sum(sizes)) * SPF]).abs().max() <= 1e-9
    assert core.active == 0 and core.pool.in_use == 0


def test_first_chunks_go_ahead_of_streams_already_playing(m, codes):
    """A stream's first chunk joins the very next group, ahead of queued chunks of streams that
    already have audio; the later chunks keep their order and every output stays exact. (Here
    with ``first_chunk_wait=0``: the playing streams saturate the one-row groups, so by default
    the first chunk would wait for others; see the gathering tests.)"""
    order = []
    recording = [False]  # from the step under test on
    spy = Spy(m, 4, lambda c, slots, n_new: order.append(slots.tolist()) if recording[0] else None)
    core = StreamEngine(m, runner=spy, max_step_frames=8, max_batch_frames=8, policy=SchedulePolicy(first_chunk_wait=0.0))  # one row per group
    for rid in "abc":
        core.open(rid)
        core.push(rid, codes[:2])  # playing
    core.open("d")
    recording[0] = True
    arrivals = [{"d": codes[:1]}]
    got = {}
    core.decode({rid: codes[2:10] for rid in "abc"}, on_ready=got.__setitem__, more=lambda: arrivals.pop() if arrivals else {})
    assert order == [[3], [0], [1], [2]]
    ref = forward_audio(m, codes[:10])
    assert all((got[rid] - ref[2 * SPF :]).abs().max() <= 1e-9 for rid in "abc")
    assert (got["d"] - ref[:SPF]).abs().max() <= 1e-9


def _gathering_step(m, codes, monkeypatch=None, later: float = 0.0, budget: int = 3, prefix_c: int = 0, **kw):
    """Streams a, b playing (2-frame chunks queued, a's next one arriving during the step), c, d, e
    opening (1-frame first chunks, d and e arriving during the step; c after a ``prefix_c``-frame
    reference prefix); returns the slots of each group, in order, and checks every row's audio
    against the whole forward. With the default budget of 3 frames a forward holds one 2-frame
    row or three 1-frame ones, so the playing streams' rows saturate it."""
    order, recording = [], [False]  # from the step under test on
    spy = Spy(m, 5, lambda c, slots, n_new: order.append(slots.tolist()) if recording[0] else None)
    core = StreamEngine(m, runner=spy, max_step_frames=2, max_batch_frames=budget, policy=SchedulePolicy(**kw))
    for rid in "ab":
        core.open(rid)
        core.push(rid, codes[:2])
    core.open("c", codes[:prefix_c] if prefix_c else None)
    for rid in "de":
        core.open(rid)
    if later:  # every first chunk has waited ``later`` seconds by the time groups are formed
        real = time.monotonic
        monkeypatch.setattr(time, "monotonic", lambda: real() + later)
    got = {}
    recording[0] = True
    arrivals = [{"d": codes[:1], "e": codes[:1]}, {"a": codes[4:6]}]  # popped from the end: a's next chunk first
    core.decode({"a": codes[2:4], "b": codes[2:4], "c": codes[prefix_c : prefix_c + 1]}, on_ready=got.__setitem__,
              more=lambda: arrivals.pop() if arrivals else {})
    ref = forward_audio(m, codes[:6])
    assert (got["a"] - ref[4 * SPF : 6 * SPF]).abs().max() <= 1e-9 and (got["b"] - ref[2 * SPF : 4 * SPF]).abs().max() <= 1e-9
    assert all((got[rid] - ref[:SPF]).abs().max() <= 1e-9 for rid in "de")
    assert (got["c"] - ref[prefix_c * SPF : (prefix_c + 1) * SPF]).abs().max() <= 1e-9
    return order


def test_first_chunks_gather_while_other_rows_saturate_the_device(m, codes):
    """With ``first_chunk_wait``, first chunks hold back while more rows of playing streams are
    queued than the next forward holds, so that later first chunks join them in one forward;
    once the rest fits in one forward they run. Without it a first chunk runs in the very next
    forward, alone. Below saturation (a budget that holds every queued row) nothing waits."""
    assert _gathering_step(m, codes, first_chunk_wait=0.0) == [[2], [3, 4], [0], [1], [0]]
    assert _gathering_step(m, codes, first_chunk_wait=5.0) == [[0], [1], [3, 4, 2], [0]]
    assert _gathering_step(m, codes, budget=16, first_chunk_wait=5.0) == [[2], [3, 4], [0, 1], [0]]


def test_first_chunks_of_streams_with_a_reference_prefix_do_not_wait(m, codes):
    """A stream opened with a reference prefix is prefilled as its first chunk joins, and its
    first chunk runs in the next forward even while the device is saturated; first chunks without
    a prefix still gather behind it."""
    assert _gathering_step(m, codes, prefix_c=3, first_chunk_wait=5.0) == [[2], [0], [1], [3, 4], [0]]


def test_first_chunks_stop_gathering_when_enough_wait_or_the_oldest_waited_long_enough(m, codes, monkeypatch):
    assert _gathering_step(m, codes, first_chunk_wait=5.0, first_chunk_rows=1) == [[2], [3, 4], [0], [1], [0]]
    assert _gathering_step(m, codes, monkeypatch, later=6.0, first_chunk_wait=5.0) == [[2], [3, 4], [0], [1], [0]]


@pytest.mark.parametrize("group_by_size", [True, False])
def test_group_by_size_keeps_one_size_class_per_group(m, codes, group_by_size):
    """By default (``group_by_size``) a group holds rows of one size class: 1-frame first chunks
    are not padded to 20 next to steady chunks. Rows passed over keep their places and their
    streams' order, and every output stays exact. Without it, sizes share a padded group."""
    shapes = []
    spy = Spy(m, 4, lambda c, slots, n_new: shapes.append((slots.tolist(), c.shape[-1])))
    core = StreamEngine(m, runner=spy, max_step_frames=32, max_batch_frames=64, policy=SchedulePolicy(group_by_size=group_by_size))
    for rid in "ab":
        core.open(rid)
        core.push(rid, codes[:1])  # playing
    shapes.clear()
    core.open("c")
    core.open("d")
    arrivals = [{"a": codes[21:22]}]  # a's second chunk (1 frame) arrives behind its 20-frame one
    got: dict[str, list] = {r: [] for r in "abcd"}
    core.decode({"a": codes[1:21], "c": codes[:1], "b": codes[1:21], "d": codes[:1]},
              on_ready=lambda rid, x: got[rid].append(x), more=lambda: arrivals.pop() if arrivals else {})
    if group_by_size:
        assert shapes == [([2, 3], 1), ([0, 1], 20), ([0], 1)]  # first chunks, steady, then a's next
    else:  # 1-frame chunks padded to 20 next to 20-frame rows (3 rows of 20 fill the budget of 64)
        assert shapes == [([2, 3, 0], 20), ([1, 0], 20)]
    ref = forward_audio(m, codes[:22])
    assert (torch.cat([*got["a"]]) - ref[SPF:]).abs().max() <= 1e-9
    assert (got["b"][0] - ref[SPF : 21 * SPF]).abs().max() <= 1e-9
    assert all((got[r][0] - ref[:SPF]).abs().max() <= 1e-9 for r in "cd")


def test_split_lone_group_runs_every_ready_row_as_two_halves(m, codes):
    """``split_lone_group``: with nothing in flight, a group that took every ready row (the
    budget did not cut it) runs as two halves, the second half whole (not halved again); a group
    the budget cut is not split. Each stream's chunks stay in order and exact."""
    shapes = []
    record = lambda c, slots, n_new: shapes.append((slots.tolist(), c.shape[-1]))  # noqa: E731
    core = StreamEngine(m, runner=Spy(m, 6, record), max_step_frames=8, max_batch_frames=48, policy=SchedulePolicy(split_lone_group=True))
    rids = "abcdef"
    for rid in rids:
        core.open(rid)
    got: dict[str, list] = {r: [] for r in rids}
    core.decode({rid: codes[:3] for rid in rids}, on_ready=lambda rid, x: got[rid].append(x))
    assert shapes == [([0, 1, 2], 3), ([3, 4, 5], 3)]  # 6 x 3 frames, under the budget of 48: halves
    shapes.clear()
    core.decode({rid: codes[3:11] for rid in rids}, on_ready=lambda rid, x: got[rid].append(x))
    assert shapes == [([0, 1, 2], 8), ([3, 4, 5], 8)]  # 6 x 8 = 48 fits, and it is every ready row
    ref = forward_audio(m, codes[:11])
    for rid in rids:
        assert (torch.cat(got[rid]) - ref).abs().max() <= 1e-9

    # Mixed sizes (group_by_size off): 7 rows of 2 frames would fit 24 to a group, but an 8-frame
    # row next in line would make it 8 x 8 > 48, so the budget cut the group: it is not split.
    core = StreamEngine(m, runner=Spy(m, 8, record), max_step_frames=8, max_batch_frames=48,
                        policy=SchedulePolicy(group_by_size=False, split_lone_group=True))
    shapes.clear()
    for i in range(8):
        core.open(str(i))
    out = core.decode({str(i): codes[: 8 if i == 7 else 2] for i in range(8)})
    assert shapes == [(list(range(7)), 2), ([7], 8)]
    assert all((out[str(i)] - ref[: (8 if i == 7 else 2) * SPF]).abs().max() <= 1e-9 for i in range(8))


def test_graph_budget_follows_the_allocator_setting(monkeypatch):
    """The default padded frames per forward keep the graph pool under 1 GiB: 480 with the
    allocator's expandable segments (which the CLI turns on unless the user set the variable),
    256 with fixed-size segments, where the shapes fragment the pool to about twice the size."""
    from code2wav.engine import graphs

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert graphs.default_batch_frames() == 256
    graphs.use_expandable_segments()
    assert graphs.default_batch_frames() == 480
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    graphs.use_expandable_segments()  # the user's setting wins
    assert graphs.default_batch_frames() == 256


def _hold_runner(m, max_streams, when):
    """A runner that stops at its first group whose slots satisfy ``when`` until the test sets
    ``hold``; ``held`` is set once it has stopped there."""
    import threading

    hold, held = threading.Event(), threading.Event()

    def wait(c, slots, n_new):
        if not hold.is_set() and when(slots.tolist()):
            held.set()
            assert hold.wait(10)

    return Spy(m, max_streams, wait), hold, held


def _counting(fn, calls):
    def wrapped(*a, **k):
        calls.append(1)
        return fn(*a, **k)

    return wrapped


# -- the graph path's shape decisions ------------------------------------------------------------


def test_buckets_respect_frame_budget_and_pool():
    buckets = plan_buckets((1, 2, 4, 8, 16, 32, 64, 128, 256), (1, 2, 4, 8, 16, 25, 32), 512, 100)
    assert all(b * t <= 512 and b <= 100 for b, t in buckets)
    assert (64, 8) in buckets and (16, 32) in buckets and (128, 4) not in buckets
    assert (20, 25) in buckets and (100, 5) not in buckets  # the budget-filling batch per frames bucket


@pytest.mark.parametrize(
    "batch,frames,expect",
    [(1, 1, (1, 1)), (3, 1, (4, 1)), (5, 20, (8, 25)), (16, 25, (16, 25)), (17, 25, (20, 25)), (21, 25, None), (1, 26, (1, 32)), (1, 33, None),
     (64, 3, (64, 4))],
)
def test_pick_bucket_takes_least_padded_work(batch, frames, expect):
    buckets = plan_buckets((1, 2, 4, 8, 16, 32, 64), (1, 2, 4, 8, 16, 25, 32), 512, 64)
    assert pick_bucket(buckets, batch, frames) == expect


def test_small_steps_take_the_priority_stream():
    """Graphs of at most ``priority_step_frames`` padded frames go to the priority pool and stream: the
    first chunks' one-frame steps up to 16 rows, not a lone stream's 25-frame one; 0 turns it off."""
    buckets = plan_buckets(DEFAULT_BATCHES, DEFAULT_FRAMES, 480, 256)
    priority = priority_shapes(buckets, 16)
    assert priority == {(b, t) for b, t in buckets if b * t <= 16}
    assert {(1, 1), (16, 1), (8, 2), (1, 16)} <= priority and not priority & {(32, 1), (1, 25), (16, 25)}
    assert priority_shapes(buckets, 0) == set()


def test_a_slots_work_waits_only_for_the_other_streams_last_touch():
    """SlotOrder: work on a stream waits for the last work on the other stream that touched any
    of its slots (each event once), not for work on its own stream (in order already) nor for
    work that has landed; a slot touched again later is no longer waited on for the old event."""
    order, main, priority = SlotOrder(), object(), object()
    big, small, zeroed = object(), object(), object()
    order.touched([1, 2], main, big)
    assert order.waits([1, 3], main) == []
    assert order.waits([1, 2, 3], priority) == [big]
    order.touched([3], priority, zeroed)
    order.touched([2, 3], priority, small)  # after waiting for big (slot 2)
    assert order.waits([1, 2, 3], main) == [small] and order.waits([1, 2, 3], priority) == [big]
    order.done([1, 2], big)  # the big step landed: slot 2's last is small now, slot 1 has none
    assert order.waits([1, 2], priority) == [] and order.waits([1, 2], main) == [small] and len(order) == 2
    order.done([2, 3], small)
    assert len(order) == 0


class _Stream:
    """A stand-in CUDA stream: counts the waits it is given."""

    def __init__(self) -> None:
        self.waits = 0

    def wait_event(self, event: "_Event") -> None:
        self.waits += 1


class _Event:
    """A stand-in CUDA event on a CPU that runs every op at once: done once synchronized, or
    once ``done_after`` later queries have asked (work left queued for a while)."""

    done_after = 2

    def __init__(self, enable_timing: bool = False) -> None:
        self.asked = 0

    def record(self, stream: object = None) -> None:
        self.asked = 0

    def query(self) -> bool:
        self.asked += 1
        return self.asked > self.done_after

    def synchronize(self) -> None:
        self.asked = self.done_after + 1

    def elapsed_time(self, other: "_Event") -> float:
        return 1.0


def _cuda_stand_ins(monkeypatch) -> tuple[_Stream, _Stream]:
    """The engine's CUDA path on the CPU: stand-in streams (the current one and a second) and
    events, no stream switching, no pinned memory."""
    main, side = _Stream(), _Stream()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **k: real_empty(*a, **k))
    return main, side


@pytest.mark.parametrize("priority", [False, True], ids=["one stream", "priority stream"])
def test_the_cuda_path_keeps_every_streams_audio_exact(monkeypatch, priority):
    """The engine's CUDA path (steps queued ahead, delivered as their events complete; with a
    priority stream, small steps on it, each slot's work waiting for the other stream's last
    touch) run on the CPU with stand-in streams and events (CI has no GPU): ragged chunks of four
    streams, some of them one-frame first chunks, end as each stream's whole-utterance forward,
    and with a priority stream small steps ran on it and cross-stream waits were given."""
    main, side = _cuda_stand_ins(monkeypatch)
    m = model(SMALL, torch.float64)
    e = StreamEngine(m, max_streams=6, max_step_frames=8)
    e.device = torch.device("cuda")  # the CUDA path (pinned copies, events), on stand-ins
    on_side = []
    if priority:
        e.runner.priority_stream = side
        e.runner.stream_for = lambda shape: (on_side.append(shape), side)[1] if shape[0] * shape[1] <= 4 else None
    codes = {f"s{i}": random_codes(30, SMALL, seed=i) for i in range(4)}
    for rid in codes:
        e.open(rid)
    outs, at = {rid: [] for rid in codes}, dict.fromkeys(codes, 0)
    for sizes in ([1, 1, 1, 1], [8, 1, 8, 3], [8, 8, 8, 8], [13, 20, 13, 18]):
        chunk = {}
        for rid, n in zip(codes, sizes):
            n = min(n, 30 - at[rid])
            if n:
                chunk[rid], at[rid] = codes[rid][at[rid] : at[rid] + n], at[rid] + n
        for rid, audio in e.decode(chunk).items():
            outs[rid].append(audio)
    for rid in codes:
        assert at[rid] == 30 and (torch.cat(outs[rid]) - forward_audio(m, codes[rid])).abs().max() < 1e-12
    if priority:
        assert on_side and main.waits + side.waits > 0
    else:
        assert main.waits == side.waits == 0


def test_a_restore_before_the_first_step_goes_where_that_step_runs(monkeypatch):
    """With a priority stream, ``restore_opened`` writes a cached prefix's state on it, where the
    stream's first (small) step runs, as the zeroing of freed slots does: that step then has no
    other stream's work to wait for. The audio is the whole-utterance forward's (stand-in
    streams and events on the CPU, as above)."""
    main, side = _cuda_stand_ins(monkeypatch)
    m = model(SMALL, torch.float64)
    voice, tail = random_codes(12, SMALL, seed=40), random_codes(6, SMALL, seed=41)
    e = StreamEngine(m, max_streams=3, max_step_frames=8, prefix_cache_bytes=64 << 20)
    e.device = torch.device("cuda")
    e.runner.priority_stream = side
    e.runner.stream_for = lambda shape: side if shape[0] * shape[1] <= 4 else None
    stream_alone(e, "warm", torch.cat([voice, tail]), 12, 2, [2])  # the voice in the cache
    e.open("hit", voice)
    e.restore_opened()
    slot = e._streams["hit"].slot
    assert e._order._last[slot][0] is side  # the restore's work: on the priority stream
    waits = side.waits
    first = e.push("hit", tail[:1])
    assert side.waits == waits  # its first (one-frame) step, on the priority stream, waited for nothing
    out = torch.cat([first, e.push("hit", tail[1:])])
    assert (out - forward_audio(m, torch.cat([voice, tail]))[12 * SPF :]).abs().max() < 1e-12


def test_packed_graph_inputs_view_one_buffer_set_to_an_empty_step():
    """A graph's step inputs are views of one int64 buffer (so a step goes up in one copy):
    codes [b, q, t], slots [b], n_new [b], then the restore pairs [b, 2] (one a row), disjoint and
    covering it; before the real rows are written, every row is a scratch row with zero codes
    and no new frames, and no pair names a restore (address 0)."""
    buf, codes, slots, n_new = packed_inputs(3, 5, scratch_slot=7, q=16)
    pairs = restore_pairs(buf, 3, 16, 5)
    assert buf.dtype == torch.long and buf.numel() == 3 * 16 * 5 + 4 * 3
    assert codes.shape == (3, 16, 5) and slots.shape == n_new.shape == (3,) and pairs.shape == (3, 2)
    assert codes.abs().sum() == 0 and slots.tolist() == [7, 7, 7] and n_new.tolist() == [0, 0, 0] and not pairs.any()
    codes[2, 15, 4], slots[0], n_new[2], pairs[0, 1] = 2047, 1, 5, 9  # writes through the views land in the buffer
    assert buf[3 * 16 * 5 - 1] == 2047 and buf[3 * 16 * 5] == 1 and buf[3 * 16 * 5 + 2 * 3 - 1] == 5 and buf[3 * 16 * 5 + 2 * 3 + 1] == 9


def test_packed_base_finds_the_staged_buffer_only_for_its_own_layout():
    """A step staged by ``packed_inputs`` is recognised (so it goes up in one copy); views of
    anything else, or of the buffer in another order, are not."""
    buf, codes, slots, n_new = packed_inputs(2, 3, scratch_slot=5, q=16)
    assert packed_base(codes, slots, n_new) is buf
    assert packed_base(codes, n_new, slots) is None  # swapped views
    assert packed_base(codes[:1], slots[:1], n_new[:1]) is None  # a slice of the step
    assert packed_base(codes.clone(), slots, n_new) is None
    assert packed_base(torch.zeros(2, 16, 3, dtype=torch.long), torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long)) is None


def test_engine_stages_a_group_at_the_runners_padded_shape(m, codes):
    """With a runner that pads every group to 4 rows x 8 frames (as a graph bucket does), the
    engine hands it inputs staged at that shape in one buffer: real rows first, padding rows on
    the scratch slot with no new frames, padding frames zero; the audio stays exact. The buffer
    is reused for the next group of that shape."""
    seen, buffers = [], set()

    class Padding(EagerRunner):
        def padded_shape(self, batch, frames):
            return (4, 8)

        def __call__(self, c, slots, n_new):
            seen.append((c.clone(), slots.tolist(), n_new.tolist(), packed_base(c, slots, n_new) is not None))
            buffers.add(c.data_ptr())
            return super().__call__(c, slots, n_new)

    core = StreamEngine(m, runner=Padding(m, StatePool(m, 3)), policy=SchedulePolicy(group_by_size=False))  # one group of rows of 1, 2 and 3 frames
    for i in range(3):
        core.open(f"s{i}", codes[: 2 * i])
    out = core.decode({f"s{i}": codes[2 * i : 2 * i + 1 + i] for i in range(3)})  # 1, 2 and 3 new frames
    (c, slots, n_new, one_buffer), = seen
    assert c.shape == (4, 16, 8) and one_buffer
    assert slots == [0, 1, 2, core.pool.scratch_slot] and n_new == [1, 2, 3, 0]
    for j in range(3):
        assert torch.equal(c[j, :, : j + 1], codes[2 * j : 2 * j + 1 + j].T) and c[j, :, j + 1 :].abs().sum() == 0
    assert c[3].abs().sum() == 0
    for i in range(3):
        assert out[f"s{i}"].shape == ((1 + i) * SPF,)
        assert (out[f"s{i}"] - forward_audio(m, codes[: 3 * i + 1])[2 * i * SPF :]).abs().max() <= 1e-9
    # The next group of that shape reuses the buffer, reset: nothing of the last group is left.
    out = core.decode({"s1": codes[4:5]})
    c2, slots, n_new, _ = seen[1]
    assert slots == [1] + [core.pool.scratch_slot] * 3 and n_new == [1, 0, 0, 0]
    assert torch.equal(c2[0, :, :1], codes[4:5].T) and c2[0, :, 1:].abs().sum() == 0 and c2[1:].abs().sum() == 0
    assert (out["s1"] - forward_audio(m, codes[:5])[4 * SPF :]).abs().max() <= 1e-9
    assert len(seen) == 2 and len(buffers) == 1  # one buffer, staged twice


def test_rows_grouped_under_the_frame_budget():
    take = {0: 25, 1: 1, 2: 25, 3: 25, 4: 3}
    budget = lambda frames: max(1, 50 // frames)  # noqa: E731
    groups = split_groups([0, 1, 2, 3, 4], take, budget)
    assert [i for g in groups for i in g] == [0, 1, 2, 3, 4]  # order kept, nothing dropped
    assert all(len(g) * max(take[i] for i in g) <= 50 for g in groups)
    assert split_groups([0], {0: 64}, budget) == [[0]]  # a single row always runs


def test_bench_command_reports_every_mode_and_level(tmp_path, capsys):
    """``code2wav bench`` on CPU: every eager mode at every level and prefix, all audio accounted
    for (streams x frames x 1920 samples), results written as JSON and printed as a table."""
    import json

    from code2wav.cli import main
    from tests.models import write_checkpoint

    ckpt = write_checkpoint(tmp_path / "tok")
    out = tmp_path / "out"
    args = ["bench", "--model", str(ckpt), "--device", "cpu", "--dtype", "float64", "--levels", "1,3", "--frames", "5",
            "--chunks", "1,2", "--prefix", "0,3", "--modes", "exact-eager,windowed,full", "--stagger-ms", "0", "--out", str(out)]
    assert main(args) == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    assert {(r["mode"], r["concurrency"], r["prefix_frames"]) for r in rows} == {
        (m, c, p) for m in ("exact-eager", "windowed", "full") for c in (1, 3) for p in (0, 3)
    }
    for r in rows:
        assert r["audio_s"] == pytest.approx(r["concurrency"] * 5 * SPF / 24000)
        assert r["throughput_x"] > 0 and r["ttfp_p50_ms"] <= r["ttfp_p99_ms"]
        assert 0 < r["chunk_p50_ms"] <= r["chunk_p99_ms"]  # every chunk (1, 2, 2): push -> audio
        assert (r["mem_state_pool_mb"] > 0) == (r["mode"] == "exact-eager")
        assert r["host_cpu_us"] > 0  # the process's CPU time per stream (a decode on CPU spends some)
    printed = capsys.readouterr().out
    assert "exact-eager" in printed and "CPU us" in printed


def test_bench_runs_eager_levels_warm_when_asked(m, monkeypatch):
    """``warm_eager``: an eager mode runs each level's workload once untimed (other stream ids,
    the same concurrency and schedule) right before the timed run, and reports the timed run
    alone; without it each level runs once."""
    from code2wav import bench

    calls = []
    real = bench._workload

    async def recorded(core, c, frames, schedule, prefix, stagger, seed, **kw):
        calls.append((c, seed))
        return await real(core, c, frames, schedule, prefix, stagger, seed, **kw)

    monkeypatch.setattr(bench, "_workload", recorded)
    res = bench.run(m, ["windowed"], [1, 3], frames=3, schedule=[1, 2], stagger_s=0.0, max_batch_frames=32, progress=False, warm_eager=True)
    assert calls[1:] == [(1, 1001), (1, 1), (3, 1003), (3, 3)]  # after the engine's short warm-up
    assert [r.audio_s for r in res] == pytest.approx([c * 3 * SPF / 24000 for c in (1, 3)])  # the timed runs' audio only
    calls.clear()
    bench.run(m, ["windowed"], [1, 3], frames=3, schedule=[1, 2], stagger_s=0.0, max_batch_frames=32, progress=False)
    assert calls[1:] == [(1, 1), (3, 3)]  # on CPU the default is off


def test_bench_sustained_load_measures_a_window(m, monkeypatch):
    """``--seconds``: every worker opens stream after stream; only the window after all workers
    started is measured, so the audio counted is what completed in it, and more streams than
    workers have run by the end, each decoded in full or cut at the window's close. The bench's
    clock is one that each step moves by 50 ms: the 0.6 s window holds about 12 steps however
    fast this machine runs them (each step decodes at least one chunk, so at least 6 streams'
    two chunks land in it)."""
    from code2wav import bench

    clock = VirtualClock(0.05)
    monkeypatch.setattr(bench, "time", clock)
    core = StreamEngine(m, runner=Spy(m, 3, clock.step), max_step_frames=8, max_batch_frames=32)
    res = asyncio.run(bench._workload(core, 3, 6, [1, 5], 0, 0.01, seed=1, seconds=0.6))
    assert res.wall == 0.6 and clock.now > 0.6 + 2 * 0.01  # the window closed at its end, on the bench's clock
    assert res.streams > 3 and len(res.ttfp) >= 3 and len(res.chunk) >= len(res.ttfp)
    assert res.samples > 0 and res.samples % SPF == 0
    assert res.samples <= res.streams * 6 * SPF
    assert res.steps and all(s > 0 for s in res.steps)
    assert core.active == 0 and core.pool.in_use == 0  # every stream finished, every slot back


def test_bench_warms_every_voice_before_the_timed_run(m):
    """``--voices 6 --prefix 3`` with the prefix cache on: the untimed warm-up opens one stream
    per voice (6 voices over its 4 workers: two runs), so every stream of the timed run (6
    workers, voices 0-5) finds its voice cached, as in a service whose clone voices were heard
    before."""
    from code2wav import bench

    base = EngineConfig(prefix_cache_bytes=10**8)
    rows = bench.run(m, ["exact-eager"], [6], frames=3, schedule=[1, 2], prefixes=(3,), stagger_s=0.0, progress=False,
                     warm_eager=False, base=base, voices=6)
    assert rows[0].prefix_hit_pct == 100.0 and rows[0].streams == 6
    assert rows[0].prefix_alone_pct == 100.0  # on CPU every restore is a launch of its own (no restores_in_step)
    cold = bench.run(m, ["exact-eager"], [6], frames=3, schedule=[1, 2], prefixes=(3,), stagger_s=0.0, progress=False,
                     warm_eager=False, base=base, voices=0)  # each stream its own prefix: nothing to warm
    assert cold[0].prefix_hit_pct == 0.0 and math.isnan(cold[0].prefix_alone_pct)  # no hit: nothing restored


def test_bench_runs_each_level_once_per_first_chunk_wait(m, monkeypatch):
    """``--first-chunk-wait-ms 0,5``: each level runs once per value on one engine, the engine
    set to that value for the run, and each result names its value (None: the engine's default)."""
    import code2wav.bench as bench

    seen = []
    real = bench._workload

    async def workload(core, *a, **k):
        seen.append(core.policy.first_chunk_wait)
        return await real(core, *a, **k)

    monkeypatch.setattr(bench, "_workload", workload)
    rows = bench.run(m, ["exact-eager"], [1, 2], frames=3, schedule=[1, 2], stagger_s=0.0, progress=False,
                     first_chunk_waits=(0.0, 0.005, None))
    d = SchedulePolicy().first_chunk_wait
    assert [(r.concurrency, r.first_chunk_wait_ms) for r in rows] == [(1, 0.0), (1, 5.0), (1, d * 1e3), (2, 0.0), (2, 5.0), (2, d * 1e3)]
    assert seen[1:] == [0.0, 0.005, d, 0.0, 0.005, d]  # the first is the untimed warm-up run
    assert all(r.audio_s == r.concurrency * 3 * SPF / 24000 for r in rows)


def test_bench_reports_the_share_of_padded_work(m):
    """With a runner that counts its replayed work (a GraphRunner), the bench reports which share
    of it was padding, between the window's first and last forwards: here every forward is
    padded to 8 frames a row."""
    from code2wav.bench import Result, _padding_pct, _workload, table

    class Padded(EagerRunner):
        padded_frames = frames = 0

        def __init__(self, *a):
            super().__init__(*a)
            self.calls = []

        def __call__(self, codes, slots, n_new):
            self.calls.append((codes.shape[0] * 8, int(n_new.sum())))  # as if every forward replayed an (rows, 8) bucket
            self.padded_frames += self.calls[-1][0]
            self.frames += self.calls[-1][1]
            return super().__call__(codes, slots, n_new)

        def stats(self):
            return {"padded_frames": self.padded_frames, "frames": self.frames}

    runner = Padded(m, StatePool(m, 2))
    core = StreamEngine(m, runner=runner, max_step_frames=8, max_batch_frames=8)  # one row per forward
    res = asyncio.run(_workload(core, 2, 6, [1, 5], 0, 0.0, seed=2))
    # Forwards: the first chunks (1 frame; together or apart, as they reach the worker), then
    # each 5-frame chunk alone. Between the first forward and the last: every later forward.
    later = runner.calls[1:]
    assert len(later) >= 2 and sum(r for _, r in later) == 1 + 1 + 5 + 5 - runner.calls[0][1]
    assert _padding_pct(res.work) == pytest.approx(100 * (1 - sum(r for _, r in later) / sum(p for p, _ in later)))
    assert np.isnan(_padding_pct(res.work[:1]))  # one forward: nothing between first and last
    fields = {f: 0 for f in Result.__dataclass_fields__} | {"mode": "exact-graph", "padding_pct": 54.2}
    assert "54.2" in table([Result(**fields)])


def test_bench_reports_the_time_share_of_first_chunk_sized_steps(m, monkeypatch):
    """``small_steps_pct``: the share of step time spent in forwards of at most 8 padded frames a
    row (the first chunks' size class), each forward's width as the engine reports it with its
    time (not read from a running count, which a pipelined next group has already moved)."""
    import functools

    from code2wav import bench
    from code2wav.bench import _small_steps_pct, _workload

    assert _small_steps_pct([0.001, 0.002, 0.003, 0.004], [1, 25, 8, 9]) == pytest.approx(100 * 0.004 / 0.010)
    assert np.isnan(_small_steps_pct([], []))
    ran = []  # (rows, frames a row) of every forward, as the runner saw it
    core = StreamEngine(m, runner=Spy(m, 2, lambda c, slots, n_new: ran.append((c.shape[0], c.shape[-1]))), max_step_frames=8, max_batch_frames=8)
    # Both first chunks are queued before the worker takes any (otherwise whether they share a
    # forward depends on when the worker thread wakes).
    monkeypatch.setattr(bench, "AsyncEngine", functools.partial(GatherFirst, first=2))
    res = asyncio.run(_workload(core, 2, 6, [1, 5], 0, 0.0, seed=2))
    assert list(zip(res.rows, res.widths)) == ran == [(2, 1), (1, 5), (1, 5)]  # both first chunks, then each 5-frame chunk


def test_bench_paced_talkers_count_the_stalls_the_decoder_adds(m, monkeypatch):
    """``--pace``: each chunk is pushed when a talker at that speed has its frames, not when the
    last audio is back; per stream we keep the playback stall the decoder adds beyond the
    talker's own (here the talker alone stalls the listener for 120 ms after the 1-frame first
    chunk). A decoder that answers at once adds no more than its own delay; one that takes 100
    ms per 5-frame chunk adds about that. Checked against each stream's push and audio times as
    the bench saw them, so that no bound depends on how fast this machine runs."""
    import time

    from code2wav import bench
    from code2wav.bench import _workload, playback_stall

    assert playback_stall((0.0, 0.05, 0.3), (1, 1, 1), 12.5) == pytest.approx(0.14)  # 80 ms frames
    assert playback_stall((0.0, 0.05, 0.1), (1, 1, 1), 12.5) == 0.0
    seen: list[tuple[float, ...]] = []  # every playback_stall call's arrivals: per stream, audio times then push times
    monkeypatch.setattr(bench, "playback_stall", lambda arrivals, frames, fps: (seen.append(arrivals), playback_stall(arrivals, frames, fps))[1])

    def run(slow: bool):  # the runner returns silence at once, or after 100 ms for 5 frames
        silence = lambda c, slots, n_new: (time.sleep(0.1) if slow and c.shape[-1] == 5 else None, torch.zeros(c.shape[0], c.shape[-1] * SPF))[1]  # noqa: E731
        core = StreamEngine(m, runner=Spy(m, 2, silence))
        seen.clear()
        t0 = time.perf_counter()
        res = asyncio.run(_workload(core, 2, 6, [1, 5], 0, 0.0, seed=3, pace=2.0))  # chunks due at 40 and 240 ms
        streams = [(pushed, landed) for landed, pushed in zip(seen[0::2], seen[1::2])]
        assert len(res.stalls) == len(res.ttfp) == len(streams) == 2
        for (pushed, landed), stall, ttfp in zip(streams, res.stalls, res.ttfp):
            assert landed[0] - pushed[0] == pytest.approx(ttfp, abs=1e-9)
            assert stall == max(0.0, playback_stall(landed, (1, 5), 12.5) - playback_stall(pushed, (1, 5), 12.5))
        return res, streams, time.perf_counter() - t0

    fast, streams, took = run(slow=False)
    assert took >= 0.24  # the talkers' pace (a lower bound)
    for (pushed, landed), stall in zip(streams, fast.stalls):
        assert stall <= landed[1] - pushed[1] + 1e-9  # at most the decoder's own delay of the second chunk
    slow, streams, _ = run(slow=True)
    for (pushed, landed), stall, ttfp in zip(streams, slow.stalls, slow.ttfp):
        assert landed[1] - pushed[1] >= 0.1
        # The 100 ms, less what the first chunk's audio was late itself, less any part of the
        # talker's own 120 ms gap that a late first push took away.
        assert stall >= 0.1 - ttfp + min(0.0, pushed[1] - pushed[0] - 0.08) - 1e-9, (stall, ttfp, pushed)
    assert fast.samples == slow.samples == 2 * 6 * SPF


def test_engine_never_exceeds_the_runners_buckets(m, codes):
    """With a graph-like runner (largest bucket 4 frames, at most 2 rows), a step over 5 streams
    with 11-frame chunks is cut into pieces every call of which the runner holds, and stays exact."""
    shapes = []

    class Runner(EagerRunner):
        max_frames = 4

        def max_rows(self, frames):
            return 2

        def __call__(self, c, slots, n_new):
            shapes.append(tuple(c.shape))
            return super().__call__(c, slots, n_new)

    core = StreamEngine(m, runner=Runner(m, StatePool(m, 5)))
    for i in range(5):
        core.open(f"s{i}", codes[: 3 * i])
    out = core.decode({f"s{i}": codes[3 * i : 3 * i + 11] for i in range(5)})
    assert shapes and all(b <= 2 and t <= 4 for b, _, t in shapes)
    ref = forward_audio(m, codes[:23])
    for i in range(5):
        assert (out[f"s{i}"] - ref[3 * i * SPF : (3 * i + 11) * SPF]).abs().max() <= 1e-9


def test_hand_over_wakes_the_loop_once_per_batch(m):
    """The worker hands results to the loop in batches: results queued while the loop has not run
    yet share one ``call_soon_threadsafe`` (one self-pipe write, one loop iteration), and settle in
    the order they were handed over; a result handed over after that batch ran wakes it again."""
    import threading

    async def main():
        core = StreamEngine(m, max_step_frames=8, max_batch_frames=8)
        async with AsyncEngine(core) as eng:
            loop = asyncio.get_running_loop()
            wakes: list[object] = []
            real = loop.call_soon_threadsafe
            loop.call_soon_threadsafe = lambda cb, *a, **k: (wakes.append(cb), real(cb, *a, **k))[1]  # type: ignore[method-assign]
            futs = [loop.create_future() for _ in range(5)]
            settled: list[int] = []
            for i, f in enumerate(futs):
                f.add_done_callback(lambda f, i=i: settled.append(i))
            t = threading.Thread(target=lambda: [eng._hand_over(f, i) for i, f in enumerate(futs[:4])])
            t.start()
            t.join()  # the loop is blocked meanwhile: all four wait for one wake-up
            assert await asyncio.gather(*futs[:4]) == [0, 1, 2, 3]
            t = threading.Thread(target=lambda: eng._hand_over(futs[4], ValueError("row failed")))
            t.start()
            t.join()
            with pytest.raises(ValueError):
                await futs[4]
            del loop.call_soon_threadsafe
            return len(wakes), settled

    n, settled = asyncio.run(main())
    assert n == 2 and settled == [0, 1, 2, 3, 4]
