"""Building the state of streams opened with a reference (voice-clone) prefix, in one batch.

The transformer runs over each whole prefix (its KV depends on all of it); the conv stack runs
over only each prefix's last ``back_context`` frames, which is enough to make its state exact
(``Decoder.back_context_frames``; the tests check that one frame less is not). Deferred from
``open`` to the stream's first step, so that streams opening together share these passes
instead of queueing one prefill each. Where ``bucket`` is on (CUDA), rows and frames are padded
to the shapes of :func:`prefill_shapes` (scratch rows, causal padding): with cuDNN autotune every
new shape is timed once, so the set must stay small, and a graph runner captures exactly these.
"""

from __future__ import annotations

import torch
from torch import Tensor

from code2wav.kernels.history import window
from code2wav.stream.prefix_cache import PrefixCache
from code2wav.stream.rows import Stream
from code2wav.stream.runner import Runner
from code2wav.stream.schedule import size_class


def prefill_rows(max_batch_frames: int, back_context: int, max_streams: int) -> int:
    """Streams one prefill batch holds: the back pass's rows x ``back_context`` frames under
    the frame budget, a power of two, at most the pool's streams (rounded up)."""
    return min(size_class(max(1, max_batch_frames // max(back_context, 1)), floor=True), size_class(max_streams))


def prefill_shapes(back_context: int, max_step_frames: int, group_rows: int) -> list[tuple[str, int, int]]:
    """Every bucketed (pass, rows, frames) shape a prefill runs: what a graph runner captures
    so that no request pays for a new shape."""
    rows = [1 << i for i in range(group_rows.bit_length())]
    return [("front", b, max_step_frames) for b in rows] + [("back", b, back_context) for b in rows]


class Prefill:
    """``cache``: prefilled states kept for streams opening with the same prefix (None: none).
    ``in_step``: a cached state is left on ``Stream.cached`` for the stream's first step to write
    in (``Stager``'s restore pairs) instead of written here."""

    def __init__(self, runner: Runner, max_step_frames: int, max_batch_frames: int, bucket: bool, cache: PrefixCache | None = None,
                 in_step: bool = False):
        self.runner, self.pool, model = runner, runner.pool, runner.model
        self.q = model.config.num_quantizers
        self.back_context = model.back_context_frames()
        self.max_step_frames = max_step_frames
        self.rows = prefill_rows(max_batch_frames, self.back_context, self.pool.max_streams)
        self.bucket = bucket
        self.cache = cache
        # Compiles (and checks) the kernel a step's head runs, before any graph captures it.
        self.in_step = in_step and self.pool.enable_restores_in_step()
        self.device = self.pool.device

    def shapes(self) -> list[tuple[str, int, int]]:
        return prefill_shapes(self.back_context, self.max_step_frames, self.rows)

    def _up(self, values: list[int]) -> Tensor:
        """Small index tensors to the device without stalling it: a pageable copy would wait
        for every queued step (a prefill joins a running decode between steps)."""
        t = torch.tensor(values)
        return t.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else t

    @torch.no_grad()
    def __call__(self, streams: list[Stream]) -> list[Stream]:
        """Prefill every stream's ``prefix`` into its slot (and clear it): from the cache where it
        holds that prefix, else in batches of ``self.rows`` (and then kept in the cache).
        Returns the streams a prefill pass ran for (not those restored from the cache)."""
        if self.cache is None:
            self._prefill(streams)
            return streams
        misses = [(st, st.prefix) for st in streams if not self.restore(st)]
        prefilled = [st for st, _ in misses]
        self._prefill(prefilled)
        for st, codes in misses:
            self.cache.put(codes, self.pool.snapshot(st.slot))
        return prefilled

    def restore(self, st: Stream) -> bool:
        """Start ``st`` from the cached state of its prefix (and clear the prefix), if the cache
        held it when the stream opened (``st.cached``) or holds it now: written into its slot now,
        or with ``in_step`` kept on ``st.cached`` for its first step. Returns whether it did."""
        state = st.cached if st.cached is not None else self.cache.get(st.prefix) if self.cache is not None else None
        if state is None:
            return False
        st.prefix, st.cached = None, state if self.in_step else None
        if not self.in_step:
            self.pool.restore(st.slot, state)
        return True

    def _prefill(self, streams: list[Stream]) -> None:
        K, step, pin = self.back_context, self.max_step_frames, self.device.type == "cuda"
        for g in range(0, len(streams), self.rows):
            group = streams[g : g + self.rows]
            prefixes = [st.prefix for st in group]
            for st in group:
                st.prefix = None
            B = size_class(len(group)) if self.bucket else len(group)
            lengths = [p.shape[0] for p in prefixes] + [0] * (B - len(group))
            slots = self._up([st.slot for st in group] + [self.pool.scratch_slot] * (B - len(group)))
            hidden, done, longest = [], 0, max(lengths)
            while done < longest:
                t = min(step, longest - done)
                codes = torch.zeros(B, self.q, step if self.bucket else t, dtype=torch.long, pin_memory=pin)
                n = [min(max(P - done, 0), t) for P in lengths]
                for b, p in enumerate(prefixes):
                    codes[b, :, : n[b]] = p[done : done + n[b]].T
                hidden.append(self.runner.prefill("front", codes, slots, self._up(n))[..., :t])
                done += t
            h = torch.cat(hidden, dim=-1)
            if h.shape[-1] < K:  # every prefix is shorter than the horizon: pad (causal, unread)
                h = torch.nn.functional.pad(h, (0, K - h.shape[-1]))
            tail_n = self._up([min(P, K) for P in lengths])
            starts = self._up([P - min(P, K) for P in lengths])
            tail = window(h, starts, K, dim=-1)  # row b: its last min(P_b, K) frames, left-aligned
            self.runner.prefill("back", tail, slots, tail_n)
