"""code2wav as SGLang-Omni's Qwen3-TTS vocoder stage (code2wav.integrations.sglang_omni).

Driven through the stack's own scheduler loop, messages and payloads (tests/stacks/sglang_driver.py:
``start()`` on its thread, ``IncomingMessage``/``StreamItem``/``StagePayload`` in, ``abort()``
called directly, ``OutgoingMessage`` out), with stand-ins only for the engine modules its files
import (tests/stacks/sglang_stubs.py). Every stream's audio is checked against the whole-utterance
float64 forward of reference + generated codes with the reference cut, and SGLang-Omni 0.1.9's
own scheduler runs the same requests on the same weights beside ours.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("sglang_omni")
pytest.importorskip("msgspec")

from code2wav.integrations.sglang_omni import Code2WavVocoderScheduler, create_vocoder_executor  # noqa: E402
from code2wav.model.loading import load_decoder  # noqa: E402
from tests.models import forward_audio, one_thread, random_codes  # noqa: E402
from tests.stacks.sglang_driver import Request, StageDriver, run  # noqa: E402  (installs the stand-ins first)

SPF = 1920
PAYLOAD_TOL = 6e-8  # float32 payload: half an ulp of |x| <= 1 is 3e-8, plus the decode's own error
EXACT_TOL = 1e-9  # the float64 waveforms before serialisation


@pytest.fixture(scope="module")
def m64(ckpt):
    return load_decoder(ckpt, dtype=torch.float64)


def ours(ckpt, slots: int = 8) -> Code2WavVocoderScheduler:
    s = create_vocoder_executor(str(ckpt), device="cpu", dtype="float64", codec_state_slots=slots)
    s.recorded = {}  # the float64 waveforms it emits, before audio_waveform_payload's float32
    s.decode_calls = []
    emit, decode = s.stream_chunk_message, s.engine.decode

    def record(rid, wave):
        s.recorded.setdefault(rid, []).append(wave.clone())
        return emit(rid, wave)

    def spy(chunks, *a, **k):
        s.decode_calls.append({rid: int(c.shape[0]) for rid, c in chunks.items()})
        return decode(chunks, *a, **k)

    s.stream_chunk_message, s.engine.decode = record, spy
    return s


def expected(m64, r: Request) -> np.ndarray:
    return forward_audio(m64, torch.cat([r.ref, r.gen]))[r.ref.shape[0] * SPF :].numpy()


def ragged(n: int, seed: int) -> list[int]:
    g, out = np.random.default_rng(seed), []
    while sum(out) < n:
        out.append(min(int(g.integers(1, 8)), n - sum(out)))
    return out


def requests() -> list[Request]:
    c = random_codes(160, seed=3)
    return [
        Request("ref-fixed", c[:20], c[20:110], [1] * 90),  # one frame a talker step, past 72 frames
        Request("noref-ramp", c[:0], c[110:167], [4, 4, 8, 16, 25], start=2),
        Request("ref-ragged", c[140:147], c[40:80], ragged(40, 1), start=5),
        Request("short", c[:0], c[80:85], [2, 3], start=30),
    ]


def assert_stream_ok(d: StageDriver, m64, r: Request, tol: float = PAYLOAD_TOL) -> None:
    kinds = d.kinds(r.rid)
    assert kinds[-1] == "result" and set(kinds[:-1]) == {"stream"}, kinds
    result = d.out[r.rid][-1].data.data
    assert result == {"modality": "audio", "sample_rate": 24000, "finish_reason": "stop",
                      "usage": {"prompt_tokens": r.ref.shape[0], "completion_tokens": r.gen.shape[0], "total_tokens": r.ref.shape[0] + r.gen.shape[0]}}
    audio, want = d.audio(r.rid), expected(m64, r)
    assert audio.shape == want.shape, "exactly the generated frames' audio: no reference audio, nothing held back"
    assert np.abs(audio - want).max() <= tol


def test_version_outside_the_range_is_a_clear_import_error(monkeypatch):
    import code2wav.integrations as integrations

    path = Path(integrations.__file__).parent / "sglang_omni" / "__init__.py"
    for found in ("0.1.8", "0.2.0"):
        monkeypatch.setattr(integrations, "version", lambda dist, found=found: found)
        spec = importlib.util.spec_from_file_location("code2wav_sglang_probe", path)
        with pytest.raises(ImportError, match=rf"sglang-omni>=0.1.9,<0.2, found {found}.*code2wav\[sglang-omni\]"):
            spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_the_factory_path_line_selects_code2wav(ckpt, tmp_path):
    """The documented line on SGLang-Omni's own pipeline config; the stack resolves the stage's
    factory arguments against our signature, and the factory builds with them."""
    from sglang_omni.config import FactoryArgs
    from sglang_omni.config.runtime import resolve_stage_factory_args
    from sglang_omni.models.qwen3_tts.config import Qwen3TTSPipelineConfig
    from sglang_omni.scheduling.streaming_vocoder import StreamingVocoderBase

    (tmp_path / "config.json").write_text('{"tts_model_type": "base", "tts_model_size": "0b6"}')
    (tmp_path / "speech_tokenizer").symlink_to(ckpt, target_is_directory=True)
    config = Qwen3TTSPipelineConfig(model_path=str(tmp_path))
    config.stage_named("vocoder").factory_path = "code2wav.integrations.sglang_omni.create_vocoder_executor"
    # (the engine's admission size, which the stack would read from its SGLang engine defaults)
    config.stage_named("tts_engine").factory = FactoryArgs(dtype="bfloat16", server_args_overrides={"max_running_requests": 16})
    args = resolve_stage_factory_args(config.stage_named("vocoder"), config)
    assert args["model_path"] == str(tmp_path) and args["running_stream_count"] == 16 and args["dtype"] == "bfloat16"
    sched = create_vocoder_executor(**{**args, "device": "cpu"})
    assert isinstance(sched, StreamingVocoderBase) and sched.engine.max_streams == 64 and sched.engine.dtype == torch.bfloat16


def test_streams_are_exact_and_agree_with_sglang_omnis_own_scheduler(ckpt, m64):
    from tests.stacks.sglang_stubs import their_scheduler

    with one_thread():
        s = ours(ckpt)
        d = run(s, requests(), payload_first={"ref-ragged"})
        theirs = run(their_scheduler(ckpt, dtype=torch.float64), requests(), payload_first={"ref-ragged"})
    for r in requests():
        assert_stream_ok(d, m64, r)
        exact = torch.cat(s.recorded[r.rid]).numpy()
        assert exact.dtype == np.float64 and np.abs(exact - expected(m64, r)).max() <= EXACT_TOL
        # SGLang-Omni's stateful decoder on the same weights and messages: the same stream of
        # audio, the same result; it is exact up to its own rounding (measured ~1e-7 here).
        assert theirs.kinds(r.rid)[-1] == "result" and theirs.out[r.rid][-1].data.data == d.out[r.rid][-1].data.data
        assert np.abs(theirs.audio(r.rid) - d.audio(r.rid)).max() <= 1e-6
    assert s.engine.slots_in_use == 0, "finish freed every slot"
    # Several streams in different phases (a first chunk beside running ones) shared one decode.
    first_ragged = next(call for call in s.decode_calls if "ref-ragged" in call)  # its first chunk, after its prefill
    assert len(first_ragged) >= 2 and first_ragged["ref-ragged"] < 40
    # The stack's chunk policy (ramp 1, 2, 4, then 8): the 1-frame stream is decoded at 1, 3, 7,
    # 15, ... frames; stream done decodes what is left (finish).
    fixed = [call["ref-fixed"] for call in s.decode_calls if "ref-fixed" in call]
    assert fixed == [1, 2, 4] + [8] * 10 + [3]


def test_a_malformed_chunk_fails_its_request_alone(ckpt, m64):
    c = random_codes(60, seed=5)
    good = Request("good", c[:6], c[6:46], [1] * 40)
    big = Request("big-code", c[:0], c[10:30], [5, 5, 5, 5], start=1)
    big.gen = big.gen.clone()
    big.gen[12, 3] = 5000
    narrow = Request("narrow", c[:0], c[30:50, :8], [4] * 5, start=2)
    with one_thread():
        s = ours(ckpt)
        d = run(s, [good, big, narrow])
    assert_stream_ok(d, m64, good)
    (e1,) = d.errors("big-code")
    assert "outside" in str(e1) and "big-code" in str(e1) and d.kinds("big-code")[-1] == "error"
    (e2,) = d.errors("narrow")
    assert "quantizers" in str(e2) or "16" in str(e2)
    assert "result" not in d.kinds("big-code") + d.kinds("narrow")
    assert s.engine.slots_in_use == 0


def test_abort_mid_stream_frees_its_slot(ckpt, m64):
    c = random_codes(80, seed=7)
    a = Request("aborted", c[:4], c[4:44], [2] * 20)
    b = Request("kept", c[:0], c[44:74], [3] * 10)
    late = Request("late", c[:5], c[50:70], [4] * 5, start=6)  # needs the aborted stream's slot
    with one_thread():
        s = ours(ckpt, slots=2)
        d = run(s, [a, b, late], abort_at={"aborted": 3})
    kinds = d.kinds("aborted")
    assert "result" not in kinds and "error" not in kinds
    got = d.audio("aborted")  # what went out before the abort: exact, whole frames, at most the 6 sent
    assert 0 < len(got) <= 6 * SPF and len(got) % SPF == 0 and np.abs(got - expected(m64, a)[: len(got)]).max() <= PAYLOAD_TOL
    assert_stream_ok(d, m64, b)
    assert_stream_ok(d, m64, late)
    assert s.engine.slots_in_use == 0 and not s.stream_states


def test_pool_exhaustion_is_a_clear_error(ckpt, m64):
    c = random_codes(60, seed=9)
    rs = [Request(f"s{i}", c[:3], c[10 * i : 10 * i + 20], [2] * 10) for i in range(3)]
    with one_thread():
        s = ours(ckpt, slots=2)
        d = run(s, rs)
    (err,) = d.errors("s2")
    assert type(err).__name__ == "PoolFull" and "s2" in str(err)
    for r in rs[:2]:
        assert_stream_ok(d, m64, r)
    assert s.engine.slots_in_use == 0


def test_a_whole_utterance_request_is_exact(ckpt, m64):
    """``stream: false``: the payload's codes in one batched decode, the audio in the result."""
    c = random_codes(50, seed=11)
    rs = [Request("whole-ref", c[:9], c[9:50], [41], params={"stream": False}), Request("whole", c[:0], c[:30], [30], params={"stream": False})]
    with one_thread():
        s = ours(ckpt)
        d = StageDriver(s)
        try:
            d.send([r.payload() for r in rs])
        finally:
            d.close()
    for r in rs:
        (msg,) = d.out[r.rid]
        assert msg.type == "result"
        data = msg.data.data
        audio = np.frombuffer(data["audio_waveform"], dtype=np.float32)
        assert data["finish_reason"] == "stop" and data["sample_rate"] == 24000 and audio.shape == expected(m64, r).shape
        assert np.abs(audio - expected(m64, r)).max() <= PAYLOAD_TOL
    assert s.engine.slots_in_use == 0
