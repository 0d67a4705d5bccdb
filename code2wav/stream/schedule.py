"""Which rows the next step decodes: pure host policy over a queue of rows (no torch, no device).

The engine queues rows (first chunks at the front: a stream with nothing playing waits for one
step, while streams already playing have seconds of audio in hand; the same work in another
order, so throughput is unchanged) and asks for one group per step. A group holds:
- one row per stream (a stream's rows run in order; its later rows keep their places);
- with ``group_by_size``, only rows whose piece is in the head's size class (the power of two its
  frames round up to), so a 1-frame first chunk is not padded to a 25-frame row's length;
- as many rows as the runner holds at the group's widest piece (a graph bucket), or else the
  frame budget (``max_batch_frames`` padded frames a step).
First chunks *gather* while the device is saturated (see ``_gathering``), and with
``split_lone_group`` a group that would take every ready row on an idle device runs as two
halves, so that the second half runs while the first one's audio is delivered.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from code2wav.stream.rows import Row, Stream


@dataclass(frozen=True)
class SchedulePolicy:
    # One size class of piece per step (False: any sizes share a step, padded to the widest).
    group_by_size: bool = True
    # On an idle device, run a group that took every ready row as two halves.
    split_lone_group: bool = False
    # While the device is saturated (more rows of playing streams wait than the next step
    # holds), a first chunk waits up to this many seconds (or until ``first_chunk_rows`` of them
    # wait) so that several share one step instead of each costing a step for a few frames of
    # audio. Below saturation a first chunk runs in the next step: waiting would buy nothing.
    # First chunks of streams with a reference prefix never wait: their prefill batches them
    # (one whose state comes from the prefix cache had no prefill, and waits as a fresh one does).
    first_chunk_wait: float = 0.005
    first_chunk_rows: int = 16
    # On CUDA, steps left queued on the device while the host delivers an earlier one's audio
    # and stages the next: more keep the device busy through longer host pauses (the service's
    # worker waiting for the GIL while the event loop sends audio). It only matters while more
    # rows are ready than a step holds; a row's next chunk may then join a step later.
    steps_ahead: int = 2

    def __post_init__(self) -> None:
        if self.first_chunk_wait < 0:
            raise ValueError(f"first_chunk_wait must be >= 0, got {self.first_chunk_wait}")
        if self.first_chunk_rows < 1:
            raise ValueError(f"first_chunk_rows must be >= 1, got {self.first_chunk_rows}")
        if self.steps_ahead < 1:
            raise ValueError(f"steps_ahead must be >= 1, got {self.steps_ahead}")


@dataclass
class Group:
    """The rows of one step and each row's piece (frames launched in this step)."""

    rows: list[Row] = field(default_factory=list)
    pieces: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)


def size_class(n: int, floor: bool = False) -> int:
    """``n`` rounded to a power of two (up, or down with ``floor``)."""
    p = 1 << (n - 1).bit_length()
    return p // 2 if floor and p > n else p


def split_groups(rows: list[int], take: dict[int, int], max_rows: Callable[[int], int]) -> list[list[int]]:
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


class Scheduler:
    """The queue of rows one ``StreamEngine.decode`` call works through, and the policy that cuts
    it into groups. ``piece``: the most frames a row launches in one step; ``max_rows(frames)``:
    the most rows one step holds at that many frames a row."""

    def __init__(self, policy: SchedulePolicy, piece: int, max_rows: Callable[[int], int],
                 clock: Callable[[], float] | None = None):
        self.policy = policy
        self.piece = piece
        self.max_rows = max_rows
        self.clock = clock  # None: time.monotonic, looked up per call
        self.queue: deque[Row] = deque()
        self._halved = False  # the last group was the first half of a split one

    def __bool__(self) -> bool:
        return bool(self.queue)

    def reset(self, piece: int | None = None) -> None:
        """An empty queue for the next decode (and its piece size, if it changed)."""
        self.piece = piece or self.piece
        self.queue.clear()
        self._halved = False

    def enqueue(self, rows: Iterable[Row]) -> None:
        """New rows: first chunks to the front (in order), the others to the back."""
        rows = list(rows)
        self.queue.extendleft(reversed([r for r in rows if r.first]))
        self.queue.extend(r for r in rows if not r.first)

    def requeue(self, rows: list[Row]) -> None:
        """Rows with frames left after a step: at the front, ahead of their streams' later rows."""
        self.queue.extendleft(reversed(rows))

    def next_group(self, is_live: Callable[[Stream], bool], dropped: Callable[[Row], None], device_idle: bool) -> Group:
        """The next step's group from the queue's head. Rows of streams that ended meanwhile
        (``not is_live``) leave the queue through ``dropped``. ``device_idle``: nothing of the
        engine runs on the device now (``split_lone_group`` applies only then)."""
        rows, full = self._take(is_live, dropped, self._gathering())
        split = self.policy.split_lone_group and device_idle and not self._halved and len(rows) > 1 and not full
        if split:  # the group took every ready row it could (the budget did not cut it)
            h = (len(rows) + 1) // 2
            self.queue.extendleft(reversed(rows[h:]))  # at the front: each stream's order holds
            rows = rows[:h]
        self._halved = split
        return Group(rows, [r.next_piece(self.piece) for r in rows])

    def _gathering(self) -> set[int]:
        """Slots of the first chunks at the queue's head that wait for more to join them: none
        once enough wait, once the oldest has waited long enough, or unless other streams' rows
        fill the next step and more wait behind it."""
        p, queue = self.policy, self.queue
        if p.first_chunk_wait <= 0 or len(queue) < 2 or not queue[0].gathers:  # one row cannot saturate
            return set()
        firsts = list(itertools.takewhile(lambda r: r.gathers, queue))
        now = self.clock() if self.clock is not None else time.monotonic()
        if len(firsts) >= p.first_chunk_rows or now - min(r.admitted for r in firsts) >= p.first_chunk_wait:
            return set()
        held = {r.slot for r in firsts}
        others, room = 0, 0  # rows of other streams; what the next step holds (read at the first)
        for r in itertools.islice(queue, len(firsts), None):  # stops after ~one step's rows
            if r.slot not in held:
                room = room or self.max_rows(r.next_piece(self.piece))
                others += 1
                if others > room:
                    return held
        return set()

    def _take(self, is_live: Callable[[Stream], bool], dropped: Callable[[Row], None], held: set[int]) -> tuple[list[Row], bool]:
        """Rows for one step, and whether the budget cut the group (a row that could have joined
        was left for lack of room). Rows of ``held`` slots keep their places, as do rows of
        another size class and the same stream's later rows (each stream's order holds)."""
        by_size = self.policy.group_by_size
        group: list[Row] = []
        slots: set[int] = set()
        passed: list[Row] = []  # left in the queue, in order
        cls, widest, full = None, 0, False
        queue = self.queue
        while queue:
            r = queue.popleft()
            if not is_live(r.stream):  # aborted: its slot may be someone else's now
                dropped(r)
                continue
            if r.slot in held:
                passed.append(r)
                continue
            n = r.next_piece(self.piece)
            if r.slot in slots or (by_size and cls is not None and size_class(n) != cls):
                if not by_size:  # the same stream's next rows wait for this one's
                    queue.appendleft(r)
                    break
                passed.append(r)
                slots.add(r.slot)
                continue
            if group and len(group) + 1 > self.max_rows(max(widest, n)):
                queue.appendleft(r)
                full = True
                break
            group.append(r)
            slots.add(r.slot)
            cls, widest = size_class(n), max(widest, n)
        queue.extendleft(reversed(passed))
        return group, full
