"""Finding and loading a decoder checkpoint: ``code2wav.model.loading.load_decoder``.

Contract:

* a checkpoint in the released on-disk layout (what the official tokenizer's ``save_pretrained``
  writes: ``config.json`` with ``decoder_config``, one fp32 ``model.safetensors`` with
  ``decoder.*`` and ``encoder.*`` keys) loads from (a) its directory, (b) a full Qwen3-TTS model
  directory holding it under ``speech_tokenizer/``, (c) a hub id, resolved from the Hugging Face
  cache (offline here); each loaded model reproduces the official decoder's output;
* a bad checkpoint raises ``CheckpointError`` whose message says what is wrong: unreadable
  weights, the missing / shape-mismatched keys by name, no ``config.json``, or, for a hub id
  that cannot be fetched, to pass a local directory with ``--model PATH``;
* ``load_decoder(None)`` is the embedded default: deterministic random weights of the real
  architecture, written once to ``$CODE2WAV_CACHE`` in the same layout and loaded like any other
  checkpoint, with a note on stderr that they are random weights.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from code2wav.model import loading
from code2wav.model.init import random_decoder
from code2wav.model.loading import CheckpointError, load_decoder, resolve_checkpoint
from tests import models
from tests.official import Qwen3TTSTokenizerV2Config, copy_weights, official_full_model

SPF = 1920
CHECKPOINT_SEED = 3
COMMIT = "c0de2a5c0de2a5c0de2a5c0de2a5c0de2a5c0de2"  # a 40-hex snapshot name


@dataclass(frozen=True)
class OfficialCheckpoint:
    path: Path  # the tokenizer directory save_pretrained wrote
    codes: torch.Tensor  # [1, 16, T]
    reference: torch.Tensor  # the official decoder's output for ``codes`` (fp32)


@pytest.fixture(scope="module")
def official_checkpoint(tmp_path_factory) -> OfficialCheckpoint:
    """The official tokenizer with our random decoder weights, saved by its own
    ``save_pretrained`` (~650 MB, once per module), and its output on a short input. The seed
    differs from the embedded default's, so a loader that ignored the checkpoint would fail."""
    ours = random_decoder(models.FULL, seed=CHECKPOINT_SEED)
    assert CHECKPOINT_SEED != loading.DEFAULT_SEED
    official = official_full_model()
    copy_weights(official.decoder, ours)
    path = tmp_path_factory.mktemp("official") / "Qwen3-TTS-Tokenizer-12Hz"
    official.save_pretrained(path)
    g = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 2048, (1, 16, 5), generator=g)
    with torch.no_grad():
        reference = official.decoder(codes)
    return OfficialCheckpoint(path, codes, reference)


def assert_reproduces_official(model, ckpt: OfficialCheckpoint) -> None:
    assert not model.training
    assert all(p.dtype == torch.float32 and not p.requires_grad for p in model.parameters())
    with torch.no_grad():
        out = model(ckpt.codes)
    peak = ckpt.reference.abs().max().item()
    assert peak > 0.1
    assert out.shape == ckpt.reference.shape == (1, 1, ckpt.codes.shape[-1] * SPF)
    assert (out - ckpt.reference).abs().max().item() <= 1e-4 * peak


def test_official_checkpoint_has_the_released_layout(official_checkpoint):
    """Precondition for the loading tests: config.json with ``decoder_config``; one fp32
    safetensors file with both ``decoder.`` and ``encoder.`` keys (the encoder must be ignored)."""
    files = sorted(p.name for p in official_checkpoint.path.iterdir())
    assert "config.json" in files and "model.safetensors" in files
    assert "decoder_config" in json.loads((official_checkpoint.path / "config.json").read_text())
    with safe_open(str(official_checkpoint.path / "model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
        dtypes = {f.get_slice(k).get_dtype() for k in keys}
    assert {k.split(".", 1)[0] for k in keys} == {"decoder", "encoder"}
    assert dtypes == {"F32"}


# -- (a) tokenizer directory, (b) full model directory ------------------------------------------


@pytest.mark.slow
def test_load_tokenizer_dir(official_checkpoint):
    """(a) The directory ``save_pretrained`` wrote, as given to ``--model``."""
    model = load_decoder(official_checkpoint.path)
    assert_reproduces_official(model, official_checkpoint)


def _full_model_dir(root: Path, tokenizer: Path, talker_weights: str | None) -> Path:
    """A Qwen3-TTS model directory: its own config.json (the talker's, no decoder_config),
    optionally the talker's weights (one file, or a sharded index), and the tokenizer under
    ``speech_tokenizer/`` (a symlink)."""
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "qwen3_tts", "tts_model_size": "0b6"}))
    if talker_weights == "model.safetensors":
        save_file({"talker.model.norm.weight": torch.ones(4)}, str(root / "model.safetensors"))
    elif talker_weights == "sharded":
        save_file({"talker.model.norm.weight": torch.ones(4)}, str(root / "model-00001-of-00001.safetensors"))
        index = {"metadata": {}, "weight_map": {"talker.model.norm.weight": "model-00001-of-00001.safetensors"}}
        (root / "model.safetensors.index.json").write_text(json.dumps(index))
    (root / "speech_tokenizer").symlink_to(tokenizer, target_is_directory=True)
    return root


@pytest.mark.slow
@pytest.mark.parametrize(
    "talker_weights",
    [
        None,
        "sharded",
        "model.safetensors",  # an unsharded talker at the root must not be taken for the tokenizer
    ],
)
def test_load_full_model_dir(official_checkpoint, tmp_path, talker_weights):
    """(b) A full Qwen3-TTS model directory: the tokenizer is found under ``speech_tokenizer/``
    whatever the model root holds (its own config.json, its talker weights in one file or shards)."""
    root = _full_model_dir(tmp_path / "Qwen3-TTS-12Hz-0.6B-Base", official_checkpoint.path, talker_weights)
    model = load_decoder(root)
    assert_reproduces_official(model, official_checkpoint)


# -- (c) hub ids, from a hand-built Hugging Face cache, offline --------------------------------


@pytest.fixture
def offline_hub(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache under ``tmp_path`` with the hub offline.

    ``huggingface_hub.constants`` reads HF_HOME / HF_HUB_CACHE / HF_HUB_OFFLINE once, at import
    (already done by now), and ``hf_hub_download`` reads those constants at call time; so both the
    environment (for anything imported later) and the constants are patched, test-scoped."""
    home = tmp_path / "hf"
    cache = home / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HOME", str(home))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert huggingface_hub.constants.is_offline_mode()
    return cache


def add_to_hub_cache(cache: Path, repo_id: str, files: dict[str, Path]) -> Path:
    """Lay out ``repo_id`` at revision main as ``hf_hub_download`` leaves it: ``refs/main`` names
    a snapshot, whose files here are symlinks to ``files`` (path in repo -> local file)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    for rel, src in files.items():
        (snapshot / rel).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / rel).symlink_to(src)
    return snapshot


@pytest.mark.slow
@pytest.mark.parametrize(
    "repo_id, subfolder",
    [
        ("Qwen/Qwen3-TTS-Tokenizer-12Hz", ""),  # offline: the missing speech_tokenizer/ must not stop the root lookup
        ("Qwen/Qwen3-TTS-12Hz-0.6B-Base", "speech_tokenizer/"),
    ],
)
def test_load_hub_id_from_cache(official_checkpoint, offline_hub, repo_id, subfolder):
    """(c) A hub id: the tokenizer repo (files at the root) or a full model repo (files under
    ``speech_tokenizer/``, next to the talker's own config.json), resolved from the local cache
    with the hub offline."""
    files = {f"{subfolder}{name}": official_checkpoint.path / name for name in ("config.json", "model.safetensors")}
    if subfolder:  # the full model's own files at the root
        talker = _full_model_dir(offline_hub.parent / "talker", official_checkpoint.path, "model.safetensors")
        files.update({name: talker / name for name in ("config.json", "model.safetensors")})
    snapshot = add_to_hub_cache(offline_hub, repo_id, files)
    assert resolve_checkpoint(repo_id) == snapshot / subfolder.rstrip("/")
    model = load_decoder(repo_id)
    assert_reproduces_official(model, official_checkpoint)


def test_unreachable_hub_id_says_pass_a_local_path(offline_hub):
    """A hub id that is neither cached nor reachable: the error tells the user to download it
    elsewhere and pass the directory with ``--model PATH``."""
    with pytest.raises(CheckpointError) as err:
        load_decoder("Qwen/Qwen3-TTS-Tokenizer-12Hz")
    assert "Qwen/Qwen3-TTS-Tokenizer-12Hz" in str(err.value)
    assert "--model PATH" in str(err.value)


def test_nonexistent_path_is_not_taken_for_a_hub_id(tmp_path):
    """A path that does not exist and is not of the form owner/name is reported as such."""
    spec = str(tmp_path / "no" / "such" / "dir")
    with pytest.raises(CheckpointError, match="no such directory"):
        load_decoder(spec)


# -- bad checkpoints (shrunk architecture: the checks do not depend on the size) ----------------


def small_state() -> dict[str, torch.Tensor]:
    """A complete shrunk checkpoint's tensors, with their ``decoder.`` keys."""
    sd = models.model(models.SMALL, torch.float32).state_dict()
    return {loading.PREFIX + k: v.contiguous() for k, v in sd.items()}


def write_checkpoint(path: Path, tensors: dict[str, torch.Tensor], decoder_config: dict | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    cfg = loading.checkpoint_config(models.SMALL)
    if decoder_config is not None:
        cfg["decoder_config"] = decoder_config
    (path / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(path / "model.safetensors"))
    return path


def test_small_checkpoint_loads(tmp_path):
    """The shrunk checkpoint the failure cases below start from is itself valid (with an
    ``encoder.`` key that must be ignored) and loads to the same weights."""
    tensors = {**small_state(), "encoder.quantizer.dummy": torch.zeros(3)}
    model = load_decoder(write_checkpoint(tmp_path / "ok", tensors))
    want = models.model(models.SMALL, torch.float32).state_dict()
    got = model.state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_corrupt_weights_file(tmp_path, damage):
    """A truncated or garbage model.safetensors: CheckpointError naming the file."""
    ckpt = write_checkpoint(tmp_path / "ckpt", small_state())
    weights = ckpt / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x00not a safetensors file" * 64)
    with pytest.raises(CheckpointError) as err:
        load_decoder(ckpt)
    assert str(weights) in str(err.value)
    assert "missing" not in str(err.value)  # a file problem, not reported as a key mismatch


def test_missing_decoder_key(tmp_path):
    """A checkpoint without one decoder tensor: the message says 'missing' and names the key."""
    key = "decoder.pre_transformer.layers.3.mlp.up_proj.weight"
    tensors = small_state()
    del tensors[key]
    with pytest.raises(CheckpointError) as err:
        load_decoder(write_checkpoint(tmp_path / "ckpt", tensors))
    msg = str(err.value)
    assert "missing" in msg
    assert key in msg
    assert "shape mismatch" not in msg and "unexpected" not in msg


def test_config_disagrees_with_weights(tmp_path):
    """config.json describing another size than the weights: the message lists the
    shape-mismatched keys with both shapes."""
    bigger = replace(models.SMALL, decoder_dim=2 * models.SMALL.decoder_dim)
    with pytest.raises(CheckpointError) as err:
        load_decoder(write_checkpoint(tmp_path / "ckpt", small_state(), decoder_config=bigger.to_dict()))
    msg = str(err.value)
    assert "shape mismatch" in msg
    d, lat = models.SMALL.decoder_dim, models.SMALL.latent_dim
    line = next(ln for ln in msg.splitlines() if "shape mismatch" in ln)
    entry = line[line.index("decoder.decoder.0.conv.weight") :].split(", decoder.")[0]
    assert str((d, lat, 7)) in entry and str((2 * d, lat, 7)) in entry  # checkpoint vs model shape
    assert "missing" not in msg


def test_directory_without_config(tmp_path):
    """A directory with weights but no config.json is not a checkpoint; the message says what a
    checkpoint directory needs."""
    ckpt = write_checkpoint(tmp_path / "ckpt", small_state())
    (ckpt / "config.json").unlink()
    with pytest.raises(CheckpointError) as err:
        load_decoder(ckpt)
    assert str(ckpt) in str(err.value)
    assert "config.json" in str(err.value)


def test_unreadable_config(tmp_path):
    """A config.json that is not JSON: CheckpointError naming it."""
    ckpt = write_checkpoint(tmp_path / "ckpt", small_state())
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json"):
        load_decoder(ckpt)


# -- the embedded default ---------------------------------------------------------------------


@pytest.mark.slow
def test_embedded_default(tmp_path, monkeypatch, capsys):
    """``load_decoder(None)``: deterministic random weights of the released architecture (the
    seeded ``random_decoder``), written once to ``$CODE2WAV_CACHE`` in the released layout and
    reused by later loads without rewriting; every load says on stderr (not stdout) that these
    are random weights."""
    cache = tmp_path / "code2wav-cache"
    monkeypatch.setenv("CODE2WAV_CACHE", str(cache))

    first = load_decoder(None)
    note = capsys.readouterr()
    written = sorted(cache.iterdir())
    assert len(written) == 1  # one checkpoint directory, no leftover temporaries
    weights = written[0] / "model.safetensors"
    mtime = weights.stat().st_mtime_ns

    second = load_decoder(None)
    note2 = capsys.readouterr()
    assert sorted(cache.iterdir()) == written
    assert weights.stat().st_mtime_ns == mtime  # not rewritten

    for captured in (note, note2):
        assert "RANDOM weights" in captured.err
        assert "not the released" in captured.err
        assert captured.out == ""

    assert first.config == second.config == models.FULL
    want = models.model(models.FULL, torch.float32, seed=loading.DEFAULT_SEED)
    for m in (first, second):
        got = m.state_dict()
        assert got.keys() == want.state_dict().keys()
        assert all(torch.equal(got[k], v) for k, v in want.state_dict().items())
        assert torch.equal(m.quantizer.table, want.quantizer.table)

    # The layout the official loader reads: its config class accepts config.json as is.
    raw = json.loads((written[0] / "config.json").read_text())
    official_cfg = Qwen3TTSTokenizerV2Config(**raw)
    assert official_cfg.decoder_config.decoder_dim == models.FULL.decoder_dim
    assert list(official_cfg.decoder_config.upsample_rates) == list(models.FULL.upsample_rates)
    assert os.path.getsize(weights) > 400e6  # the full-size decoder, fp32
