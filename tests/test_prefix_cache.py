"""The prefix cache: a stream opening with a reference prefix already prefilled starts from a copy
of that state, and its audio is the whole-utterance forward's, hit and miss alike (float64)."""

from __future__ import annotations

import pytest
import torch

from code2wav.stream.engine import StreamEngine
from code2wav.stream.prefix_cache import PrefixCache
from tests.models import SMALL, forward_audio, model, one_thread, random_codes, stream_alone

SPF = 1920


def test_hits_and_misses_equal_the_forward():
    m = model(SMALL, torch.float64)
    voice = random_codes(40, SMALL, seed=5)  # the reference both requests clone
    a = torch.cat([voice, random_codes(30, SMALL, seed=6)])
    b = torch.cat([voice, random_codes(30, SMALL, seed=7)])
    with one_thread():
        engine = StreamEngine(m, max_streams=3, prefix_cache_bytes=64 << 20)
        got_a = stream_alone(engine, "a", a, 40, 30, [1, 4, 25])  # a miss: prefilled, then kept
        got_b = stream_alone(engine, "b", b, 40, 30, [3, 27])  # a hit: the state copied into another slot
        ref_a, ref_b = forward_audio(m, a)[40 * SPF :], forward_audio(m, b)[40 * SPF :]
    assert (got_a - ref_a).abs().max() <= 1e-9 and (got_b - ref_b).abs().max() <= 1e-9
    stats = engine.prefix_cache_stats()
    assert stats["hits"] == 1 and stats["misses"] == 1 and stats["entries"] == 1 and 0 < stats["bytes"] <= 64 << 20


def hit_miss_cold(m):
    """An engine whose cache holds one voice, with three streams open: ``hit`` (that voice),
    ``miss`` (another prefix) and ``cold`` (none); and (voice, other, tail) codes."""
    voice, other = random_codes(20, SMALL, seed=8), random_codes(12, SMALL, seed=9)
    tail = random_codes(10, SMALL, seed=10)
    engine = StreamEngine(m, max_streams=4, prefix_cache_bytes=64 << 20)
    stream_alone(engine, "warm", torch.cat([voice, tail]), 20, 2, [2])  # puts the voice in the cache
    engine.open("hit", voice)
    engine.open("miss", other)
    engine.open("cold")
    return engine, (voice, other, tail)


def test_a_hit_and_a_miss_in_one_step_with_a_cold_stream_beside_them():
    m = model(SMALL, torch.float64)
    with one_thread():
        engine, (voice, other, tail) = hit_miss_cold(m)
        out = engine.decode({"hit": tail[:5], "miss": tail[:7], "cold": tail[:1]})
    assert (out["hit"] - forward_audio(m, torch.cat([voice, tail]))[20 * SPF : 25 * SPF]).abs().max() <= 1e-9
    assert (out["miss"] - forward_audio(m, torch.cat([other, tail]))[12 * SPF : 19 * SPF]).abs().max() <= 1e-9
    assert (out["cold"] - forward_audio(m, tail)[:SPF]).abs().max() <= 1e-9
    assert engine.prefix_cache_stats()["hits"] == 1 and engine.prefix_cache_stats()["misses"] == 2


def test_a_hits_first_chunk_gathers_like_a_fresh_streams_and_a_misss_does_not():
    """First chunks may wait a moment to share a step (``SchedulePolicy.first_chunk_wait``);
    a prefilled stream's first chunk does not, as its prefill already batched it with the others
    joining. A stream whose state came from the cache had no prefill: its first chunk gathers,
    as a fresh stream's does; its later chunks do not."""
    with one_thread():
        engine, (_, _, tail) = hit_miss_cold(model(SMALL, torch.float32))
        rows = engine._admit({"hit": tail[:1], "miss": tail[:1], "cold": tail[:1]}, lambda rid, e: pytest.fail(f"{rid}: {e}"))
        assert {r.stream.request_id: r.gathers for r in rows} == {"hit": True, "miss": False, "cold": True}
        later = engine._admit({"hit": tail[1:3]}, lambda rid, e: pytest.fail(f"{rid}: {e}"))
        assert [r.gathers for r in later] == [False]


def test_a_cached_prefix_is_looked_up_at_open_and_goes_in_before_the_first_packet():
    """The lookup runs when the stream opens (host work: the caller's thread, not the first
    packet's), and counts a hit there; ``restore_opened`` (the async engine's worker runs it when
    idle, after an open) then writes that state into the slot, so the first chunk has no lookup
    or copy left to do. A prefix not cached at open is left for the first chunk's prefill and
    counted as a miss there, once. Audio as the forward's either way."""
    m = model(SMALL, torch.float64)
    with one_thread():
        engine, (voice, other, tail) = hit_miss_cold(m)
        st_hit, st_miss = engine._streams["hit"], engine._streams["miss"]
        assert st_hit.cached is not None and st_miss.cached is None  # found (or not) at open
        assert engine.prefix_cache_stats()["hits"] == 1 and engine.prefix_cache_stats()["misses"] == 1  # the warm stream's
        engine.restore_opened()
        assert st_hit.prefix is None and st_hit.cached is None and st_miss.prefix is not None
        assert engine.prefix_cache_stats()["hits"] == 1 and engine.prefix_cache_stats()["misses"] == 1  # no second lookup
        warm = engine.pool.snapshot(st_hit.slot)
        assert torch.equal(warm.flat, engine.prefill.cache.get(voice).flat)  # the slot holds the cached state
        engine.restore_opened()  # nothing opened since: no lookup
        assert engine.prefix_cache_stats()["hits"] == 2 and engine.prefix_cache_stats()["misses"] == 1
        out = engine.decode({"hit": tail[:5], "miss": tail[:7]})
        assert engine.prefix_cache_stats()["misses"] == 2 and not engine._opened
    assert (out["hit"] - forward_audio(m, torch.cat([voice, tail]))[20 * SPF : 25 * SPF]).abs().max() <= 1e-9
    assert (out["miss"] - forward_audio(m, torch.cat([other, tail]))[12 * SPF : 19 * SPF]).abs().max() <= 1e-9


def test_a_state_found_at_open_is_restored_even_if_evicted_before_the_first_step():
    """The state a stream found when it opened is the one it starts from, though the cache lets
    it go before the stream's first chunk (another voice took its place): exactly the forward's
    audio, and no second lookup (the evicted voice is not prefilled again)."""
    m = model(SMALL, torch.float64)
    voice, other, tail = random_codes(20, SMALL, seed=31), random_codes(20, SMALL, seed=32), random_codes(6, SMALL, seed=33)
    with one_thread():
        engine = StreamEngine(m, max_streams=3, prefix_cache_bytes=64 << 20)
        stream_alone(engine, "warm", torch.cat([voice, tail]), 20, 2, [2])
        engine.open("hit", voice)
        cache = engine.prefill.cache
        cache.max_bytes = cache.bytes  # room for one voice: the next one evicts this one
        stream_alone(engine, "evicts", torch.cat([other, tail]), 20, 2, [2])
        assert cache.stats()["evictions"] == 1 and cache.get(voice) is None
        misses = cache.stats()["misses"]
        out = engine.decode({"hit": tail[:6]})["hit"]
        assert cache.stats()["misses"] == misses
    assert (out - forward_audio(m, torch.cat([voice, tail]))[20 * SPF : 26 * SPF]).abs().max() <= 1e-9


def test_a_stream_ended_before_its_restore_leaves_nothing_behind():
    """A stream aborted (or reaped) between its open and the worker's ``restore_opened`` is not
    restored into the slot it gave back: the next owner of that slot (here the only one) starts
    cold, exactly; and the engine keeps no trace of the ended stream."""
    m = model(SMALL, torch.float64)
    voice, tail = random_codes(20, SMALL, seed=17), random_codes(9, SMALL, seed=18)
    with one_thread():
        engine = StreamEngine(m, max_streams=1, prefix_cache_bytes=64 << 20)
        stream_alone(engine, "warm", torch.cat([voice, tail]), 20, 2, [2])
        engine.open("gone", voice)
        gone = engine._streams["gone"]
        assert gone.cached is not None  # found when it opened
        engine.abort("gone")
        assert not engine._opened and gone.cached is None  # nor held by the ended stream
        engine.open("fresh")
        engine.restore_opened()
        got = engine.push("fresh", tail)
    assert (got - forward_audio(m, tail)).abs().max() <= 1e-9
    assert engine.prefix_cache_stats()["hits"] == 1  # the lookup when "gone" opened; nothing restored since


def test_the_async_engine_restores_a_cached_prefix_as_the_stream_opens():
    """Through the async engine: opening a stream with a cached voice wakes the worker, which
    restores the state before any chunk is pushed; the audio is the forward's."""
    import asyncio

    from code2wav.engine.async_engine import AsyncEngine

    m = model(SMALL, torch.float64)
    voice, tail = random_codes(16, SMALL, seed=19), random_codes(6, SMALL, seed=20)

    async def go() -> tuple[int, torch.Tensor]:
        core = StreamEngine(m, max_streams=2, prefix_cache_bytes=64 << 20)
        async with AsyncEngine(core) as eng:
            await eng.open("a", voice)
            await eng.push("a", tail[:2])  # a miss: prefilled, then kept
            await eng.finish("a")
            while eng._idle_work_queued or core.pool.has_stale:  # the worker's zeroing after "a" is done
                await asyncio.sleep(0.005)
            await eng.open("b", voice)
            for _ in range(2000):  # the worker's idle work: not on any chunk's path
                if core.prefix_cache_stats()["hits"] == 1:
                    break
                await asyncio.sleep(0.005)
            hits_before_push = core.prefix_cache_stats()["hits"]
            return hits_before_push, await eng.push("b", tail)

    with one_thread():
        hits, audio = asyncio.run(go())
    assert hits == 1
    assert (audio - forward_audio(m, torch.cat([voice, tail]))[16 * SPF :]).abs().max() <= 1e-9


def test_the_least_recently_used_prefix_leaves_first_under_the_bound():
    m = model(SMALL, torch.float64)
    first, second = random_codes(10, SMALL, seed=11), random_codes(10, SMALL, seed=12)
    one = StreamEngine(m, max_streams=1, prefix_cache_bytes=64 << 20)
    stream_alone(one, "x", torch.cat([first, first]), 10, 1, [1])
    entry = one.prefix_cache_stats()["bytes"]  # one prefix's state
    engine = StreamEngine(m, max_streams=1, prefix_cache_bytes=entry + entry // 2)  # room for one
    for rid, p in (("a", first), ("b", second), ("c", first)):
        stream_alone(engine, rid, torch.cat([p, p]), 10, 1, [1])
    stats = engine.prefix_cache_stats()
    assert stats["misses"] == 3 and stats["hits"] == 0 and stats["evictions"] == 2 and stats["entries"] == 1
    assert stats["bytes"] <= stats["max_bytes"]


class _HashesAlike(bytes):
    def __hash__(self) -> int:
        return 0


def test_a_hash_collision_is_a_miss_not_another_voice(monkeypatch):
    """A hit is checked against the codes: with every key hashing alike, two prefixes still
    never share state (the cache compares the codes whole, not their hash)."""
    key = PrefixCache._key
    monkeypatch.setattr(PrefixCache, "_key", lambda self, codes: (key(self, codes)[0], _HashesAlike(key(self, codes)[1])))
    m = model(SMALL, torch.float64)
    a, b = random_codes(30, SMALL, seed=13), random_codes(30, SMALL, seed=14)
    engine = StreamEngine(m, max_streams=2, prefix_cache_bytes=64 << 20)
    stream_alone(engine, "a", a, 15, 15, [15])
    got = stream_alone(engine, "b", b, 15, 15, [15])
    assert (got - forward_audio(m, b)[15 * SPF :]).abs().max() <= 1e-9
    assert engine.prefix_cache_stats()["hits"] == 0 and engine.prefix_cache_stats()["entries"] == 2


def test_keys_narrow_the_codes_only_where_every_code_fits():
    """Keys hold the codes as int16 under a codebook that fits it (a quarter of int64's bytes),
    as they are otherwise; equal codes make equal keys either way, and other codes other keys."""
    codes = random_codes(6, SMALL, seed=16)
    narrow, wide = PrefixCache(1 << 20, code_bound=2048), PrefixCache(1 << 20, code_bound=1 << 16)
    assert len(narrow._key(codes)[1]) == codes.numel() * 2 and len(wide._key(codes)[1]) == codes.numel() * 8
    big = codes.clone()
    big[0, 0] = 40_000  # would wrap around in int16
    assert wide._key(big) != wide._key(codes) and narrow._key(codes.clone()) == narrow._key(codes)


def test_without_a_bound_there_is_no_cache():
    """No cache: nothing is kept, and the pool builds no snapshot layout (its row-address table)."""
    m = model(SMALL, torch.float64)
    engine = StreamEngine(m, max_streams=1)
    codes = random_codes(12, SMALL, seed=23)
    with one_thread():
        stream_alone(engine, "a", codes, 10, 2, [2])
    assert engine.prefix_cache_stats() is None and engine.prefill.cache is None and engine.pool._layout is None


def test_metrics_show_the_prefix_cache():
    """``/metrics`` carries the cache's hits, misses, evictions and bytes (in-process)."""
    import asyncio

    from code2wav.engine.async_engine import AsyncEngine
    from code2wav.server.metrics import _Metrics
    from code2wav.server.service import Service

    m = model(SMALL, torch.float32)
    voice = random_codes(12, SMALL, seed=15)

    async def go() -> str:
        async with AsyncEngine(StreamEngine(m, max_streams=2, prefix_cache_bytes=64 << 20)) as eng:
            for rid in ("a", "b"):
                await eng.open(rid, voice)
                await eng.push(rid, voice[:2])
                await eng.finish(rid)
            return _Metrics(Service(eng)).render().decode()

    text = asyncio.run(go())
    assert "code2wav_prefix_cache_hits_total 1.0" in text and "code2wav_prefix_cache_misses_total 1.0" in text
    assert "code2wav_prefix_cache_bytes " in text
    # The hit's state went in by a launch of its own (restores_in_step is off on CPU)
    assert 'code2wav_prefix_cache_restores_total{how="alone"} 1.0' in text and 'code2wav_prefix_cache_restores_total{how="step"} 0.0' in text
