"""Test-session setup shared by every test module.

OpenMP threads that spin while waiting make torch's CPU kernels 10-20x slower when another
process competes for the same cores (measured on a 2-core machine: a full-size float64 forward of
8 frames took 20 s instead of 2.8 s). ``OMP_WAIT_POLICY=PASSIVE`` makes idle threads sleep. It is
read once, when torch loads its OpenMP runtime, so it must be set here, before any test module
imports torch; an explicit setting in the environment wins.
"""

from __future__ import annotations

import os
import sys

if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The CUDA kernels (code2wav/kernels) are tested on CPU through Triton's interpreter; @triton.jit
# reads this when a kernel is defined, so it too must be set before code2wav is imported. Only
# tests/test_kernels.py launches them on CPU tensors (everywhere else the gate sends CPU to eager).
os.environ.setdefault("TRITON_INTERPRET", "1")


import gc  # noqa: E402

import pytest  # noqa: E402  (after the environment above)


@pytest.fixture(autouse=True)
def _heap_thawed():
    """A CLI subcommand run in-process (``code2wav serve``: ``gc_freeze`` on) freezes the test
    process's heap; the next test starts with it handed back, so nothing frozen outlives its test."""
    yield
    if gc.get_freeze_count():
        from code2wav.engine.build import thaw_heap

        thaw_heap()


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory):
    """A small random checkpoint in the official on-disk layout, written once per session: the
    service and CLI tests load it read-only (a test that damages one copies it first)."""
    from tests.models import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tokenizer")


@pytest.fixture
def one_torch_thread():
    """Torch on one intra-op thread for the test (tests.models.one_thread says why)."""
    from tests.models import one_thread

    with one_thread():
        yield


@pytest.fixture(scope="module")
def small_f64():
    """The shrunk decoder in float64, random weights (seed 0), one per test module."""
    import torch

    from tests.models import SMALL, model

    return model(SMALL, torch.float64)
