"""Stream lifecycle and bad input: clear typed errors, other streams untouched, nothing leaks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from code2wav.codes import CodesError
from code2wav.stream.engine import StreamEngine
from code2wav.stream.pool import PoolFull
from code2wav.stream.rows import StreamError
from tests.models import SMALL, forward_audio, random_codes

SPF = 1920


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def m(small_f64):
    return small_f64


@pytest.fixture(scope="module")
def codes():
    return random_codes(400, SMALL, seed=11)


def good_run(m, codes, bad_calls) -> dict[str, list[torch.Tensor]]:
    """Streams A (no prefix) and B (prefix 30) step together for 6 rounds; ``bad_calls(engine,
    round)`` is invoked between rounds and may return extra (bad) rows for that round's step."""
    e = StreamEngine(m, max_streams=3)
    e.open("A")
    e.open("B", codes[:30])
    out: dict[str, list[torch.Tensor]] = {"A": [], "B": []}
    for r in range(6):
        extra = bad_calls(e, r) or {}
        rows = {"A": codes[100 + 5 * r : 105 + 5 * r]}
        rows.update(extra)  # bad rows sit between good rows
        rows["B"] = codes[30 + 3 * r : 33 + 3 * r]
        res = e.decode(rows)
        for rid in extra:
            assert isinstance(res[rid], (StreamError, CodesError)), rid
        out["A"].append(res["A"])
        out["B"].append(res["B"])
    return out


BAD_ROWS = {
    "out of range high": (lambda c: np.full((2, 16), 2048), "out_of_range", "2048"),
    "negative code": (lambda c: -np.ones((1, 16), dtype=np.int64), "out_of_range", "-1"),
    "wrong width": (lambda c: np.zeros((3, 8), dtype=np.int64), "bad_shape", "[3, 8]"),
    "transposed": (lambda c: np.zeros((16, 3), dtype=np.int64), "bad_shape", "[16, 3]"),
    "float codes": (lambda c: np.zeros((2, 16), dtype=np.float32), "bad_dtype", "float"),
    "empty": (lambda c: np.zeros((0, 16), dtype=np.int64), "empty", "no frames"),
    "ragged list": (lambda c: [[1] * 16, [2] * 15], "bad_shape", "rectangular"),
    "3-d": (lambda c: np.zeros((1, 2, 16), dtype=np.int64), "bad_shape", "[1, 2, 16]"),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_bad_row_rejected_alone_others_bit_identical(m, codes, case):
    make, code, words = BAD_ROWS[case]
    clean = good_run(m, codes, lambda e, r: None)

    def bad(e, r):
        if r == 0:
            e.open("C")
        if r in (0, 3):
            return {"C": make(codes)}
        return None

    dirty = good_run(m, codes, bad)
    for rid in ("A", "B"):
        for a, b in zip(clean[rid], dirty[rid]):
            assert torch.equal(a, b), f"{case} changed stream {rid}"
    e = StreamEngine(m, max_streams=1)
    e.open("C")
    with pytest.raises(CodesError) as err:
        e.push("C", make(codes))
    assert err.value.code == code and words in str(err.value) and "'C'" in str(err.value)


def test_lifecycle_errors_name_what_was_wrong(m, codes):
    e = StreamEngine(m, max_streams=2)
    e.open("a")
    with pytest.raises(StreamError, match="already open") as err:
        e.open("a")
    assert err.value.code == "duplicate_request_id"
    with pytest.raises(StreamError, match="no open stream 'nope'") as err:
        e.push("nope", codes[:1])
    assert err.value.code == "unknown_request_id"
    e.push("a", codes[:2])
    e.finish("a", codes[2:3])
    with pytest.raises(StreamError, match="'a' already finished") as err:
        e.push("a", codes[:1])
    assert err.value.code == "stream_ended"
    e.open("b")
    e.abort("b")
    with pytest.raises(StreamError, match="'b' already aborted"):
        e.finish("b")
    with pytest.raises(StreamError, match="non-empty string"):
        e.open("")
    with pytest.raises(CodesError, match="prefix"):
        e.open("c", np.full((4, 16), 5000))
    assert e.active == 0 and e.pool.in_use == 0, "a rejected open takes no slot"
    e.open("a")  # an ended id may be reused by a new stream
    assert e.push("a", codes[:1]).shape == (SPF,)


def test_full_pool_is_a_typed_refusal_not_an_eviction(m, codes):
    e = StreamEngine(m, max_streams=2)
    e.open("a")
    e.open("b")
    before = e.push("a", codes[:3])
    with pytest.raises(PoolFull, match="'c'.*all 2 stream slots"):
        e.open("c")
    assert e.active == 2
    e.abort("b")
    e.open("c")
    ref = forward_audio(m, codes[:6])
    after = e.push("a", codes[3:6])
    assert (torch.cat([before, after]) - ref).abs().max() <= 1e-9, "stream a was not disturbed"


def test_finish_returns_rest_and_frees(m, codes):
    e = StreamEngine(m, max_streams=1)
    e.open("a", codes[:5])
    head = e.push("a", codes[5:9])
    tail = e.finish("a", codes[9:12])
    ref = forward_audio(m, codes[:12])[5 * SPF :]
    assert (torch.cat([head, tail]) - ref).abs().max() <= 1e-9
    assert e.pool.in_use == 0
    e.open("b")  # the slot is reusable and starts cold
    assert (e.push("b", codes[:2]) - forward_audio(m, codes[:2])).abs().max() <= 1e-9


def test_failed_finish_still_frees(m, codes):
    e = StreamEngine(m, max_streams=1)
    e.open("a")
    with pytest.raises(CodesError):
        e.finish("a", np.full((1, 16), 9999))
    assert e.active == 0 and e.pool.in_use == 0


def test_idle_streams_are_reaped(m, codes):
    e = StreamEngine(m, max_streams=2, idle_timeout=5.0)
    e.open("old")
    e.open("new")
    t0 = e._streams["old"].last_active
    e._streams["new"].last_active = t0 + 4.0
    assert e.reap_idle(now=t0 + 6.0) == ["old"]
    assert e.active == 1
    with pytest.raises(StreamError, match="'old' already timed out"):
        e.push("old", codes[:1])


def test_ten_thousand_cycles_leave_nothing_behind(m, codes):
    """open / push / abort 10,000 times: the pool is empty after, the ended-id record stays
    bounded, and process memory is flat (no per-stream leak)."""
    e = StreamEngine(m, max_streams=4)

    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    def cycles(n: int, offset: int) -> None:
        for i in range(n):
            rid = f"s{offset + i}"
            e.open(rid, codes[:2] if i % 7 == 0 else None)
            if i % 10 == 0:  # a real decode on every tenth keeps the loop quick
                e.push(rid, codes[:1])
            e.abort(rid)

    cycles(1000, 0)  # warm-up: allocator pools reach steady state
    base = rss_mb()
    cycles(9000, 1000)
    assert e.active == 0 and e.pool.in_use == 0
    assert len(e._ended) <= 4096
    assert rss_mb() - base < 20, "memory grew over 9,000 cycles"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prefix=st.integers(0, 90),
    schedule=st.lists(st.integers(1, 30), min_size=1, max_size=12),
    total=st.integers(1, 110),
)
def test_property_any_schedule_any_prefix_is_exact(m, codes, prefix, schedule, total):
    ref = forward_audio(m, codes[: prefix + total])[prefix * SPF :]
    e = StreamEngine(m, max_streams=1, max_step_frames=24)
    e.open("s", codes[:prefix])
    out, at, i = [], prefix, 0
    while at < prefix + total:
        size = min(schedule[min(i, len(schedule) - 1)], prefix + total - at)
        out.append(e.push("s", codes[at : at + size]))
        at, i = at + size, i + 1
    e.finish("s")
    got = torch.cat(out)
    assert got.shape == ref.shape
    assert (got - ref).abs().max() <= 1e-9
