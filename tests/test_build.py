"""The composition root: one EngineConfig, every knob, turned into a ready engine."""

from __future__ import annotations

import argparse
import gc
import weakref

import pytest
import torch

from code2wav.engine.async_engine import AsyncEngine
from code2wav.engine.build import EAGER_BATCH_FRAMES, EAGER_STEP_FRAMES, EngineConfig, build_async_engine, build_engine, thaw_heap
from code2wav.kernels import slot_copy
from code2wav.model.choices import LayerChoices
from code2wav.options import engine_config
from code2wav.stream.baselines import BaselineEngine
from code2wav.stream.engine import StreamEngine
from code2wav.stream.runner import EagerRunner
from code2wav.stream.schedule import SchedulePolicy
from tests.models import SMALL, forward_audio, model, random_codes, write_checkpoint

SPF = 1920


def test_an_exact_engine_on_cpu_is_eager_with_the_eager_defaults():
    m = model(SMALL, torch.float64)
    policy = SchedulePolicy(first_chunk_wait=0.0, group_by_size=False)
    engine = build_engine(EngineConfig(max_streams=3, idle_timeout=9.0, max_prefix_frames=50, schedule=policy), model=m)
    assert isinstance(engine, StreamEngine) and type(engine.runner) is EagerRunner
    assert engine.pool.max_streams == 3 and engine.max_step_frames == EAGER_STEP_FRAMES and engine.max_batch_frames == EAGER_BATCH_FRAMES
    assert engine.policy == policy and engine.idle_timeout == 9.0 and engine.max_prefix_frames == 50
    codes = random_codes(30, SMALL)
    engine.open("s", codes[:10])
    out = torch.cat([engine.push("s", codes[10:11]), engine.finish("s", codes[11:30])])
    assert (out - forward_audio(m, codes)[10 * SPF :]).abs().max() <= 1e-9  # the built engine is exact


@pytest.mark.parametrize("mode", ["windowed", "full"])
def test_a_baseline_mode_builds_a_baseline_engine(mode):
    engine = build_engine(EngineConfig(mode=mode, max_streams=2, max_batch_frames=64), model=model(SMALL, torch.float64))
    assert isinstance(engine, BaselineEngine) and engine.mode == mode and engine.max_streams == 2 and engine.max_batch_frames == 64
    assert engine.runner_stats() is None and engine.state_bytes()["pool"] == 0


class _Cycle:
    def __init__(self):
        self.me = self


@pytest.mark.parametrize("mode", ["exact", "windowed"])
def test_gc_freeze_collects_then_freezes_the_heap_once_the_engine_is_built(mode):
    """A full collector pass holds the GIL (the worker and the event loop both wait); with
    ``gc_freeze`` it no longer walks what was alive at build. Garbage of before the build is
    collected, not frozen; ``thaw_heap`` hands everything back."""
    m = model(SMALL, torch.float64)
    assert gc.get_freeze_count() == 0
    build_engine(EngineConfig(mode=mode, max_streams=2), model=m)
    assert gc.get_freeze_count() == 0  # a library caller's process keeps its own collector policy
    garbage = weakref.ref(_Cycle())  # unreachable, kept alive by its cycle until a pass
    assert garbage() is not None
    try:
        engine = build_engine(EngineConfig(mode=mode, max_streams=2, gc_freeze=True), model=m)
        assert garbage() is None  # collected first: frozen garbage would stay forever
        frozen = gc.get_freeze_count()
        assert frozen > sum(gc.get_count()) and gc.get_freeze_count() == frozen
        assert not any(o is engine for o in gc.get_objects())  # the engine itself is out of the collector's sight
        cycle = weakref.ref(_Cycle())
        gc.collect()
        assert cycle() is None  # what serving makes after the build is still collected
    finally:
        thaw_heap()
    assert gc.get_freeze_count() == 0


def test_the_cli_subcommands_own_their_process_and_freeze_the_heap():
    args = argparse.Namespace(settings=[])
    assert engine_config(args, "cpu").gc_freeze is True
    assert engine_config(argparse.Namespace(settings=["gc_freeze=false"]), "cpu").gc_freeze is False
    assert EngineConfig().gc_freeze is False


def test_the_config_refuses_what_cannot_run():
    for bad in ({"mode": "fast"}, {"dtype": "int8"}, {"max_streams": 0}, {"graphs": True}, {"idle_timeout": 0.0},
                {"priority_step_frames": -1}, {"restores_in_step": True}):
        with pytest.raises(ValueError):
            EngineConfig(**bad)
    assert not EngineConfig().use_graphs() and not EngineConfig(device="cuda", mode="windowed").use_graphs()
    assert EngineConfig(device="cuda").use_graphs() and EngineConfig(device="cuda", graphs=False).step_frames() == EAGER_STEP_FRAMES


@pytest.mark.parametrize("kernel_runs", [True, False])
def test_restores_go_inside_steps_by_default_where_their_kernel_runs(monkeypatch, kernel_runs):
    monkeypatch.setattr(slot_copy, "applies", lambda device: kernel_runs and device.type == "cuda")
    assert EngineConfig(device="cuda").use_restores_in_step() == kernel_runs
    assert not EngineConfig(device="cuda", restores_in_step=False).use_restores_in_step()
    assert not EngineConfig().use_restores_in_step()  # CPU: never by default, refused when asked (above)


def test_a_loaded_model_runs_the_configured_layer_choices(tmp_path):
    ckpt = write_checkpoint(tmp_path / "tok")
    choices = LayerChoices(conv_fold="none", convt_gemm=False)
    engine = build_async_engine(EngineConfig(model=str(ckpt), dtype="float64", max_streams=2, layers=choices, max_pending_chunks=3))
    assert isinstance(engine, AsyncEngine) and engine.max_pending_chunks == 3
    assert engine.engine.model.layer_choices == choices and engine.engine.model.dtype == torch.float64
