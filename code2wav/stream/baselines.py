"""The benchmark baselines: streams decoded by re-running the plain forward over their past.

``windowed`` re-decodes 72 frames of left context plus the new frames and keeps the new part
(inexact past 72 frames; what vLLM-Omni did before its cached decode, and the official chunked
semantics); ``full`` re-decodes everything so far on each chunk (exact, quadratic). Same
contract and lifecycle as the exact engine, so the bench runs them side by side on one model;
no state pool: a slot only counts a stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Literal

import torch
from torch import Tensor

from code2wav.codes import CodesError
from code2wav.model.decoder import Decoder
from code2wav.stream.lifecycle import Lifecycle
from code2wav.stream.pool import PoolFull
from code2wav.stream.rows import OnReady, Result, Stream, StreamError
from code2wav.stream.schedule import split_groups

BASELINES: tuple[str, ...] = ("windowed", "full")
Baseline = Literal["windowed", "full"]


class BaselineEngine(Lifecycle):
    def __init__(self, model: Decoder, mode: Baseline, max_streams: int = 64, max_batch_frames: int = 1024,
                 idle_timeout: float | None = None, max_prefix_frames: int = 4096):
        if mode not in BASELINES:
            raise ValueError(f"baseline mode must be one of {BASELINES}, got {mode!r}")
        super().__init__(model, max_streams, idle_timeout, max_prefix_frames)
        self.mode = mode
        self.max_batch_frames = max_batch_frames
        self._free_slots = list(range(max_streams - 1, -1, -1))

    def _take_slot(self) -> int:
        if not self._free_slots:
            raise PoolFull(f"all {self.max_streams} stream slots are in use")
        return self._free_slots.pop()

    def _give_slot(self, slot: int) -> None:
        self._free_slots.append(slot)

    def _keep_prefix(self, st: Stream, prefix: Tensor) -> None:
        st.history.append(prefix)

    def decode(self, chunks: Mapping[str, object], on_ready: OnReady | None = None,
               more: Callable[[], Mapping[str, object]] | None = None) -> dict[str, Result]:
        """As ``StreamEngine.decode``; ``more`` is not asked (a baseline's call is one batch)."""
        results: dict[str, Result] = {}
        self.reap_idle()
        rows: list[tuple[Stream, Tensor]] = []
        with self._lock:
            for rid, payload in chunks.items():
                try:
                    rows.append((self._get(rid), self._frames(payload, f"stream {rid!r}")))
                except (StreamError, CodesError) as e:
                    results[rid] = e
        for (st, _), audio in zip(rows, self._redecode(rows) if rows else []):
            st.last_active = time.monotonic()
            ended = not self._live(st)
            results[st.request_id] = StreamError("stream_ended", f"stream {st.request_id!r} ended while its chunk was decoding") if ended else audio
        if on_ready is not None:
            for rid in chunks:
                on_ready(rid, results[rid])
        return {rid: results[rid] for rid in chunks} if more is None else {}

    @torch.no_grad()
    def _redecode(self, rows: list[tuple[Stream, Tensor]]) -> list[Tensor]:
        """The plain forward over (context + new), right-padded batch, grouped under the same
        ``max_batch_frames`` budget as the exact path; one step per group."""
        spf, window = self.cfg.samples_per_frame, self.cfg.sliding_window
        seqs, ctx = [], []
        for st, fr in rows:
            past = torch.cat(st.history) if st.history else fr[:0]
            if self.mode == "windowed":
                past = past[-window:]
            seqs.append(torch.cat([past, fr]))
            ctx.append(past.shape[0])
            st.history = [seqs[-1][-window:] if self.mode == "windowed" else seqs[-1]]
        out: list[Tensor] = [fr[:0] for _, fr in rows]
        lengths = {j: s.shape[0] for j, s in enumerate(seqs)}
        for group in split_groups(list(lengths), lengths, lambda frames: max(1, self.max_batch_frames // frames)):
            L = max(lengths[j] for j in group)
            codes = torch.zeros(len(group), self.cfg.num_quantizers, L, dtype=torch.long)
            for k, j in enumerate(group):
                codes[k, :, : lengths[j]] = seqs[j].T
            start = time.perf_counter()
            wav = self.model(codes.to(self.device))[:, 0].cpu()
            seconds = time.perf_counter() - start
            for k, j in enumerate(group):
                out[j] = wav[k, ctx[j] * spf : lengths[j] * spf]
            for hook in self.on_step:
                hook(seconds, len(group), L)
        return out
