"""code2wav as the vocoder stage of SGLang-Omni's Qwen3-TTS pipeline (docs/integrations.md).

Select it by pointing the pipeline's ``vocoder`` stage at this factory (SGLang-Omni keeps
``factory_path`` out of its YAML and command line, so it is set on the config object)::

    config.stage_named("vocoder").factory_path = "code2wav.integrations.sglang_omni.create_vocoder_executor"

:func:`create_vocoder_executor` takes the keyword arguments of SGLang-Omni's own
``sglang_omni.models.qwen3_tts.stages.create_vocoder_executor`` (so the stage's factory
arguments resolve unchanged) and returns a :class:`Code2WavVocoderScheduler`, a
``StreamingVocoderBase`` over one code2wav ``StreamEngine``.
"""

from __future__ import annotations

from code2wav.integrations import require

SUPPORTED = ">=0.1.9,<0.2"
require("sglang-omni", SUPPORTED, "sglang-omni")

import logging  # noqa: E402  (the version check comes first)
from collections.abc import Mapping, Sequence  # noqa: E402

import torch  # noqa: E402

from code2wav.integrations.sglang_omni.scheduler import ChunkPolicy, Code2WavVocoderScheduler, StreamState  # noqa: E402

logger = logging.getLogger(__name__)

# SGLang-Omni 0.1.9's chunk defaults (sglang_omni.models.qwen3_tts.streaming_vocoder).
STREAM_STRIDE = 16
FOLLOWUP_STRIDE = 8
LEGACY_INITIAL = 8
DEFAULT_RAMP = (1, 2, 4)
CODEC_STATE_SLOTS = 64
LEFT_CONTEXT_FRAMES = 16

__all__ = ["ChunkPolicy", "Code2WavVocoderScheduler", "StreamState", "chunk_policy", "create_vocoder_executor"]


def chunk_policy(stream_stride: int = STREAM_STRIDE, stream_followup_stride: int = FOLLOWUP_STRIDE, stream_initial_followup_stride: int | None = None,
                 initial_chunk_frames: int | None = None, stream_chunk_ramp: Sequence[int] | None = None) -> ChunkPolicy:
    """The decode thresholds the stack's chunk arguments describe: an explicit ramp
    (``stream_chunk_ramp``: first size, then the follow-ups), the legacy pair
    (``initial_chunk_frames``, ``stream_initial_followup_stride``), or the default ramp."""
    if stream_chunk_ramp is not None:
        if initial_chunk_frames is not None or stream_initial_followup_stride is not None:
            raise ValueError("stream_chunk_ramp replaces initial_chunk_frames and stream_initial_followup_stride; set only one form")
        ramp = tuple(stream_chunk_ramp)
        if not ramp or any(isinstance(r, bool) or not isinstance(r, int) for r in ramp):
            raise TypeError("stream_chunk_ramp must be a non-empty sequence of ints")
        if ramp[0] > stream_stride:
            raise ValueError(f"stream_chunk_ramp[0]={ramp[0]} must be <= stream_stride={stream_stride}")
        return ChunkPolicy(stream_stride, ramp[0], ramp[1:], stream_followup_stride)
    if initial_chunk_frames is None and stream_initial_followup_stride is None:
        return ChunkPolicy(stream_stride, DEFAULT_RAMP[0], [min(r, stream_followup_stride) for r in DEFAULT_RAMP[1:]], stream_followup_stride)
    first = LEGACY_INITIAL if initial_chunk_frames is None else initial_chunk_frames
    follow = min(LEGACY_INITIAL, stream_followup_stride) if stream_initial_followup_stride is None else stream_initial_followup_stride
    return ChunkPolicy(stream_stride, first, [follow], stream_followup_stride)


def resolve_device(device: str | None, gpu_id: int | None) -> str:
    if device is None:
        return f"cuda:{gpu_id or 0}" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and gpu_id is not None:
        return f"cuda:{gpu_id}"
    return device


def create_vocoder_executor(
    model_path: str,
    *,
    device: str | None = None,
    gpu_id: int | None = None,
    dtype: str = "bfloat16",
    attn_implementation: str | None = None,
    max_batch_size: int | None = None,
    max_batch_wait_ms: int | None = None,
    stream_stride: int = STREAM_STRIDE,
    stream_followup_stride: int = FOLLOWUP_STRIDE,
    stream_initial_followup_stride: int | None = None,
    initial_chunk_frames: int | None = None,
    stream_chunk_ramp: tuple[int, ...] | list[int] | None = None,
    stream_left_context_frames: int = LEFT_CONTEXT_FRAMES,
    initial_max_batch_size: int = 32,
    initial_batch_wait_ms: int = 2,
    followup_max_batch_size: int = 8,
    followup_batch_wait_ms: int = 4,
    followup_worker_count: int = 2,
    initial_cuda_graph: bool = True,
    enable_deterministic_inference: bool = False,
    followup_cuda_graph: bool = True,
    async_decode: bool | None = None,
    fused_snake_activation: bool = True,
    enable_stateful_codec_decoder: bool = True,
    codec_state_slots: int = CODEC_STATE_SLOTS,
    incremental_codec_cuda_graph: bool | None = None,
    incremental_codec_compile: bool | None = None,
    incremental_codec_cuda_graph_cold_frames: Sequence[int] | None = None,
    incremental_codec_cuda_graph_window_frames: Sequence[int] | None = None,
    incremental_codec_cuda_graph_min_free_gb: float = 3.0,
    suppress_bootstrap_silence: bool = True,
    suppress_bootstrap_max_streams: int = 24,
    running_stream_count: int | None = None,
    code2wav_engine: Mapping[str, object] | None = None,
) -> Code2WavVocoderScheduler:
    """SGLang-Omni's vocoder factory signature over code2wav's engine.

    Used as the stack uses them: ``model_path`` (the Qwen3-TTS model directory, its
    ``speech_tokenizer/``, or a tokenizer directory or hub id), ``device``/``gpu_id``,
    ``dtype``, the chunk arguments (when audio goes out; the audio itself is the same for any
    of them), ``codec_state_slots`` (the state pool: a hard bound, a request beyond it fails
    with ``PoolFull``), ``max_batch_size``/``max_batch_wait_ms`` (non-streaming batches), the
    bootstrap-silence pair, and CUDA graphs off with ``enable_deterministic_inference`` or
    ``followup_cuda_graph=False``. The knobs of the stack's own decoder (its left context,
    worker threads, cohort sizes, fused SnakeBeta, torch.compile, graph widths) have no
    counterpart and are accepted and ignored. ``code2wav_engine``: further ``EngineConfig``
    fields (e.g. ``{"max_step_frames": 32}``).
    """
    from code2wav.engine.build import EngineConfig, build_engine

    del attn_implementation, stream_left_context_frames, initial_max_batch_size, initial_batch_wait_ms, followup_max_batch_size
    del followup_batch_wait_ms, followup_worker_count, initial_cuda_graph, async_decode, fused_snake_activation, incremental_codec_compile
    del incremental_codec_cuda_graph_cold_frames, incremental_codec_cuda_graph_window_frames, incremental_codec_cuda_graph_min_free_gb
    if not enable_stateful_codec_decoder:
        logger.info("code2wav's decoder is always stateful: enable_stateful_codec_decoder=False is ignored")
    policy = chunk_policy(stream_stride, stream_followup_stride, stream_initial_followup_stride, initial_chunk_frames, stream_chunk_ramp)
    graphs_off = enable_deterministic_inference or not followup_cuda_graph or incremental_codec_cuda_graph is False
    fields: dict[str, object] = {"model": model_path, "device": resolve_device(device, gpu_id), "dtype": dtype, "max_streams": codec_state_slots}
    if graphs_off:
        fields["graphs"] = False
    fields.update(code2wav_engine or {})
    cfg = EngineConfig(**fields)  # type: ignore[arg-type]
    if cfg.mode != "exact":
        raise ValueError(f"the SGLang-Omni stage runs code2wav's exact mode, got mode={cfg.mode!r}")
    if running_stream_count is not None and running_stream_count > cfg.max_streams:
        logger.warning("code2wav vocoder: the engine may run %d streams but the state pool has %d slots (codec_state_slots); "
                       "a stream beyond them fails with pool_full", running_stream_count, cfg.max_streams)
    engine = build_engine(cfg)
    return Code2WavVocoderScheduler(engine, policy, max_batch_size=max_batch_size or 8, max_batch_wait_ms=2 if max_batch_wait_ms is None else max_batch_wait_ms,
                                    suppress_bootstrap_silence=suppress_bootstrap_silence, suppress_bootstrap_max_streams=suppress_bootstrap_max_streams)
