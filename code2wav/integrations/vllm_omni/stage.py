"""The Code2Wav stage model for vLLM-Omni's Qwen3-TTS pipeline, backed by code2wav's engine.

It has the interface vLLM-Omni's generation model runners call on a Code2Wav stage: built with
``(vllm_config=, prefix=)``, weights loaded by ``load_weights`` (from the checkpoint's
``speech_tokenizer/``, through code2wav's own loader), ``forward`` over one step's batch of
requests returning an ``OmniOutput`` whose ``multimodal_outputs`` hold one 1-D audio tensor and
one sample rate per request, ``on_requests_finished`` for finished and aborted requests, and the
dummy-run hooks (``get_dummy_runtime_additional_information``, ``embed_input_ids``,
``compute_logits``).

Each request is one stream of a :class:`~code2wav.stream.engine.StreamEngine`: opened on its
first row with the reference prefix (its audio is never returned), fed only the new frames of
each row, ended when a row says finished (or its segment finished) or the runner reports the
request finished or aborted. All rows of one ``forward`` decode in one batched ``decode`` call.
The stream keeps every layer's state, so the audio is the whole-utterance forward's for any
length and chunk schedule (no re-decoded window).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from typing import Any

from code2wav.integrations import require

VERSION = require("vllm-omni", ">=0.30,<0.31", "vllm-omni")

import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from vllm_omni.model_executor.models.output_templates import OmniOutput  # noqa: E402

from code2wav.engine.build import EngineConfig, build_engine  # noqa: E402
from code2wav.integrations.vllm_omni import ARCH  # noqa: E402
from code2wav.integrations.vllm_omni.rows import Row, read_rows  # noqa: E402
from code2wav.stream.lifecycle import Lifecycle  # noqa: E402
from code2wav.stream.pool import PoolFull  # noqa: E402

logger = logging.getLogger(__name__)

DUMMY_ID = "__code2wav_dummy_run__"
# Connector-config keys (the stage's ``extra``) that set code2wav's engine; the rest of the
# engine's knobs keep EngineConfig's defaults.
EXTRA_KEYS = {"code2wav_max_streams": ("max_streams", int), "code2wav_max_prefix_frames": ("max_prefix_frames", int),
              "code2wav_idle_timeout": ("idle_timeout", float), "code2wav_graphs": ("graphs", bool)}
_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float64: "float64"}


def _extra(vllm_config: Any) -> dict:
    model_cfg = getattr(vllm_config, "model_config", None)
    cfg = getattr(model_cfg, "stage_connector_config", None)
    extra = cfg.get("extra", cfg) if isinstance(cfg, dict) else getattr(cfg, "extra", None)
    return extra if isinstance(extra, dict) else {}


def engine_config(vllm_config: Any) -> EngineConfig:
    """code2wav's engine settings for this stage: the model path, device and dtype vLLM gives
    the stage; one state-pool slot per request the scheduler may run (``max_num_seqs``), unless
    the connector's ``code2wav_max_streams`` says otherwise; CUDA graphs unless the stage is
    ``enforce_eager``."""
    model_cfg = vllm_config.model_config
    dtype = getattr(model_cfg, "dtype", torch.float32)
    dtype = _DTYPES.get(dtype, dtype) if isinstance(dtype, torch.dtype) else str(dtype or "float32")
    seqs = getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", None)
    kw: dict[str, Any] = {"max_streams": int(seqs) if seqs else 64}
    if getattr(model_cfg, "enforce_eager", False):
        kw["graphs"] = False
    for key, (name, kind) in EXTRA_KEYS.items():
        value = _extra(vllm_config).get(key)
        if value is not None:
            kw[name] = kind(value) if kind is not bool else str(value).lower() in ("1", "true", "yes", "on")
    return EngineConfig(model=str(model_cfg.model), device=str(vllm_config.device_config.device), dtype=dtype, **kw)


class Code2WavQwen3TTSCode2Wav(nn.Module):
    """vLLM-Omni's Qwen3-TTS Code2Wav stage on code2wav's exact streaming engine."""

    architecture = ARCH
    input_modalities = "audio"
    tokenizer_subfolder = "speech_tokenizer"
    # The runner passes its scheduler-side request ids (the ids on_requests_finished gets).
    requires_request_ids = True
    # A payload's codes.audio is the request's codes; its tokens only reserve scheduler slots.
    supports_native_payload_input = True
    # The engine stages codes itself (pinned host memory): the runner keeps payloads on the host.
    batched_gpu_staging_keys: frozenset = frozenset()

    def __init__(self, *, vllm_config: Any, prefix: str = ""):
        super().__init__()
        self.vllm_config = vllm_config
        self.prefix = prefix
        self.have_multimodal_outputs = True
        self.has_preprocess = False
        self.has_postprocess = False
        self.enable_update_additional_information = True
        self.requires_raw_input_tokens = True
        self.config = engine_config(vllm_config)
        self.engine: Lifecycle | None = None  # built by load_weights
        self._failed: dict[str, str] = {}  # key -> why: its later rows are dropped until it ends
        self._logged: set[str] = set()
        self._oneoff = itertools.count()

    # -- loading -----------------------------------------------------------------------------------

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> set[str]:
        """Build the engine from the checkpoint's ``speech_tokenizer/`` (code2wav's loader: the
        model path may also be a tokenizer directory or a hub id). The talker weights vLLM
        iterates are not this stage's; they are drained. Returns the parameter names loaded."""
        for _ in weights:
            pass
        before = torch.get_default_dtype()
        torch.set_default_dtype(torch.float32)  # vLLM loads under the stage dtype as default
        try:
            self.engine = build_engine(self.config)
        finally:
            torch.set_default_dtype(before)
        self.decoder = self.engine.model
        self.num_quantizers = self.engine.cfg.num_quantizers
        self.sample_rate = self.engine.cfg.sample_rate
        return {name for name, _ in self.named_parameters()} | {name for name, _ in self.named_buffers()}

    # -- dummy-run and runner hooks ----------------------------------------------------------------

    def embed_input_ids(self, input_ids: Tensor, **_: Any) -> Tensor:
        """The stage takes codes, not embeddings: a [tokens, 1] zero embedding for the runner."""
        return torch.zeros((input_ids.shape[0], 1), device=input_ids.device, dtype=torch.float32)

    def get_dummy_runtime_additional_information(self, num_reqs: int) -> list[dict[str, Any]]:
        """Per-request metadata for the runner's dummy (profile, warm-up) runs: each a finished
        one-off request, so its stream is freed within the run."""
        return [{"meta": {"request_id": f"{DUMMY_ID}{i}", "finished": True}} for i in range(max(0, int(num_reqs)))]

    def compute_logits(self, hidden_states: Any, sampling_metadata: Any = None) -> None:
        return None

    def make_omni_output(self, model_outputs: Any, **_: Any) -> OmniOutput:
        if isinstance(model_outputs, OmniOutput):
            return model_outputs
        if isinstance(model_outputs, tuple) and len(model_outputs) == 2:
            audio, sr = model_outputs
            return OmniOutput(text_hidden_states=None, multimodal_outputs={"model_outputs": audio, "sr": sr})
        raise TypeError(f"{ARCH}: expected OmniOutput or (audio, sr), got {type(model_outputs).__name__}")

    # -- requests ----------------------------------------------------------------------------------

    @property
    def streams(self) -> int:
        """Streams open now (state-pool slots held)."""
        return self._engine().active

    def on_requests_finished(self, finished_req_ids: Iterable[str]) -> None:
        """Free the streams of requests the scheduler finished or aborted (a stream still open
        here was cut short: its slot is given back at once)."""
        engine = self._engine()
        for rid in finished_req_ids:
            rid = str(rid)
            self._failed.pop(rid, None)
            self._logged.discard(rid)
            if engine.is_open(rid):
                engine.abort(rid)

    @torch.no_grad()
    def forward(self, input_ids: Tensor | None = None, positions: Tensor | None = None, intermediate_tensors: Any = None,
                inputs_embeds: Tensor | None = None, runtime_additional_information: list | None = None,
                model_intermediate_buffer: list | None = None, **kwargs: Any) -> OmniOutput:
        """Decode one runner step: every request's new frames in one batched engine call.
        Returns, per request in batch order, its new audio (1-D; float32, or float64 when the
        engine runs float64) and its sample rate. A bad row is logged and gets no audio; the
        others are unaffected, and that request's later rows are dropped until it ends."""
        engine = self._engine()
        infos = runtime_additional_information or model_intermediate_buffer or []
        rows = read_rows(input_ids, infos, kwargs.get("seq_token_counts"), kwargs.get("request_ids"), self.num_quantizers)
        audio: list[Tensor] = [torch.zeros(0, dtype=torch.float32) for _ in rows]
        chunks: dict[str, Tensor] = {}
        owner: dict[str, Row] = {}
        for row in rows:
            if row.key is None:
                row.key = f"__code2wav_oneoff_{next(self._oneoff)}"
            if row.key in self._failed:
                self._log(row.key, f"{ARCH}: request {row.key!r} failed earlier ({self._failed[row.key]}); its row is dropped")
                continue
            if row.key in owner:
                self._fail(row, "two rows of one request in one step")
                continue
            owner[row.key] = row
            if row.error is not None:
                self._fail(row, row.error)
                continue
            frames, context = row.frames, row.context
            try:
                if not engine.is_open(row.key):
                    engine.open(row.key, frames[:context])
            except PoolFull as e:
                self._fail(row, f"{e}: the state pool holds {self.config.max_streams} streams (code2wav_max_streams "
                                "in the stage connector's extra; by default the stage's max_num_seqs)")
                continue
            except Exception as e:  # a bad reference prefix: this request only
                self._fail(row, str(e))
                continue
            if frames.shape[0] > context:
                chunks[row.key] = frames[context:]
        results = engine.decode(chunks) if chunks else {}
        for key, res in results.items():
            row = owner[key]
            if isinstance(res, Exception):
                self._fail(row, str(res))
            else:
                audio[row.index] = res if res.dtype in (torch.float32, torch.float64) else res.float()
        for row in rows:
            if row.finished and owner.get(row.key) is row:
                self._failed.pop(row.key, None)
                self._logged.discard(row.key)
                if engine.is_open(row.key):
                    engine.finish(row.key)
        sr = torch.tensor(self.sample_rate, dtype=torch.int32)
        return OmniOutput(text_hidden_states=None, multimodal_outputs={"model_outputs": audio, "sr": [sr] * len(rows)})

    # -- helpers -----------------------------------------------------------------------------------

    def _engine(self) -> Lifecycle:
        if self.engine is None:
            raise RuntimeError(f"{ARCH}: load_weights has not run (the engine is built there)")
        return self.engine

    def _fail(self, row: Row, why: str) -> None:
        """End ``row``'s request here: its stream is freed, its later rows are dropped."""
        engine = self._engine()
        assert row.key is not None
        if engine.is_open(row.key):
            engine.abort(row.key)
        if not row.finished:
            self._failed[row.key] = why
        logger.error("%s: request %r: row dropped and its stream ended: %s", ARCH, row.key, why)

    def _log(self, key: str, msg: str) -> None:
        if key not in self._logged:
            self._logged.add(key)
            logger.warning(msg)
