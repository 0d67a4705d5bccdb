"""The scheduler alone: which rows share the next step. Pure host policy, tested without torch
(rows carry stand-in frames with a ``shape``; the engine's tests check the same rules end to end)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

from code2wav.stream.rows import Row, Stream
from code2wav.stream.schedule import SchedulePolicy, Scheduler, size_class, split_groups


@dataclass
class Frames:  # what the scheduler reads of a chunk: its frame count
    n: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, 16)


def rows(*specs: tuple[int, int, bool], now: float = 0.0) -> list[Row]:
    """(slot, frames, first) -> rows of streams named by slot."""
    return [Row(Stream(f"s{slot}", slot), Frames(n), first=first, gathers=first, admitted=now) for slot, n, first in specs]


def scheduler(policy: SchedulePolicy | None = None, piece: int = 32, budget: int = 64, clock=lambda: 0.0) -> Scheduler:
    return Scheduler(policy or SchedulePolicy(first_chunk_wait=0.0), piece, lambda frames: max(1, budget // frames), clock)


def take(s: Scheduler, idle: bool = False) -> list[tuple[int, int]]:
    g = s.next_group(lambda st: True, lambda r: None, device_idle=idle)
    return [(r.slot, k) for r, k in zip(g.rows, g.pieces)]


def test_the_scheduler_does_not_need_torch():
    code = "import sys, code2wav.stream.schedule, code2wav.stream.rows; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_size_classes_and_budget_splits():
    assert [size_class(n) for n in (1, 2, 3, 5, 25, 32)] == [1, 2, 4, 8, 32, 32]
    assert size_class(5, floor=True) == 4 and size_class(8, floor=True) == 8
    assert split_groups([0, 1, 2], {0: 8, 1: 8, 2: 8}, lambda f: 16 // f) == [[0, 1], [2]]


def test_first_chunks_go_first_and_each_group_holds_one_size_class():
    s = scheduler()
    s.enqueue(rows((0, 25, False), (1, 25, False), (2, 1, True), (3, 1, True)))
    assert take(s) == [(2, 1), (3, 1)]  # first chunks at the front, 1-frame class alone
    assert take(s) == [(0, 25), (1, 25)]
    assert not s


def test_a_streams_rows_run_in_order_and_long_rows_in_pieces():
    s = scheduler(piece=8)
    a, later = rows((0, 20, False), (0, 3, False))
    s.enqueue([a, later])
    assert take(s) == [(0, 8)]  # one row per stream per step; the second row waits
    a.done = 8
    s.requeue([a])
    assert take(s) == [(0, 8)]
    a.done = 16
    s.requeue([a])
    assert take(s) == [(0, 4)]  # the last piece of the first row, then the next row
    assert take(s) == [(0, 3)]


def test_the_budget_and_the_runner_cut_groups():
    s = scheduler(budget=48)
    s.enqueue(rows(*((i, 16, False) for i in range(5))))
    assert [slot for slot, _ in take(s)] == [0, 1, 2]  # 3 x 16 = 48
    assert [slot for slot, _ in take(s)] == [3, 4]


def test_ended_streams_rows_leave_the_queue():
    s = scheduler()
    queued = rows((0, 4, False), (1, 4, False))
    s.enqueue(queued)
    dropped: list[int] = []
    g = s.next_group(lambda st: st.slot != 0, lambda r: dropped.append(r.slot), device_idle=False)
    assert [r.slot for r in g.rows] == [1] and dropped == [0]


def test_first_chunks_gather_only_while_the_device_is_saturated():
    """One-row steps (budget 2 frames at 2 frames a row): two playing rows saturate the next
    step, so the first chunk waits; once it has waited ``first_chunk_wait`` it runs."""
    t = [0.0]
    policy = SchedulePolicy(first_chunk_wait=0.005)
    s = scheduler(policy, budget=2, clock=lambda: t[0])
    s.enqueue(rows((0, 2, False), (1, 2, False)) + rows((2, 1, True), now=0.0))
    assert take(s) == [(0, 2)]  # the first chunk (slot 2) waits: the device is saturated
    t[0] = 0.006
    assert take(s) == [(2, 1)]  # it has waited long enough
    s = scheduler(policy, budget=64, clock=lambda: 0.0)
    s.enqueue(rows((0, 2, False), (1, 2, False)) + rows((2, 1, True)))
    assert take(s) == [(2, 1)]  # room for everyone: no waiting


def test_split_lone_group_halves_a_group_that_took_every_ready_row_on_an_idle_device():
    s = scheduler(SchedulePolicy(first_chunk_wait=0.0, split_lone_group=True))
    s.enqueue(rows(*((i, 4, False) for i in range(4))))
    assert [slot for slot, _ in take(s, idle=True)] == [0, 1]
    assert [slot for slot, _ in take(s, idle=True)] == [2, 3]  # the second half runs whole
