"""Prefilled reference-prefix state, kept for the next stream with the same prefix.

Voice-clone traffic reuses a few reference voices across many requests, and a prefill runs the
transformer over the whole prefix. A stream whose prefix is here starts from a copy of the state
a prefill of it wrote (every layer's history and the position: the same function of the same
codes, so the audio is the same) instead of a prefill. Entries are keyed by a hash of the codes
and checked against them on a hit; the least recently used leave first, under ``max_bytes``
(``EngineConfig.prefix_cache_bytes``; 0 turns the cache off).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import Tensor

State = dict[str, Tensor]  # a slot's row of every pool buffer, and its position


@dataclass
class _Entry:
    codes: Tensor
    state: State
    nbytes: int


class PrefixCache:
    def __init__(self, max_bytes: int):
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[tuple[int, ...], int], _Entry] = OrderedDict()
        self.bytes = self.hits = self.misses = self.evictions = 0

    @staticmethod
    def _key(codes: Tensor) -> tuple[tuple[int, ...], int]:
        """The prefix's shape and Python's own hash of its bytes: it runs on the worker before a
        cached stream's first step, and a hit is checked against the codes anyway, so a collision
        costs a miss, never other audio (blake2b took ~4x as long: BENCHMARKS.md, session 35)."""
        return tuple(codes.shape), hash(codes.contiguous().numpy().tobytes())

    def get(self, codes: Tensor) -> State | None:
        """The state of a stream prefilled with exactly ``codes``, or None (counted either way)."""
        key = self._key(codes)
        e = self._entries.get(key)
        if e is None or not torch.equal(e.codes, codes):  # absent, or another prefix with the same hash
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return e.state

    def put(self, codes: Tensor, state: State) -> None:
        """Keep ``state`` for ``codes``; entries leave, least recently used first, to stay under
        ``max_bytes`` (a state larger than that is not kept)."""
        nbytes = codes.numel() * codes.element_size() + sum(t.numel() * t.element_size() for t in state.values())
        if nbytes > self.max_bytes:
            return
        key = self._key(codes)
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes
        while self._entries and self.bytes + nbytes > self.max_bytes:
            _, gone = self._entries.popitem(last=False)
            self.bytes -= gone.nbytes
            self.evictions += 1
        self._entries[key] = _Entry(codes.clone(), state, nbytes)
        self.bytes += nbytes

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions, "entries": len(self._entries),
                "bytes": self.bytes, "max_bytes": self.max_bytes}
