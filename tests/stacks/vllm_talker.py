"""Drive a Code2Wav stage the way vLLM-Omni feeds it, with vLLM-Omni's own talker-side code.

The payloads are built by vLLM-Omni's ``talker2code2wav_async_chunk`` (streaming: the first
chunk carries the reference prefix and the first frames, later ones only new frames) and
``talker2code2wav_full_payload`` (one finished payload), imported from the installed wheel.
Around them this module keeps only what vLLM-Omni's connector keeps between calls (the
per-request frame lists and chunk counters those functions read and write) and turns payloads
into the arguments its model runner passes to a stage's ``forward``. Used by
tests/test_integration_vllm_omni.py and bench/integration_vllm.py.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from tests.stacks import vllm_stubs

vllm_stubs.install()

from vllm_omni.data_entry_keys import MetaStruct, OmniPayloadStruct, to_dict  # noqa: E402
from vllm_omni.model_executor.stage_input_processors.qwen3_tts import (  # noqa: E402
    talker2code2wav_async_chunk,
    talker2code2wav_full_payload,
)

Q = 16


def stage_config(model: str, *, dtype: torch.dtype, device: str = "cpu", async_chunk: bool = True,
                 extra: dict | None = None, max_num_seqs: int = 64, enforce_eager: bool = False) -> SimpleNamespace:
    """The fields of a vLLM config that a Code2Wav stage reads (model path, dtype, device, the
    connector's chunk settings, the scheduler's bound)."""
    return SimpleNamespace(
        model_config=SimpleNamespace(model=model, dtype=dtype, async_chunk=async_chunk, enforce_eager=enforce_eager,
                                     revision=None, stage_connector_config={"extra": dict(extra or {})}),
        device_config=SimpleNamespace(device=torch.device(device)),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        load_config=None,
    )


@dataclass
class Connector:
    """What vLLM-Omni's chunk transfer keeps per request between talker steps, which its
    talker-side processor reads and writes (attribute names are that processor's)."""

    extra: dict = field(default_factory=lambda: {"codec_chunk_frames": 25, "codec_left_context_frames": 72,
                                                 "initial_codec_chunk_frames": 1})
    scheduler_max_num_seqs: int = 64

    def __post_init__(self) -> None:
        self.connector = SimpleNamespace(config={"extra": self.extra})
        self.code_prompt_token_ids: dict[str, list[torch.Tensor]] = defaultdict(list)
        self.put_req_chunk: dict[str, int] = defaultdict(int)
        self.ramp_chunk_count: dict[str, int] = defaultdict(int)
        self.request_payload: dict[str, torch.Tensor] = {}

    def step(self, rid: str, frame: torch.Tensor | None, ref: torch.Tensor | None = None,
             finished: bool = False, segment_finished: bool = False) -> dict | None:
        """One talker step of request ``rid`` (its new frame [Q], the reference codes it sends
        with every step); returns the Code2Wav payload sent now, or None. Like the connector,
        a finish always sends something and carries the finished / segment-finished flags."""
        request = SimpleNamespace(external_req_id=rid, request_id=rid, additional_information=None,
                                  is_finished=lambda: finished)
        output: dict[str, Any] = {"codes": {}, "meta": {}}
        if frame is not None:
            output["codes"]["audio"] = frame.reshape(1, -1)
            output["meta"]["codec_frame_valid"] = torch.tensor([True])
        if ref is not None:
            output["codes"]["ref"] = ref
        payload = talker2code2wav_async_chunk(self, output, request, is_finished=finished or segment_finished)
        if payload is None:
            if not (finished or segment_finished):
                return None
            payload = OmniPayloadStruct()
        self.put_req_chunk[rid] += 1
        self.ramp_chunk_count[rid] += 1
        if payload.meta is None:
            payload.meta = MetaStruct()
        payload.meta.finished = torch.tensor(finished)
        if payload.meta.is_segment_finished is None:
            payload.meta.is_segment_finished = torch.tensor(segment_finished)
        return to_dict(payload)

    def stream(self, rid: str, codes: torch.Tensor, ref: torch.Tensor | None = None, segment: bool = False) -> list[dict]:
        """Every payload of one request that generates ``codes`` [T, Q] frame by frame (its last
        frame finishes the request, or with ``segment`` only its segment)."""
        out = []
        for t in range(codes.shape[0]):
            last = t == codes.shape[0] - 1
            p = self.step(rid, codes[t], ref, finished=last and not segment, segment_finished=last and segment)
            if p is not None:
                out.append(p)
        return out


def full_payload(rid: str, codes: torch.Tensor, ref: torch.Tensor | None = None) -> dict:
    """The non-streaming payload of a finished request (``talker2code2wav_full_payload``)."""
    pooling: dict[str, Any] = {"codes.audio": codes}
    if ref is not None:
        pooling["codes.ref"] = [ref]
        pooling["meta.ref_code_len"] = torch.tensor([ref.shape[0]])
    request = SimpleNamespace(request_id=rid, output_token_ids=list(range(codes.shape[0] + 1)))
    return talker2code2wav_full_payload(None, pooling, request)


def forward_args(rows: list[tuple[str, dict]], placeholders: bool = False, device: str = "cpu") -> dict[str, Any]:
    """A stage ``forward``'s arguments for one runner step over ``rows`` (scheduler id, payload):
    the flat codebook-major codes as ``input_ids`` (``placeholders``: zeros of the same length, as
    the non-streaming path schedules; on ``device``, as the runner's are), the payloads as
    ``runtime_additional_information``, the per-request token counts and the scheduler's ids."""
    flats = [p.get("codes", {}).get("audio", torch.zeros(0, dtype=torch.long)).reshape(-1) for _, p in rows]
    ids = torch.cat(flats) if flats else torch.zeros(0, dtype=torch.long)
    return {
        "input_ids": (torch.zeros_like(ids) if placeholders else ids).to(device),
        "positions": None,
        "runtime_additional_information": [p for _, p in rows],
        "seq_token_counts": [f.numel() for f in flats],
        "request_ids": [rid for rid, _ in rows],
    }


def audio_of(output: Any) -> list[torch.Tensor]:
    """Per-request audio of a stage's ``OmniOutput``."""
    return list(output.multimodal_outputs["model_outputs"])
