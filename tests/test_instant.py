"""The instant forms (kernels/instant.py): what a step runs at a shape the process may not have
met yet, while the fast forms' first runs are still being paid on the warm-up thread.

They compute the same audio (float64 against the whole-utterance forward, for fixed, ramped and
ragged chunks, with and without a reference prefix, in both activation layouts), call no cuDNN
convolution (so nothing is planned per shape), hold only on the thread that asked for them, and
are what a graph runner's eager fallback runs.
"""

from __future__ import annotations

import copy
import threading
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from code2wav.kernels import instant
from code2wav.stream.engine import StreamEngine
from code2wav.stream.pool import StatePool
from code2wav.stream.runner import EagerRunner
from tests.models import SMALL, forward_audio, model, ragged_pair, random_codes, stream_alone

SPF = 1920
SCHEDULES = {"fixed": [25], "ramp": [1, 4, 8, 16, 25], "ragged": [1, 13, 2, 30, 7, 25, 3]}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def small64():
    m = model(SMALL, torch.float64)
    codes = random_codes(72 + 160, SMALL, seed=5)
    return m, codes, forward_audio(m, codes)


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


@pytest.fixture
def no_cudnn_convs(monkeypatch):
    """Every torch convolution the layers could call raises: a form that plans per shape fails."""
    def refuse(*args, **kwargs):
        raise AssertionError("a cuDNN convolution ran in the instant forms")

    for name in ("conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d"):
        monkeypatch.setattr(F, name, refuse)


@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
@pytest.mark.parametrize("prefix", [0, 72])
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_instant_streams_equal_the_forward(small64, layout, prefix, name):
    m, codes, ref = small64
    m = copy.deepcopy(m).channels_last() if layout == "channels_last" else m
    n = 150  # crosses the transformer's 72-frame window
    with instant.forms():
        out = stream_alone(StreamEngine(m, max_streams=2), "s", codes, prefix, n, SCHEDULES[name])
    assert max_err(out, ref[prefix * SPF : (prefix + n) * SPF]) <= 1e-9


def test_instant_forms_run_no_convolution_and_batch_ragged_streams_exactly(small64, no_cudnn_convs):
    """Channels-last (the CUDA layout): a cold stream and a prefixed one stepped together with
    ragged chunks equal the forward, and no torch convolution ran (the monkeypatched ones raise)."""
    m, codes, ref = small64
    with instant.forms():
        got = ragged_pair(StreamEngine(copy.deepcopy(m).channels_last(), max_streams=3), codes)
    assert max_err(got["a"], ref[: len(got["a"])]) <= 1e-9
    assert max_err(got["b"], ref[30 * SPF : 30 * SPF + len(got["b"])]) <= 1e-9


def test_outside_the_instant_forms_the_convolutions_run(small64, no_cudnn_convs):
    """The same step with the instant forms off does reach torch's convolutions (so the test
    above would see one)."""
    m, codes, _ = small64
    engine = StreamEngine(copy.deepcopy(m).channels_last(), max_streams=1)
    engine.open("a")
    with pytest.raises(AssertionError, match="cuDNN convolution"):
        engine.decode({"a": codes[:25]})


def test_instant_forms_hold_on_their_own_thread_only():
    seen: dict[str, bool] = {}

    def other() -> None:
        seen["other"] = instant.active()

    assert not instant.active()
    with instant.forms():
        t = threading.Thread(target=other)
        t.start()
        t.join()
        with instant.forms():
            seen["nested"] = instant.active()
        seen["after nested"] = instant.active()
    assert seen == {"other": False, "nested": True, "after nested": True}
    assert not instant.active()


def test_graph_runner_fallbacks_run_the_instant_forms(small64):
    """A step or prefill pass that no captured graph holds runs eagerly, in the instant forms;
    the audio still equals the forward. (The runner is built without CUDA: its fallback path
    needs none; capture and replay are checked on the GPU by bench/warm_check.py.)"""
    from code2wav.engine.graphs import GraphRunner

    m, codes, ref = small64
    runner = object.__new__(GraphRunner)
    EagerRunner.__init__(runner, m, StatePool(m, 2))
    runner.buckets, runner.graphs, runner.prefill_graphs, runner._shapes = [(1, 25)], {}, {}, {}
    runner.fallbacks = Counter()
    seen: list[tuple[str, bool]] = []
    pool = runner.pool
    for name in ("run", "front", "back"):
        real = getattr(pool, name)
        setattr(pool, name, lambda *a, _real=real, _name=name: seen.append((_name, instant.active())) or _real(*a))
    engine = StreamEngine(m, runner=runner, max_step_frames=25, max_batch_frames=100)
    out = stream_alone(engine, "s", codes, 30, 60, [1, 25])
    assert max_err(out, ref[30 * SPF : 90 * SPF]) <= 1e-9
    assert {name for name, _ in seen} == {"run", "front", "back"}
    assert all(on for _, on in seen)
    assert runner.fallbacks["not captured"] and not instant.active()
