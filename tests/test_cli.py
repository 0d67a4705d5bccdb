"""``code2wav decode`` end to end, on a shrunk random checkpoint written in the official layout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from code2wav import offline
from code2wav.cli import main
from code2wav.model.loading import CONFIG_FILE, WEIGHTS_FILE, load_decoder
from code2wav.options import chunk_schedule
from tests.models import one_thread, random_codes

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "code2wav" / "assets" / "example_codes.npy"
SPF, SR = 1920, 24000


@pytest.fixture(autouse=True)
def _threads(request):
    if request.node.get_closest_marker("slow"):  # the full-size default model uses every core
        yield
        return
    with one_thread():
        yield


@pytest.fixture(scope="module")
def model64(ckpt):
    return load_decoder(ckpt, dtype=torch.float64)


def rand_codes(frames: int, seed: int = 1) -> np.ndarray:
    return random_codes(frames, seed=seed).numpy()


def save(tmp_path: Path, name: str, arr: np.ndarray) -> str:
    p = tmp_path / name
    np.save(p, arr)
    return str(p)


def offline64(model, codes: np.ndarray) -> np.ndarray:
    return offline.decode(model, torch.from_numpy(codes))[0].numpy()


def decode(ckpt: Path, codes: str, out: str, *extra: str) -> int:
    return main(["decode", codes, "-o", out, "--model", str(ckpt), *extra])


# -- outputs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", [".wav", ".flac", ".npy"])
def test_output_has_exact_length(ckpt, tmp_path, capsys, ext):
    codes = save(tmp_path, "c.npy", rand_codes(13))
    out = str(tmp_path / f"out{ext}")
    assert decode(ckpt, codes, out) == 0
    if ext == ".npy":
        data = np.load(out)
        assert data.dtype == np.float32 and data.shape == (13 * SPF,)
    else:
        data, sr = sf.read(out, dtype="int16")
        info = sf.info(out)
        assert sr == SR and info.subtype == "PCM_16" and info.channels == 1
        assert data.shape == (13 * SPF,)
        assert np.abs(data).max() > 0
    summary = capsys.readouterr().out.strip()
    assert "\n" not in summary and "13 frames" in summary and "RTF" in summary and "s of audio" in summary


def test_wav_matches_npy_quantized(ckpt, tmp_path):
    codes = save(tmp_path, "c.npy", rand_codes(5))
    assert decode(ckpt, codes, str(tmp_path / "a.npy")) == 0
    assert decode(ckpt, codes, str(tmp_path / "a.wav")) == 0
    raw = np.load(tmp_path / "a.npy")
    pcm, _ = sf.read(tmp_path / "a.wav", dtype="int16")  # round(clip(x, -1, 1) * 32767): the service's quantizer
    assert np.abs(pcm / 32767 - np.clip(raw, -1, 1)).max() <= 0.501 / 32767


def test_npy_float64_equals_offline_decode(ckpt, model64, tmp_path):
    c = rand_codes(40)
    out = tmp_path / "o.npy"
    assert decode(ckpt, save(tmp_path, "c.npy", c), str(out), "--dtype", "float64") == 0
    got = np.load(out)
    assert got.dtype == np.float64
    assert np.array_equal(got, offline64(model64, c))


def test_bfloat16_npy_is_float32(ckpt, tmp_path):
    out = tmp_path / "o.npy"
    assert decode(ckpt, save(tmp_path, "c.npy", rand_codes(3)), str(out), "--dtype", "bfloat16") == 0
    got = np.load(out)
    assert got.dtype == np.float32 and got.shape == (3 * SPF,)
    assert np.array_equal(got, torch.from_numpy(got).bfloat16().float().numpy())  # bf16 values, exactly


def test_float16_decode_keeps_30_db_of_the_float64_output(ckpt, model64, tmp_path):
    """float16 is the high-fidelity half precision: 3 more mantissa bits than bfloat16 (same
    tensor-core speed on the GPU), so its rounding noise is ~18 dB lower. The decode must stay
    within 30 dB of float64 (the GPU engine's fidelity target) and clearly beat bfloat16."""
    c = rand_codes(40)
    ref = torch.from_numpy(offline64(model64, c))
    snr = {}
    for dtype in ("float16", "bfloat16"):
        out = tmp_path / f"{dtype}.npy"
        assert decode(ckpt, save(tmp_path, "c.npy", c), str(out), "--dtype", dtype) == 0
        got = torch.from_numpy(np.load(out)).double()
        snr[dtype] = 10 * torch.log10(ref.pow(2).sum() / (ref - got).pow(2).sum()).item()
    assert snr["float16"] >= 30.0 and snr["float16"] >= snr["bfloat16"] + 10.0, snr
    wav = tmp_path / "float16.wav"  # and as 16-bit PCM, like every other dtype
    assert decode(ckpt, save(tmp_path, "c.npy", c), str(wav), "--dtype", "float16") == 0
    assert sf.read(wav)[0].shape == (40 * SPF,)


# -- streaming ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunks", ["1,4,8,25", "7", "3,1,10,2,25", "100"])
def test_chunks_equal_offline(ckpt, model64, tmp_path, capsys, chunks):
    c = rand_codes(50, seed=2)
    out = tmp_path / "o.npy"
    assert decode(ckpt, save(tmp_path, "c.npy", c), str(out), "--dtype", "float64", "--chunks", chunks) == 0
    got = np.load(out)
    ref = offline64(model64, c)
    assert got.shape == ref.shape == (50 * SPF,)
    assert np.abs(got - ref).max() <= 1e-9
    assert f"chunks {chunks}" in capsys.readouterr().out


@pytest.mark.parametrize("chunks", [None, "4,9"])
def test_prefix_equals_offline_with_prefix_cut(ckpt, model64, tmp_path, chunks):
    pre, c = rand_codes(20, seed=3), rand_codes(30, seed=4)
    out = tmp_path / "o.npy"
    extra = ["--dtype", "float64", "--prefix", save(tmp_path, "p.npy", pre)] + (["--chunks", chunks] if chunks else [])
    assert decode(ckpt, save(tmp_path, "c.npy", c), str(out), *extra) == 0
    got = np.load(out)
    ref = offline64(model64, np.concatenate([pre, c]))[20 * SPF :]
    assert got.shape == ref.shape == (30 * SPF,)
    assert np.abs(got - ref).max() <= 1e-9


def test_full_mode_equals_offline_and_windowed_has_length(ckpt, model64, tmp_path):
    c = rand_codes(30, seed=5)
    ref = offline64(model64, c)
    for mode in ("full", "windowed"):
        out = tmp_path / f"{mode}.npy"
        assert decode(ckpt, save(tmp_path, "c.npy", c), str(out), "--dtype", "float64", "--mode", mode, "--chunks", "8") == 0
        got = np.load(out)
        assert got.shape == ref.shape
        if mode == "full":
            assert np.abs(got - ref).max() <= 1e-9


def test_official_mode_offline(ckpt, model64, tmp_path):
    c = rand_codes(12, seed=6)  # < 300 frames: one window, equal to the forward
    out = tmp_path / "o.npy"
    assert decode(ckpt, save(tmp_path, "c.npy", c), str(out), "--dtype", "float64", "--mode", "official") == 0
    assert np.abs(np.load(out) - offline64(model64, c)).max() <= 1e-9


def test_minus_one_padding_dropped(ckpt, model64, tmp_path):
    c = rand_codes(10, seed=7)
    padded = np.concatenate([c, np.full((6, 16), -1, dtype=np.int64)])
    ref = offline64(model64, c)
    for extra in ([], ["--chunks", "3"]):
        out = tmp_path / "o.npy"
        assert decode(ckpt, save(tmp_path, "c.npy", padded), str(out), "--dtype", "float64", *extra) == 0
        got = np.load(out)
        assert got.shape == (10 * SPF,)
        assert np.abs(got - ref).max() <= 1e-9


def test_int32_codes_accepted(ckpt, tmp_path):
    out = tmp_path / "o.npy"
    assert decode(ckpt, save(tmp_path, "c.npy", rand_codes(4).astype(np.int32)), str(out)) == 0
    assert np.load(out).shape == (4 * SPF,)


def test_chunk_schedule():
    assert chunk_schedule(20, [1, 4, 8, 25]) == [1, 4, 8, 7]
    assert chunk_schedule(10, [3]) == [3, 3, 3, 1]
    assert chunk_schedule(3, [5, 1]) == [3]
    assert sum(chunk_schedule(100, [1, 4, 8, 25])) == 100


# -- bad input: exit 2, one line naming the problem ----------------------------------------------------


def _bad_cases(tmp: Path, ckpt: Path) -> dict[str, tuple[list[str], str]]:
    good = save(tmp, "good.npy", rand_codes(4))
    out = str(tmp / "o.wav")
    c = rand_codes(6)
    hi = c.copy()
    hi[2, 5] = 2048
    neg = c.copy()
    neg[1, 3] = -1  # -1 outside codebook 0 is not padding
    neg0 = c.copy()
    neg0[5, 0] = -2
    gap = c.copy()
    gap[2, :] = -1  # padding in the middle
    (tmp / "garbage.npy").write_bytes(b"not a numpy file at all")
    np.savez(tmp / "arch.npz", a=c)
    shutil.copy(tmp / "arch.npz", tmp / "arch_npz.npy")
    bad_cfg = tmp / "badcfg"
    shutil.copytree(ckpt, bad_cfg)
    (bad_cfg / CONFIG_FILE).write_text("{ not json")
    bad_w = tmp / "badweights"
    shutil.copytree(ckpt, bad_w)
    (bad_w / WEIGHTS_FILE).write_bytes(b"\x00" * 64)
    mism = tmp / "mismatch"
    shutil.copytree(ckpt, mism)
    raw = json.loads((mism / CONFIG_FILE).read_text())
    raw["decoder_config"]["hidden_size"] = 64
    raw["decoder_config"]["num_hidden_layers"] = 9
    (mism / CONFIG_FILE).write_text(json.dumps(raw))
    (tmp / "empty_dir").mkdir()
    m = ["--model", str(ckpt)]
    return {
        "out_of_range": (["decode", save(tmp, "hi.npy", hi), "-o", out, *m], "2048 outside [0, 2048)"),
        "negative_code": (["decode", save(tmp, "neg.npy", neg), "-o", out, *m], "-1 outside [0, 2048)"),
        "negative_pad_marker": (["decode", save(tmp, "neg0.npy", neg0), "-o", out, *m], "-2 outside [0, 2048)"),
        "padding_gap": (["decode", save(tmp, "gap.npy", gap), "-o", out, *m], "padding"),
        "all_padding": (["decode", save(tmp, "allpad.npy", np.full((3, 16), -1)), "-o", out, *m], "no frames"),
        "zero_frames": (["decode", save(tmp, "zero.npy", np.zeros((0, 16), np.int64)), "-o", out, *m], "no frames"),
        "float_dtype": (["decode", save(tmp, "f.npy", c.astype(np.float32)), "-o", out, *m], "integers"),
        "bool_dtype": (["decode", save(tmp, "b.npy", c > 5), "-o", out, *m], "integers"),
        "shape_15": (["decode", save(tmp, "s15.npy", c[:, :15]), "-o", out, *m], "shape [frames, 16]"),
        "shape_1d": (["decode", save(tmp, "s1.npy", c[:, 0]), "-o", out, *m], "shape [frames, 16]"),
        "shape_3d": (["decode", save(tmp, "s3.npy", c[None]), "-o", out, *m], "shape [frames, 16]"),
        "shape_transposed": (["decode", save(tmp, "st.npy", c.T), "-o", out, *m], "shape [frames, 16]"),
        "missing_codes": (["decode", str(tmp / "nope.npy"), "-o", out, *m], "no such file"),
        "codes_is_dir": (["decode", str(tmp / "empty_dir"), "-o", out, *m], "not a file"),
        "unreadable_codes": (["decode", str(tmp / "garbage.npy"), "-o", out, *m], "not a readable .npy"),
        "npz_codes": (["decode", str(tmp / "arch_npz.npy"), "-o", out, *m], ".npz"),
        "missing_prefix": (["decode", good, "-o", out, "--prefix", str(tmp / "nope_p.npy"), *m], "prefix"),
        "bad_prefix": (["decode", good, "-o", out, "--prefix", save(tmp, "bp.npy", hi), *m], "prefix"),
        "model_missing": (["decode", good, "-o", out, "--model", str(tmp / "no" / "such" / "dir")], "no such directory"),
        "model_empty_dir": (["decode", good, "-o", out, "--model", str(tmp / "empty_dir")], "not a tokenizer checkpoint"),
        "model_bad_config": (["decode", good, "-o", out, "--model", str(bad_cfg)], "unreadable"),
        "model_bad_weights": (["decode", good, "-o", out, "--model", str(bad_w)], "unreadable safetensors"),
        "model_mismatch": (["decode", good, "-o", out, "--model", str(mism)], "does not match"),
        "chunks_zero": (["decode", good, "-o", out, "--chunks", "0", *m], "--chunks"),
        "chunks_negative": (["decode", good, "-o", out, "--chunks", "1,-2", *m], "--chunks"),
        "chunks_words": (["decode", good, "-o", out, "--chunks", "a,b", *m], "--chunks"),
        "chunks_empty": (["decode", good, "-o", out, "--chunks", "", *m], "--chunks"),
        "chunks_trailing_comma": (["decode", good, "-o", out, "--chunks", "4,", *m], "--chunks"),
        "official_chunks": (["decode", good, "-o", out, "--mode", "official", "--chunks", "4", *m], "official"),
        "official_prefix": (["decode", good, "-o", out, "--mode", "official", "--prefix", good, *m], "official"),
        "bad_device": (["decode", good, "-o", out, "--device", "tpu", *m], "--device"),
        "meta_device": (["decode", good, "-o", out, "--device", "meta", *m], "--device"),
        "bad_dtype": (["decode", good, "-o", out, "--dtype", "int8", *m], "--dtype"),
        "bad_mode": (["decode", good, "-o", out, "--mode", "fast", *m], "--mode"),
        "out_dir_missing": (["decode", good, "-o", str(tmp / "nodir" / "o.wav"), *m], "does not exist"),
        "out_unknown_ext": (["decode", good, "-o", str(tmp / "o.mp3"), *m], "unknown extension"),
        "out_no_ext": (["decode", good, "-o", str(tmp / "out"), *m], "unknown extension"),
        "out_is_dir": (["decode", good, "-o", str(tmp / "adir.wav"), *m], "is a directory"),
        "no_output": (["decode", good, *m], "-o/--output"),
        "no_command": ([], "required"),
        "unknown_command": (["encode", good], "invalid choice"),
    }


BAD_IDS = [
    "out_of_range", "negative_code", "negative_pad_marker", "padding_gap", "all_padding", "zero_frames",
    "float_dtype", "bool_dtype", "shape_15", "shape_1d", "shape_3d", "shape_transposed", "missing_codes",
    "codes_is_dir", "unreadable_codes", "npz_codes", "missing_prefix", "bad_prefix", "model_missing",
    "model_empty_dir", "model_bad_config", "model_bad_weights", "model_mismatch", "chunks_zero",
    "chunks_negative", "chunks_words", "chunks_empty", "chunks_trailing_comma", "official_chunks",
    "official_prefix", "bad_device", "meta_device", "bad_dtype", "bad_mode", "out_dir_missing",
    "out_unknown_ext", "out_no_ext", "out_is_dir", "no_output", "no_command", "unknown_command",
]


@pytest.fixture(scope="module")
def bad_cases(ckpt, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "adir.wav").mkdir()
    cases = _bad_cases(tmp, ckpt)
    assert sorted(cases) == sorted(BAD_IDS)
    return cases


@pytest.mark.parametrize("case", BAD_IDS)
def test_bad_input_one_line_exit_2(bad_cases, capsys, case):
    argv, needle = bad_cases[case]
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith("code2wav: error: ")
    assert needle in err, err
    assert "Traceback" not in err
    assert captured.out == ""


def test_mismatch_message_counts(bad_cases, capsys):
    argv, _ = bad_cases["model_mismatch"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "missing (" in err and "shape mismatch (" in err


def test_cuda_unavailable(ckpt, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    assert decode(ckpt, save(tmp_path, "c.npy", rand_codes(2)), str(tmp_path / "o.wav"), "--device", "cuda") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "CUDA is not available" in err


def test_no_output_written_on_error(ckpt, tmp_path):
    bad = rand_codes(3)
    bad[0, 0] = 5000
    out = tmp_path / "o.wav"
    assert decode(ckpt, save(tmp_path, "c.npy", bad), str(out)) == 2
    assert not out.exists()


def test_help_exits_zero(capsys):
    assert main(["--help"]) == 0
    assert main(["decode", "--help"]) == 0
    assert "--chunks" in capsys.readouterr().out


# -- the installed console script and the packaged example ---------------------------------------------


def _console_script() -> str:
    exe = shutil.which("code2wav", path=str(Path(sys.executable).parent)) or shutil.which("code2wav")
    assert exe, "the code2wav console script is not installed (pip install -e .)"
    return exe


def test_console_entry_point(ckpt, tmp_path):
    exe = _console_script()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the shrunk model's ops are tiny (see tests.models.one_thread)
    out = tmp_path / "example.wav"
    r = subprocess.run([exe, "decode", str(EXAMPLE), "-o", str(out), "--model", str(ckpt)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert sf.info(str(out)).frames == 50 * SPF
    assert "50 frames" in r.stdout
    r = subprocess.run([exe, "decode", str(tmp_path / "missing.npy"), "-o", str(out), "--model", str(ckpt)], capture_output=True, text=True, env=env)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "no such file" in r.stderr and "Traceback" not in r.stderr


def test_example_codes_asset_is_reproducible():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from make_example_codes import example_codes
    finally:
        sys.path.pop(0)
    a = np.load(EXAMPLE)
    assert a.dtype == np.int64 and a.shape == (50, 16)
    assert np.array_equal(a, example_codes())


@pytest.mark.slow
def test_embedded_default_model(tmp_path, monkeypatch, capsys):
    """No --model: the full-size embedded default (random weights) is written to the cache and used."""
    monkeypatch.setenv("CODE2WAV_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "o.wav"
    assert main(["decode", save(tmp_path, "c.npy", rand_codes(2)), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert "RANDOM weights" in captured.err
    assert sf.info(str(out)).frames == 2 * SPF
    assert any((tmp_path / "cache").iterdir())


def test_set_reaches_every_engine_knob_by_name():
    """``--set FIELD=VALUE``: top-level and dotted sub-config fields, each value parsed by the
    field's type; an unknown field or a bad value is a one-line CliError naming it."""
    from code2wav.engine.build import EngineConfig
    from code2wav.options import CliError, apply_settings

    cfg = apply_settings(EngineConfig(), ["max_streams=8", "layers.convt_gemm=false", "schedule.first_chunk_wait=0",
                                          "layers.conv_fold=none", "idle_timeout=none", "graphs=off"])
    assert cfg.max_streams == 8 and cfg.layers.convt_gemm is False and cfg.schedule.first_chunk_wait == 0.0
    assert cfg.layers.conv_fold == "none" and cfg.idle_timeout is None and cfg.graphs is False
    assert EngineConfig().layers.convt_gemm is True  # the default is untouched
    for bad, says in (("nope=1", "no field 'nope'"), ("layers.conv_fold=some", "expected one of"), ("max_streams=x", "a number"),
                      ("max_streams=0", "positive"), ("layers=1", "expected"), ("graphs", "FIELD=VALUE")):
        with pytest.raises(CliError, match=says):
            apply_settings(EngineConfig(), [bad])
