"""Prefilled reference-prefix state, kept for the next stream with the same prefix.

Voice-clone traffic reuses a few reference voices across many requests, and a prefill runs the
transformer over the whole prefix. A stream whose prefix is here starts from a copy of the state
a prefill of it wrote (every layer's history and the position: the same function of the same
codes, so the audio is the same) instead of a prefill. Entries are keyed by the codes themselves
(as bytes: the dict hashes them and compares them whole on a hit, so two prefixes never share an
entry); the least recently used leave first, under ``max_bytes`` (``EngineConfig.prefix_cache_bytes``;
0 turns the cache off). A stream's prefix is looked up when it opens (the caller's thread) and put
after a prefill (the stepping thread): one lock keeps the two apart.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from torch import Tensor

from code2wav.stream.pool import Snapshot as State  # a slot's row of every pool buffer, and its position

Key = tuple[tuple[int, ...], bytes]


@dataclass
class _Entry:
    state: State
    nbytes: int


class PrefixCache:
    """``code_bound``: every code is below it (the codebook's size, which the engine checks on
    the way in); where that fits int16, keys hold the codes as int16, a quarter of int64's bytes
    to hash and keep."""

    def __init__(self, max_bytes: int, code_bound: int = 1 << 15):
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        self._narrow = code_bound <= 1 << 15
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()
        self.bytes = self.hits = self.misses = self.evictions = 0
        self._lock = threading.Lock()

    def _key(self, codes: Tensor) -> Key:
        """The prefix's shape and its codes' bytes. It runs when a stream opens (and after a
        prefill): a few microseconds, where a digest (blake2b) and then a comparison
        of the codes as tensors took several times as long (BENCHMARKS.md, sessions 35-36)."""
        a = codes.numpy()
        return tuple(codes.shape), (a.astype(np.int16) if self._narrow else a).tobytes()

    def get(self, codes: Tensor, count_miss: bool = True) -> State | None:
        """The state of a stream prefilled with exactly ``codes``, or None (counted either way,
        a miss only with ``count_miss``: the lookup when a stream opens, whose first step asks
        again on a miss)."""
        key = self._key(codes)
        with self._lock:
            e = self._entries.get(key)
            if e is None:
                self.misses += count_miss
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return e.state

    def put(self, codes: Tensor, state: State) -> None:
        """Keep ``state`` for ``codes``; entries leave, least recently used first, to stay under
        ``max_bytes`` (a state larger than that is not kept)."""
        key = self._key(codes)
        nbytes = len(key[1]) + state.nbytes
        if nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old.nbytes
            while self._entries and self.bytes + nbytes > self.max_bytes:
                _, gone = self._entries.popitem(last=False)
                self.bytes -= gone.nbytes
                self.evictions += 1
            self._entries[key] = _Entry(state, nbytes)
            self.bytes += nbytes

    def stats(self) -> dict[str, int]:
        with self._lock:
                return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions, "entries": len(self._entries),
                    "bytes": self.bytes, "max_bytes": self.max_bytes}
