"""The one place an engine is assembled: :class:`EngineConfig` holds every knob, and
:func:`build_engine` turns it into a ready engine (model loaded, state pool, runner, graphs
captured). The CLI, the bench, the server and the tests build engines here, so a knob has one
name and one default wherever it is set (``code2wav serve/bench --set FIELD=VALUE``).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

import torch

from code2wav.engine.async_engine import AsyncEngine
from code2wav.engine.graphs import DEFAULT_FRAMES, GraphRunner, default_batch_frames
from code2wav.kernels import slot_copy
from code2wav.model.choices import LayerChoices
from code2wav.model.config import DTYPES
from code2wav.model.decoder import Decoder
from code2wav.stream.baselines import BASELINES, BaselineEngine
from code2wav.stream.engine import StreamEngine
from code2wav.stream.lifecycle import Lifecycle
from code2wav.stream.pool import StatePool
from code2wav.stream.runner import EagerRunner
from code2wav.stream.schedule import SchedulePolicy

MODES: tuple[str, ...] = ("exact", *BASELINES)
GRAPH_CAPTURE = ("background", "blocking")
# Eager steps have no bucket to fit: longer pieces and bigger steps amortise the per-step host
# work. With graphs a piece is at most the largest captured frames bucket.
EAGER_STEP_FRAMES = 64
EAGER_BATCH_FRAMES = 1024


@dataclass
class EngineConfig:
    """Every knob of an engine. ``None`` means "the default for this device" (see the methods)."""

    # -- the model
    model: str | None = None  # tokenizer dir, full Qwen3-TTS model dir or hub id; None: embedded default
    device: str = "cpu"
    dtype: str = "float32"  # the conv stack's, the audio's and the state pool's
    # Stages before the conv stack. None: float32 under a half dtype, else dtype; "auto": float16
    # on CUDA under a half dtype where the loaded weights leave it room (model/low_rate.py), else None's.
    low_rate_dtype: str | None = "auto"
    channels_last: bool = True  # CUDA: the conv stack in [B, L, C] memory (load_decoder)
    layers: LayerChoices = field(default_factory=LayerChoices)
    # -- streams
    mode: str = "exact"  # exact | windowed | full (the last two: benchmark baselines)
    max_streams: int = 64  # state-pool slots
    max_prefix_frames: int = 4096
    idle_timeout: float | None = None  # seconds; streams idle longer are aborted
    # -- steps
    graphs: bool | None = None  # replay CUDA graphs; None: on CUDA (exact mode)
    # "background": an async engine serves at once and captures its graphs while it serves, steps
    # without theirs yet running eagerly (engine/warmup.py); "blocking": every graph is captured
    # before the engine is returned. A plain build_engine (no worker to capture on) always blocks.
    # Background by default: a service's first audio comes once the model is loaded, not after
    # every shape's first runs (BENCHMARKS.md, from a cold start); the steady state is the same graphs.
    graph_capture: str = "background"
    max_step_frames: int | None = None  # frames a row launches per step; None: see step_frames()
    max_batch_frames: int | None = None  # padded frames per step; None: see batch_frames()
    # Graph steps of at most this many padded frames (rows x frames: first chunks' steps) replay
    # from a graph pool of their own on a second, high-priority CUDA stream, beside the large
    # steps in flight instead of behind them (0, the default: every step on one stream). Off
    # until measured on a GPU: its first form crashed there (BENCHMARKS.md, session 26).
    priority_step_frames: int = 0
    schedule: SchedulePolicy = field(default_factory=SchedulePolicy)
    # Prefilled reference-prefix states kept for streams that open with the same prefix, in bytes
    # (0: no cache). A hit copies the state instead of running the prefill (stream/prefix_cache.py).
    prefix_cache_bytes: int = 0
    # With the cache on: a cached state written inside its stream's first step (restore pairs in
    # the step's inputs, read by a kernel at every step's head) instead of by a launch of its own
    # before it, which takes that launch off a cached voice's first packet. None: where the kernel
    # runs (CUDA with Triton); True elsewhere is refused (BENCHMARKS.md, voice clones that repeat).
    restores_in_step: bool | None = None
    # -- the async engine
    max_pending_chunks: int = 16  # chunks one stream may have queued (more: queue_full)
    # -- the process
    # Once the engine is built, every object alive (the model, the interpreter's modules) moved out
    # of the garbage collector's sight (gc.collect, then gc.freeze): a full pass holds the GIL, so
    # the worker and the event loop both wait it out, and it then walks only what serving made
    # instead of the whole heap (BENCHMARKS.md, the collector). Process-wide, so off for a library
    # caller (its host keeps its own collector policy; vLLM freezes its heap itself);
    # ``code2wav serve`` and ``code2wav bench`` own their process and turn it on.
    gc_freeze: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        for name, allowed in (("dtype", DTYPES), ("low_rate_dtype", (*DTYPES, "auto"))):
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if self.graph_capture not in GRAPH_CAPTURE:
            raise ValueError(f"graph_capture must be one of {GRAPH_CAPTURE}, got {self.graph_capture!r}")
        if self.priority_step_frames < 0:
            raise ValueError(f"priority_step_frames must be >= 0, got {self.priority_step_frames}")
        if self.prefix_cache_bytes < 0:
            raise ValueError(f"prefix_cache_bytes must be >= 0, got {self.prefix_cache_bytes}")
        for name in ("max_streams", "max_prefix_frames", "max_pending_chunks", "max_step_frames", "max_batch_frames"):
            value = getattr(self, name)
            if value is not None and value < (0 if name == "max_prefix_frames" else 1):
                raise ValueError(f"{name} must be positive, got {value}")
        if self.idle_timeout is not None and self.idle_timeout <= 0:
            raise ValueError(f"idle_timeout must be positive or None, got {self.idle_timeout}")
        if self.restores_in_step and not self.on_cuda:
            raise ValueError("restores_in_step needs a CUDA device (its kernel is Triton's)")
        if self.graphs and not self.on_cuda:
            raise ValueError("graphs=True needs a CUDA device")

    @property
    def on_cuda(self) -> bool:
        return torch.device(self.device).type == "cuda"

    def use_restores_in_step(self) -> bool:
        return slot_copy.applies(torch.device(self.device)) if self.restores_in_step is None else self.restores_in_step

    def use_graphs(self) -> bool:
        return self.mode == "exact" and (self.on_cuda if self.graphs is None else self.graphs)

    def step_frames(self) -> int:
        return self.max_step_frames or (max(DEFAULT_FRAMES) if self.use_graphs() else EAGER_STEP_FRAMES)

    def batch_frames(self) -> int:
        """Read ``PYTORCH_CUDA_ALLOC_CONF`` (graphs.default_batch_frames): set it first."""
        return self.max_batch_frames or (default_batch_frames() if self.use_graphs() else EAGER_BATCH_FRAMES)


def load_model(cfg: EngineConfig) -> Decoder:
    """The decoder ``cfg`` names, on its device, in its dtypes, running its layer choices."""
    from code2wav.model.loading import load_decoder, low_rate_arg

    return load_decoder(cfg.model, device=cfg.device, dtype=getattr(torch, cfg.dtype), channels_last=cfg.channels_last,
                        low_rate_dtype=low_rate_arg(cfg.low_rate_dtype), layers=cfg.layers)


def build_engine(cfg: EngineConfig, model: Decoder | None = None, capture: bool = True) -> Lifecycle:
    """A ready engine: a :class:`StreamEngine` for ``exact`` (graphs captured when
    ``cfg.use_graphs()``), a :class:`BaselineEngine` otherwise. ``model``: an already loaded
    decoder to use (it keeps its own device, dtypes and layer choices; else ``load_model(cfg)``).
    ``capture=False``: graphs planned, none captured yet (``build_async_engine`` captures them
    while serving)."""
    model = model if model is not None else load_model(cfg)
    engine = _exact_engine(cfg, model, capture) if cfg.mode == "exact" else \
        BaselineEngine(model, cfg.mode, cfg.max_streams, cfg.batch_frames(), cfg.idle_timeout, cfg.max_prefix_frames)  # type: ignore[arg-type]
    if cfg.gc_freeze:
        freeze_heap()
    return engine


def _exact_engine(cfg: EngineConfig, model: Decoder, capture: bool) -> StreamEngine:
    pool = StatePool(model, cfg.max_streams)
    graphs = cfg.use_graphs()
    runner = (GraphRunner(model, pool, max_batch_frames=cfg.batch_frames(), priority_step_frames=cfg.priority_step_frames) if graphs
              else EagerRunner(model, pool))
    engine = StreamEngine(model, runner=runner, max_step_frames=cfg.step_frames(), max_batch_frames=cfg.batch_frames(),
                          idle_timeout=cfg.idle_timeout, max_prefix_frames=cfg.max_prefix_frames, policy=cfg.schedule,
                          prefix_cache_bytes=cfg.prefix_cache_bytes, restores_in_step=cfg.use_restores_in_step())
    if graphs and capture:
        runner.capture(engine.prefill_shapes())  # type: ignore[union-attr]
    return engine


def freeze_heap() -> None:
    """``gc_freeze``: collect what is garbage now (it would stay forever once frozen), then freeze
    the rest. A frozen object that later becomes cyclic garbage is freed only after ``gc.unfreeze``."""
    gc.collect()
    gc.freeze()


def thaw_heap() -> None:
    """Undo ``freeze_heap`` and collect: an engine built with ``gc_freeze`` and dropped since
    (its reference cycles were frozen with it) is freed."""
    gc.unfreeze()
    gc.collect()


def build_async_engine(cfg: EngineConfig, model: Decoder | None = None) -> AsyncEngine:
    """``build_engine``, driven by one worker thread for asyncio callers (start it with
    ``async with``). With graphs and ``graph_capture="background"`` it serves at once and
    captures them while serving (its ``warmup``)."""
    background = cfg.use_graphs() and cfg.graph_capture == "background"
    engine = build_engine(cfg, model, capture=not background)
    async_engine = AsyncEngine(engine, max_pending_chunks=cfg.max_pending_chunks)
    if background:
        from code2wav.engine.warmup import Warmup

        runner: GraphRunner = engine.runner  # type: ignore[attr-defined]
        async_engine.warmup = warmup = Warmup(runner, runner.plan(engine.prefill_shapes()), async_engine.wake)  # type: ignore[attr-defined]
        async_engine.between_steps.append(warmup.capture_ready)
    return async_engine
