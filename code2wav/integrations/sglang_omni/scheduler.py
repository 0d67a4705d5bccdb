"""code2wav's vocoder scheduler for SGLang-Omni's Qwen3-TTS pipeline.

It is a ``StreamingVocoderBase`` (the stack's streaming-vocoder template): the stage runtime feeds
its inbox (``new_request``, ``stream_chunk``, ``stream_done``) and calls ``abort``; the base owns
the request registry, the chunk scaffold checks, the stream-done sequencing and the outbox
messages. The hooks below map that onto one code2wav ``StreamEngine``:

* a request's first chunk opens a code2wav stream, its leading ``ref_code_len`` frames as the
  reference prefix (prefilled, never returned); later chunks add generated frames only;
* chunks queued together are ingested first, then every stream that reached its next decode
  threshold is decoded in one ``StreamEngine.decode`` call (the base's coalesced pump);
* stream done decodes the remainder with ``finish``, which frees the slot; an abort frees it at
  once. A per-stream error (bad codes, a full pool) ends that request only.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from sglang_omni.proto import StagePayload
from sglang_omni.proto.admin import ADMIN_MODEL_INFO
from sglang_omni.scheduling.pipeline_state import build_usage
from sglang_omni.scheduling.streaming_vocoder import INITIAL_CODEC_CHUNK_FRAMES_PARAM, StreamingVocoderBase, resolve_initial_codec_chunk_frames
from sglang_omni.utils.audio_payload import audio_waveform_payload

from code2wav.codes import as_frames
from code2wav.stream.lifecycle import Lifecycle

logger = logging.getLogger(__name__)

SOURCE = "code2wav"
# A first generated frame this quiet is "bootstrap silence" (the stack's per-request option
# ``bootstrap_silence_suppression``): its audio is withheld, the frame stays in the state.
SILENT_RMS = 0.001
SILENT_PEAK = 0.0032


@dataclass
class StreamState:
    """One request's stream, host side: codes waiting for their decode and the cursors."""

    opened: bool = False  # a code2wav stream is open under the request id
    num_quantizers: int | None = None
    ref_frames: int = 0  # announced by the first chunk's metadata (ref_code_len)
    pending: list[torch.Tensor] = field(default_factory=list)
    pending_frames: int = 0
    emitted: int = 0  # generated frames whose audio went out
    decodes: int = 0
    initial_frames: int = 0
    suppress_bootstrap: bool = False


class ChunkPolicy:
    """When a stream's buffered frames are decoded: the first decode waits for ``initial``
    generated frames (0: ``stride``), then each entry of ``ramp`` in turn, then ``steady``
    frames. The ramp is walked by frames emitted, so a backlog that overshot it resumes at
    the steady size. The audio does not depend on it (every schedule decodes exactly)."""

    def __init__(self, stride: int, initial: int, ramp: Sequence[int], steady: int):
        if stride <= 0 or steady <= 0 or initial < 0 or any(r <= 0 for r in ramp):
            raise ValueError(f"chunk sizes must be positive: stride={stride} initial={initial} ramp={tuple(ramp)} steady={steady}")
        self.stride, self.initial, self.ramp, self.steady = stride, initial, tuple(ramp), steady

    def first(self, initial: int) -> int:
        return initial or self.stride

    def next_at(self, st: StreamState) -> int:
        """Generated frames the stream must hold before its next decode."""
        if st.decodes == 0:
            return self.first(st.initial_frames)
        end = self.first(st.initial_frames)
        for size in self.ramp:
            if st.emitted < end + size:
                return st.emitted + size
            end += size
        return st.emitted + self.steady


class Code2WavVocoderScheduler(StreamingVocoderBase[StreamState, dict]):
    """Qwen3-TTS vocoder stage over code2wav's exact engine (see the module docstring)."""

    can_batch_stream_chunks = True

    def __init__(self, engine: Lifecycle, policy: ChunkPolicy, *, max_batch_size: int = 8, max_batch_wait_ms: int = 2,
                 suppress_bootstrap_silence: bool = True, suppress_bootstrap_max_streams: int = 24, sample_rate: int = 24000):
        self.engine = engine
        self.policy = policy
        self.suppress_bootstrap_silence = bool(suppress_bootstrap_silence)
        self.suppress_bootstrap_max_streams = int(suppress_bootstrap_max_streams)
        self.samples_per_frame = engine.cfg.samples_per_frame
        # Every queued chunk may join one pump: one per stream and talker step, several steps' worth.
        self.stream_chunk_batch_max = 4 * engine.max_streams
        self.failed_in_step: list[str] = []
        self.whole_ids = itertools.count()
        super().__init__(self.vocode_payload, batch_compute_fn=self.vocode_payloads, sample_rate=sample_rate, stream_source_hint=SOURCE,
                         max_batch_size=max_batch_size, max_batch_wait_ms=max_batch_wait_ms)

    # -- per-request contract ----------------------------------------------------------------------

    def create_stream_state(self, request_id: str) -> StreamState:
        return StreamState(initial_frames=self.policy.initial)

    def latch_stream_contract(self, request_id: str, state: StreamState, source: StagePayload | Mapping[str, object], *, origin: str) -> None:
        if origin == "payload":
            params = source.request.params  # type: ignore[union-attr]
            if isinstance(params, Mapping) and not state.decodes:
                state.initial_frames = resolve_initial_codec_chunk_frames(params, steady_chunk_frames=self.policy.stride, default_frames=state.initial_frames)
            return
        meta: Mapping[str, object] = source  # type: ignore[assignment]
        if "num_quantizers" in meta:
            q = int(meta["num_quantizers"])  # type: ignore[call-overload]
            if q != self.engine.cfg.num_quantizers:
                raise ValueError(f"{SOURCE}: stream {request_id!r} has {q} quantizers, the decoder takes {self.engine.cfg.num_quantizers}")
            if state.num_quantizers is not None and state.num_quantizers != q:
                raise ValueError(f"{SOURCE}: num_quantizers of stream {request_id!r} changed: {state.num_quantizers} -> {q}")
            state.num_quantizers = q
        elif state.num_quantizers is None:
            raise RuntimeError(f"{SOURCE}: the first chunk of stream {request_id!r} carries no num_quantizers")
        if "ref_code_len" in meta:
            ref = int(meta["ref_code_len"])  # type: ignore[call-overload]
            if ref < 0:
                raise ValueError(f"{SOURCE}: ref_code_len of stream {request_id!r} must be >= 0, got {ref}")
            if state.opened:
                raise ValueError(f"{SOURCE}: reference codes for stream {request_id!r} arrived after its first chunk")
            state.ref_frames = ref
        if INITIAL_CODEC_CHUNK_FRAMES_PARAM in meta and not state.decodes:
            state.initial_frames = resolve_initial_codec_chunk_frames(meta, steady_chunk_frames=self.policy.stride, default_frames=state.initial_frames)
        if meta.get("bootstrap_silence_suppression") and self.suppress_bootstrap_silence and not state.decodes:
            bumped = min(state.initial_frames + 1, self.policy.stride)
            if 0 < state.initial_frames < bumped and len(self.stream_states) <= self.suppress_bootstrap_max_streams:
                state.initial_frames, state.suppress_bootstrap = bumped, True

    def validate_chunk(self, request_id: str, state: StreamState, codes: torch.Tensor) -> torch.Tensor:
        if codes.ndim == 1:
            codes = codes.unsqueeze(0)
        cfg = self.engine.cfg
        return as_frames(codes.detach(), cfg.num_quantizers, cfg.codebook_size, f"{SOURCE}: stream chunk of {request_id!r}")

    def ingest(self, request_id: str, state: StreamState, codes: torch.Tensor) -> None:
        if not state.opened:
            ref = state.ref_frames
            if ref >= codes.shape[0]:
                raise ValueError(f"{SOURCE}: the first chunk of stream {request_id!r} has {codes.shape[0]} frames, "
                                 f"none generated after its {ref} reference frames")
            self.engine.open(request_id, codes[:ref] if ref else None)  # PoolFull: this request only
            state.opened = True
            codes = codes[ref:]
        state.pending.append(codes)
        state.pending_frames += int(codes.shape[0])

    # -- the coalesced steps -----------------------------------------------------------------------

    def select_step_participants(self) -> list[tuple[str, StreamState]]:
        return [(rid, st) for rid, st in self.stream_states.items()
                if st.pending_frames and not self.is_aborted(rid) and st.emitted + st.pending_frames >= self.policy.next_at(st)]

    def build_step_plan(self, participants: list[tuple[str, StreamState]]) -> dict:
        return {rid: torch.cat(st.pending) for rid, st in participants}

    def run_step(self, participants: list[tuple[str, StreamState]], plan: dict) -> dict[str, torch.Tensor]:
        """One ``StreamEngine.decode`` over every participant; a stream whose row failed gets its
        error and ends alone (its abort callback runs after the state lock, in ``pump_streams``)."""
        for _, st in participants:
            st.pending, st.pending_frames = [], 0
        results = self.engine.decode(plan)
        audio: dict[str, torch.Tensor] = {}
        for rid, st in participants:
            res = results[rid]
            if isinstance(res, Exception):
                self.emit_error(rid, res)
                self.abort_state(rid)
                self.failed_in_step.append(rid)
            else:
                audio[rid] = self.emitted_audio(st, int(plan[rid].shape[0]), res)
        return audio

    def pump_streams(self) -> list[str]:
        failed = super().pump_streams()
        failed.extend(self.failed_in_step)
        self.failed_in_step = []
        return failed

    def emitted_audio(self, st: StreamState, frames: int, audio: torch.Tensor) -> torch.Tensor:
        st.emitted += frames
        st.decodes += 1
        if st.suppress_bootstrap:
            st.suppress_bootstrap = False
            spf = self.samples_per_frame
            head = audio[:spf].double()
            if audio.numel() > spf and float(head.pow(2).mean().sqrt()) <= SILENT_RMS and float(head.abs().max()) <= SILENT_PEAK:
                return audio[spf:]
        return audio

    # -- end of stream -----------------------------------------------------------------------------

    def decode_delta(self, request_id: str, state: StreamState, *, is_final: bool) -> torch.Tensor | None:
        """Only reached at stream done (chunks go through the coalesced pump): the frames still
        buffered, decoded by ``finish``, which frees the slot."""
        if not is_final:
            raise RuntimeError(f"{SOURCE} decodes stream chunks in coalesced steps only")
        if not state.opened:
            return None
        frames = torch.cat(state.pending) if state.pending else None
        state.pending, state.pending_frames = [], 0
        state.opened = False
        audio = self.engine.finish(request_id, frames)
        if frames is None or audio.numel() == 0:
            return None
        return self.emitted_audio(state, int(frames.shape[0]), audio)

    def fallback_full_decode(self, request_id: str, payload: StagePayload, state: StreamState) -> torch.Tensor | None:
        """The stream ended without audio (no chunk reached the stage): decode the payload's codes."""
        from sglang_omni.models.qwen3_tts.payload_types import Qwen3TTSState

        final = Qwen3TTSState.from_dict(payload.data)
        if final.audio_codes is None:
            return None
        (audio,) = self.decode_whole([(final.audio_codes, int(final.ref_code_len or 0))])
        if isinstance(audio, Exception):
            raise audio
        return audio if audio.numel() else None

    def final_result_data(self, request_id: str, payload: StagePayload, state: StreamState) -> dict[str, object]:
        from sglang_omni.models.qwen3_tts.payload_types import Qwen3TTSState

        return self.result_fields(Qwen3TTSState.from_dict(payload.data), {"modality": "audio", "sample_rate": self.sample_rate})

    @staticmethod
    def result_fields(final, data: dict[str, object]) -> dict[str, object]:
        usage = build_usage(final)
        if usage is not None:
            data["usage"] = usage
        if final.finish_reason is not None:
            data["finish_reason"] = final.finish_reason
        return data

    def release_stream_resources(self, request_id: str, state: StreamState) -> None:
        if state.opened:
            state.opened = False
            if self.engine.is_open(request_id):
                self.engine.abort(request_id)

    # -- non-streaming requests (the whole utterance in the payload) -------------------------------

    def decode_whole(self, items: list[tuple[object, int]]) -> list[torch.Tensor | Exception]:
        """Each item's codes ``[T, Q]`` with its first ``ref`` frames as the reference prefix, all
        in one batched decode; the reference audio is cut. An item's error is its result alone."""
        cfg = self.engine.cfg
        out: list[torch.Tensor | Exception] = [torch.zeros(0)] * len(items)
        opened: dict[str, tuple[int, torch.Tensor]] = {}
        try:
            for i, (codes, ref) in enumerate(items):
                rid = f"{SOURCE}-whole-{next(self.whole_ids)}"
                try:
                    frames = as_frames(torch.as_tensor(codes), cfg.num_quantizers, cfg.codebook_size, f"{SOURCE}: audio_codes", allow_empty=True)
                    if not 0 <= ref <= frames.shape[0]:
                        raise ValueError(f"{SOURCE}: ref_code_len {ref} outside the {frames.shape[0]} frames of audio_codes")
                    self.engine.open(rid, frames[:ref] if ref else None)
                except Exception as e:
                    out[i] = e
                    continue
                opened[rid] = (i, frames[ref:])
            results = self.engine.decode({rid: gen for rid, (_, gen) in opened.items() if gen.shape[0]})
            for rid, (i, _) in opened.items():
                out[i] = results.get(rid, torch.zeros(0, dtype=self.engine.dtype))
        finally:
            for rid in opened:
                if self.engine.is_open(rid):
                    self.engine.finish(rid)
        return out

    async def vocode_payload(self, payload: StagePayload) -> StagePayload:
        (result,) = await self.vocode_payloads([payload])
        if isinstance(result, Exception):
            raise result
        return result

    async def vocode_payloads(self, payloads: list[StagePayload]) -> list[StagePayload | Exception]:
        from sglang_omni.models.qwen3_tts.payload_types import Qwen3TTSState

        finals = [Qwen3TTSState.from_dict(p.data) for p in payloads]
        items: list[tuple[object, int]] = []
        for f in finals:
            items.append((f.audio_codes if f.audio_codes is not None else [], int(f.ref_code_len or 0)))
        results: list[StagePayload | Exception] = []
        for payload, final, audio in zip(payloads, finals, self.decode_whole(items)):
            if final.audio_codes is None:
                audio = RuntimeError(f"{SOURCE}: the vocoder needs audio_codes from tts_engine")
            if isinstance(audio, Exception):
                results.append(audio)
                continue
            data = dict(audio_waveform_payload(audio, sample_rate=self.sample_rate, modality="audio", source_hint=SOURCE))
            payload.data = self.result_fields(final, data)
            results.append(payload)
        return results

    # -- the stage's admin hook --------------------------------------------------------------------

    def admin(self, action: str, payload: dict[str, object] | None = None) -> dict[str, object]:
        if action != ADMIN_MODEL_INFO:
            return {"success": True, "message": f"unsupported admin action: {action}", "data": {"skipped": True, "unsupported": True}}
        state = self.engine.state_bytes()
        info = {"slots": self.engine.max_streams, "slots_in_use": self.engine.slots_in_use,
                "state_bytes_per_stream": state["per_stream"], "pool_bytes": state["pool"]}
        return {"success": True, "message": "ok", "data": {"code2wav": info}}

