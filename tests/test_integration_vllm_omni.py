"""code2wav's vLLM-Omni Code2Wav stage (code2wav.integrations.vllm_omni), driven as vLLM-Omni does.

Payloads come from vLLM-Omni's own talker-side code (``talker2code2wav_async_chunk``: the first
chunk carries the reference prefix, later ones only new frames; ``talker2code2wav_full_payload``:
one finished payload), imported from the installed wheel; tests/stacks/vllm_stubs.py stands in
only for the vllm modules those files import. Every request's audio must equal the float64
whole-utterance forward of (reference + generated) with the reference's audio cut. vLLM-Omni's
own stage, ``Qwen3TTSCode2Wav``, runs beside ours on the same payloads and weights.
"""

from __future__ import annotations

import importlib
import logging
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from tests.models import SMALL, forward_audio, model, one_thread, random_codes
from tests.stacks import vllm_stubs

installed = vllm_stubs.install()
from tests.stacks import vllm_talker as vt  # noqa: E402  (vLLM-Omni's talker side, on the stand-ins)

SPF = 1920
ROOT = Path(__file__).resolve().parents[1]
RAMP = {"codec_chunk_frames": 25, "codec_left_context_frames": 72, "codec_chunk_ramp": [4, 4, 8, 16, 25]}
IC1 = {"codec_chunk_frames": 25, "codec_left_context_frames": 72, "initial_codec_chunk_frames": 1}


@pytest.fixture(scope="module", autouse=True)
def _stand_ins():
    """The vllm stand-ins stay for this module's tests only (the rest of the suite never sees them)."""
    vllm_stubs.install()
    yield
    if installed:
        vllm_stubs.remove()


@pytest.fixture(autouse=True)
def _threads():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def model_dir(ckpt, tmp_path_factory):
    """A Qwen3-TTS model directory: the checkpoint under ``speech_tokenizer/``."""
    root = tmp_path_factory.mktemp("qwen3tts")
    (root / "speech_tokenizer").symlink_to(ckpt, target_is_directory=True)
    return root


def stage(model_dir, dtype=torch.float64, theirs=False, async_chunk=True, **extra):
    if theirs:
        from vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_code2wav import Qwen3TTSCode2Wav as cls
    else:
        from code2wav.integrations.vllm_omni.stage import Code2WavQwen3TTSCode2Wav as cls
    s = cls(vllm_config=vt.stage_config(str(model_dir), dtype=dtype, async_chunk=async_chunk, extra=extra))
    s.load_weights(iter([("talker.weight", torch.zeros(1))]))
    return s


def expected(ref: torch.Tensor | None, gen: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """The exact decode of (reference + generated), the reference's audio cut."""
    p = 0 if ref is None else ref.shape[0]
    codes = gen if ref is None else torch.cat([ref, gen])
    return forward_audio(model(SMALL, dtype), codes)[p * SPF:]


def corr(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    return float((a @ b) / (a.norm() * b.norm() + 1e-30))


def run(st, steps: list[list[tuple[str, dict]]], placeholders=False) -> tuple[dict[str, list[torch.Tensor]], list[int]]:
    """Feed ``st`` one forward per step; returns each request's audio pieces and each step's rows."""
    out: dict[str, list[torch.Tensor]] = {}
    for rows in steps:
        audio = vt.audio_of(st(**vt.forward_args(rows, placeholders)))
        assert len(audio) == len(rows)
        for (rid, _), a in zip(rows, audio):
            out.setdefault(rid, []).append(a)
    return out, [len(r) for r in steps]


def lockstep(requests: dict[str, tuple[vt.Connector, torch.Tensor, torch.Tensor | None, int]]) -> list[list[tuple[str, dict]]]:
    """Talker steps: request ``rid`` starts at step ``start`` and makes one frame a step; each
    runner step carries the payloads its talker step emitted (scheduler id: ``rid + '#s'``)."""
    steps = []
    for t in range(max(start + len(gen) for _, gen, _, start in requests.values())):
        rows = []
        for rid, (conn, gen, ref, start) in requests.items():
            i = t - start
            if 0 <= i < len(gen):
                p = conn.step(rid, gen[i], ref, finished=i == len(gen) - 1)
                if p is not None:
                    rows.append((rid + "#s", p))
        if rows:
            steps.append(rows)
    return steps


def test_streaming_icl_and_xvector_batched_in_every_phase_are_exact(model_dir):
    """Four requests (x-vector and ICL; first chunk of 1 frame and the [4,4,8,16,25] ramp; a
    reference longer than the 72 frames the talker keeps) run 150 frames each, starting at
    different steps, so forwards mix first chunks, ramp chunks and steady chunks. Each request's
    audio is the exact decode of its (reference + generated) in float64, and none of the
    reference's audio comes out."""
    st = stage(model_dir)
    ic1, ramp = vt.Connector(IC1), vt.Connector(RAMP)
    reqs = {
        "xv-1": (ic1, random_codes(150, seed=1), None, 3),
        "icl-1": (ic1, random_codes(150, seed=2), random_codes(30, seed=3), 7),
        "xv-ramp": (ramp, random_codes(150, seed=4), None, 0),
        "icl-ramp": (ramp, random_codes(150, seed=5), random_codes(100, seed=6), 0),
    }
    steps = lockstep(reqs)
    # talker step 3: three first chunks (1 frame; 4 + 72 reference frames; 4); step 7: icl-1's
    # first chunk (1 + 30 reference frames) beside both ramps' second chunks
    seen: set[str] = set()
    mixed = False
    for rows in steps:
        firsts = sum(rid not in seen for rid, _ in rows)
        mixed |= len(rows) >= 3 and 0 < firsts < len(rows)
        seen |= {rid for rid, _ in rows}
    assert mixed, "first and later chunks share a forward"
    out, sizes = run(st, steps)
    assert max(sizes) >= 3, "several requests share forwards"
    for rid, (_, gen, ref, _) in reqs.items():
        audio = torch.cat(out[rid + "#s"])
        used = None if ref is None else ref[-72:]  # the talker sends the last 72 reference frames
        want = expected(used, gen)
        assert audio.dtype == torch.float64 and audio.shape == want.shape == (150 * SPF,)
        assert (audio - want).abs().max().item() < 1e-9, rid
        if used is not None:
            ref_audio = forward_audio(model(SMALL, torch.float64), used)
            n = ref_audio.numel()
            assert corr(torch.cat([ref_audio, want])[:n], ref_audio) > 0.999  # the check sees a leak
            assert abs(corr(audio[:n], ref_audio)) < 0.5, f"{rid}: reference audio leaked"
    assert st.streams == 0, "every finished request's stream is freed"


def test_theirs_agrees_up_to_72_frames_then_diverges_ours_stays_exact(model_dir):
    """vLLM-Omni's own stage on the same payloads and weights (float64): it agrees with the
    exact decode up to frame 72 (float32-level differences: its RMSNorm runs in float32) and
    diverges past its 72-frame window; ours is exact throughout."""
    ours, theirs = stage(model_dir), stage(model_dir, theirs=True)
    gens = {"xv": (random_codes(150, seed=11), None), "icl": (random_codes(150, seed=12), random_codes(20, seed=13))}
    for name, st in (("ours", ours), ("theirs", theirs)):
        conn = vt.Connector(IC1)
        steps = lockstep({rid: (conn, g, r, 0) for rid, (g, r) in gens.items()})
        out, sizes = run(st, steps)
        assert max(sizes) == 2
        for rid, (gen, ref) in gens.items():
            audio = torch.cat(out[rid + "#s"]).double()
            err = (audio - expected(ref, gen)).abs().reshape(150, SPF).amax(1)
            if name == "ours":
                assert err.max().item() < 1e-9
            else:
                assert err[:72].max().item() < 1e-5, f"{rid}: theirs agrees up to 72 frames"
                assert err[72:].max().item() > 1e-3, f"{rid}: theirs diverges past 72 frames"
    assert ours.streams == 0 and not theirs._decoder_state_cache


def test_full_payload_path_is_exact(model_dir):
    """The non-streaming path: one finished payload per request (reference prepended, its size
    in left_context_size, no request id in the payload: the runner's id keys it), codes in the
    payload and placeholder tokens in input_ids, two requests in one forward."""
    st = stage(model_dir, async_chunk=False)
    reqs = {"a": (random_codes(90, seed=21), random_codes(40, seed=22)), "b": (random_codes(30, seed=23), None)}
    rows = [(f"{rid}#s", vt.full_payload(rid, gen, ref)) for rid, (gen, ref) in reqs.items()]
    assert "request_id" not in rows[0][1]["meta"] and rows[0][1]["meta"]["left_context_size"] == 40
    out, _ = run(st, [rows], placeholders=True)
    for rid, (gen, ref) in reqs.items():
        assert (out[f"{rid}#s"][0] - expected(ref, gen)).abs().max().item() < 1e-9
    assert st.streams == 0


def test_float32_stage_within_1e4_of_peak(model_dir):
    st = stage(model_dir, torch.float32)
    gen, ref = random_codes(120, seed=31), random_codes(24, seed=32)
    out, _ = run(st, lockstep({"r": (vt.Connector(RAMP), gen, ref, 0)}))
    audio, want = torch.cat(out["r#s"]), expected(ref, gen)
    assert audio.dtype == torch.float32
    assert (audio.double() - want).abs().max().item() < 1e-4 * want.abs().max().item()


def test_malformed_rows_are_dropped_alone(model_dir, caplog):
    """A row whose codes are not whole frames, and one with a code out of range, are dropped
    with an error naming the request; that request's later rows are dropped and its stream is
    freed; the other request in the same forwards stays exact."""
    st = stage(model_dir)
    conn = vt.Connector(IC1)
    gens = {rid: random_codes(40, seed=40 + i) for i, rid in enumerate(("good", "short", "range"))}
    steps = lockstep({rid: (conn, g, None, 0) for rid, g in gens.items()})
    bad_at = 1  # the second step: every request's second chunk (25 frames)
    for rid, p in steps[bad_at]:
        if rid == "short#s":
            p["codes"]["audio"] = p["codes"]["audio"][:-1]
        if rid == "range#s":
            p["codes"]["audio"] = p["codes"]["audio"].clone()
            p["codes"]["audio"][3] = 5000
    with caplog.at_level(logging.ERROR):
        out, _ = run(st, steps)
    assert (torch.cat(out["good#s"]) - expected(None, gens["good"])).abs().max().item() < 1e-9
    for rid in ("short#s", "range#s"):
        assert out[rid][0].numel() == SPF and all(a.numel() == 0 for a in out[rid][bad_at:])
        assert any(rid in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    assert "whole frames" in caplog.text
    assert st.streams == 0


def test_abort_mid_stream_frees_the_slot_for_a_new_request(model_dir):
    """With a pool of two, a request aborted mid-stream (on_requests_finished with its
    scheduler id) gives its slot back; a new request takes it, and both it and the request that
    kept running stay exact."""
    st = stage(model_dir, code2wav_max_streams=2)
    conn = vt.Connector(IC1)
    a, b, c = (random_codes(60, seed=s) for s in (51, 52, 53))
    steps = lockstep({"a": (conn, a, None, 0), "b": (conn, b, None, 0)})
    head, _ = run(st, steps[:2])  # 1 + 25 frames each
    assert st.streams == 2
    st.on_requests_finished({"a#s"})
    assert st.streams == 1
    rest = lockstep({"b": (conn, b[26:], None, 0), "c": (conn, c, None, 0)})
    # b's talker state lives on in conn, so its remaining frames chunk as the stream goes on
    tail, _ = run(st, rest)
    assert (torch.cat(head["b#s"] + tail["b#s"]) - expected(None, b)).abs().max().item() < 1e-9
    assert (torch.cat(tail["c#s"]) - expected(None, c)).abs().max().item() < 1e-9
    assert st.streams == 0
    st.on_requests_finished({"a#s", "never-seen"})  # finished again / unknown: nothing to do


def test_pool_exhaustion_is_a_clear_error_for_that_request_only(model_dir, caplog):
    st = stage(model_dir, code2wav_max_streams=1)
    conn = vt.Connector(IC1)
    a, b = random_codes(30, seed=61), random_codes(30, seed=62)
    with caplog.at_level(logging.ERROR):
        out, _ = run(st, lockstep({"a": (conn, a, None, 0), "b": (conn, b, None, 0)}))
    assert (torch.cat(out["a#s"]) - expected(None, a)).abs().max().item() < 1e-9
    assert all(x.numel() == 0 for x in out["b#s"])
    assert "all 1 stream slots are in use" in caplog.text and "code2wav_max_streams" in caplog.text
    out, _ = run(st, lockstep({"d": (vt.Connector(IC1), b, None, 0)}))  # the slot is free again
    assert (torch.cat(out["d#s"]) - expected(None, b)).abs().max().item() < 1e-9


def test_segment_boundary_starts_a_fresh_stream(model_dir):
    """``is_segment_finished`` ends the stream; the request's next segment opens a new one."""
    st = stage(model_dir)
    s1, s2 = random_codes(30, seed=71), random_codes(27, seed=72)
    seg1 = vt.Connector(IC1).stream("r", s1, segment=True)  # segment 2: a fresh talker-side state
    seg2 = vt.Connector(IC1).stream("r", s2)
    assert bool(seg1[-1]["meta"]["is_segment_finished"]) and not bool(seg1[-1]["meta"]["finished"])
    out, _ = run(st, [[("r#s", p)] for p in seg1])
    assert st.streams == 0
    out2, _ = run(st, [[("r#s", p)] for p in seg2])
    assert (torch.cat(out["r#s"]) - expected(None, s1)).abs().max().item() < 1e-9
    assert (torch.cat(out2["r#s"]) - expected(None, s2)).abs().max().item() < 1e-9


def test_dummy_runs_decode_and_free(model_dir):
    """The runners' dummy runs: vLLM's v1 runner (our dummy metadata, one token span), MRv2
    (empty per-request dicts, no ids), and a span that is not whole frames."""
    st = stage(model_dir)
    info = st.get_dummy_runtime_additional_information(2)
    out = st(input_ids=torch.zeros(16 * 8, dtype=torch.long), positions=None, runtime_additional_information=info,
             seq_token_counts=[16 * 8])
    assert [a.numel() for a in vt.audio_of(out)] == [8 * SPF] and int(out.multimodal_outputs["sr"][0]) == 24000
    out = st(input_ids=torch.zeros(16 * 4, dtype=torch.long), runtime_additional_information=[{}, {}], seq_token_counts=[32, 32])
    assert [a.numel() for a in vt.audio_of(out)] == [2 * SPF, 2 * SPF]
    out = st(input_ids=torch.zeros(100, dtype=torch.long), runtime_additional_information=info[:1], seq_token_counts=[100])
    assert [a.numel() for a in vt.audio_of(out)] == [0]
    assert st.streams == 0
    assert st.embed_input_ids(torch.zeros(5, dtype=torch.long)).shape == (5, 1) and st.compute_logits(None) is None


def test_plugin_entry_point_registers_the_architecture():
    """pyproject declares the vllm.general_plugins entry point; calling it registers our
    architecture in vLLM-Omni's own model registry (which resolves a stage's model_arch) and in
    vLLM's ModelRegistry, resolving to our class."""
    from vllm.model_executor.models import ModelRegistry
    from vllm_omni.model_executor.models.registry import OmniModelRegistry

    from code2wav.integrations.vllm_omni import ARCH
    from code2wav.integrations.vllm_omni.stage import Code2WavQwen3TTSCode2Wav

    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["vllm.general_plugins"]
    (target,) = eps.values()
    module, _, func = target.partition(":")
    getattr(importlib.import_module(module), func)()
    getattr(importlib.import_module(module), func)()  # vLLM may load plugins more than once
    for registry in (OmniModelRegistry, ModelRegistry):
        assert registry.models[ARCH].load_model_cls() is Code2WavQwen3TTSCode2Wav
    assert "Qwen3TTSCode2Wav" in OmniModelRegistry.models  # vLLM-Omni's own stage is still there


@pytest.mark.parametrize("found", ["0.31.0", "0.29.2", None])
def test_version_outside_the_range_is_a_clear_import_error(monkeypatch, found):
    import code2wav.integrations as integ

    def version(dist):
        if found is None:
            raise integ.PackageNotFoundError(dist)
        return found

    monkeypatch.setattr(integ, "version", version)
    monkeypatch.delitem(sys.modules, "code2wav.integrations.vllm_omni.stage", raising=False)
    with pytest.raises(ImportError, match=r"vllm-omni>=0\.30,<0\.31") as e:
        importlib.import_module("code2wav.integrations.vllm_omni.stage")
    assert (found or "not installed") in str(e.value) and "code2wav[vllm-omni]" in str(e.value)
