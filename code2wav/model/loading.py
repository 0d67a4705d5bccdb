"""Find and load a Qwen3-TTS-Tokenizer-12Hz decoder checkpoint.

Accepted ``--model`` forms:
  * a tokenizer directory holding ``config.json`` + ``model.safetensors`` (what the official
    tokenizer's ``save_pretrained`` writes: ``decoder.*`` and ``encoder.*`` keys; the encoder half
    is ignored);
  * a full Qwen3-TTS model directory with that tokenizer under ``speech_tokenizer/``;
  * a Hugging Face hub id (``Qwen/Qwen3-TTS-Tokenizer-12Hz`` or a full model's id);
  * nothing: the embedded default, deterministic random weights of the real architecture that
    code2wav writes once into its cache directory in the same layout and loads the same way.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from code2wav.model.choices import LayerChoices
from code2wav.model.config import DecoderConfig
from code2wav.model.decoder import Decoder

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
SUBFOLDER = "speech_tokenizer"
PREFIX = "decoder."
DEFAULT_SEED = 0


class CheckpointError(RuntimeError):
    """The checkpoint cannot be found, read, or does not match the decoder architecture."""


def cache_dir() -> Path:
    return Path(os.environ.get("CODE2WAV_CACHE", Path.home() / ".cache" / "code2wav"))


def _is_tokenizer_dir(p: Path) -> bool:
    return (p / CONFIG_FILE).is_file() and (p / WEIGHTS_FILE).is_file()


def resolve_checkpoint(spec: str | os.PathLike[str] | None) -> Path:
    """Turn a ``--model`` value into a local tokenizer directory."""
    if spec is None:
        return default_checkpoint()
    p = Path(spec).expanduser()
    if p.exists():
        for cand in (p / SUBFOLDER, p):  # a full model's root holds the talker's config + weights
            if _is_tokenizer_dir(cand):
                return cand
        raise CheckpointError(
            f"{p}: not a tokenizer checkpoint (need {CONFIG_FILE} + {WEIGHTS_FILE} here or under {SUBFOLDER}/)"
        )
    return _download(str(spec))


def _download(repo_id: str) -> Path:
    """A hub id's tokenizer files, from the Hugging Face cache or the hub.

    Without a network huggingface_hub retries with back-off (about 48 s, two lookups here)
    before it gives up, so the hub is probed first with one request and no retries, its
    timeout ``HF_HUB_ETAG_TIMEOUT`` (huggingface_hub's own setting, 10 s by default). An
    unreachable hub falls back to the cache; ``HF_HUB_OFFLINE=1`` asks the cache only."""
    if repo_id.count("/") != 1 or repo_id.startswith((".", "/")):
        raise CheckpointError(f"{repo_id}: no such directory, and not a hub id of the form owner/name")
    try:
        import httpx
        from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url
        from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
    except ImportError as e:  # pragma: no cover - huggingface_hub is a dependency
        raise CheckpointError(f"huggingface_hub is needed to fetch {repo_id}") from e
    instead = "download it elsewhere and pass the local directory with --model PATH"
    offline = constants.is_offline_mode()
    if not offline:
        try:
            get_hf_file_metadata(hf_hub_url(repo_id, CONFIG_FILE), timeout=constants.HF_HUB_ETAG_TIMEOUT)
        except httpx.TransportError as e:  # connection refused, DNS, timeout: no network to the hub
            cached = _from_cache(repo_id, hf_hub_download, (EntryNotFoundError, LocalEntryNotFoundError))
            if cached is not None:
                return cached
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CheckpointError(f"cannot reach the Hugging Face hub at {constants.ENDPOINT} ({reason}), and {repo_id} is not in "
                                  f"the local cache ({constants.HF_HUB_CACHE}); {instead}") from None
        except Exception:  # the hub answered (a missing file at the root, an unknown repo, auth): the downloads below say which
            pass
    unreachable: Exception | None = None
    for sub in (SUBFOLDER, None):  # a full model keeps the tokenizer under speech_tokenizer/
        try:
            cfg = hf_hub_download(repo_id, CONFIG_FILE, subfolder=sub)
            hf_hub_download(repo_id, WEIGHTS_FILE, subfolder=sub)
            return Path(cfg).parent
        except LocalEntryNotFoundError as e:  # offline and not cached here: try the other place
            unreachable = e
        except EntryNotFoundError:  # the repo has no such file: try the other place
            continue
        except Exception as e:  # unknown repo, auth, network: all end the same way for the user
            unreachable = e
            break
    if offline:
        raise CheckpointError(f"{repo_id} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}), and HF_HUB_OFFLINE is set, "
                              f"so the hub was not asked; {instead}, or unset HF_HUB_OFFLINE")
    if unreachable is not None:
        raise CheckpointError(
            f"could not fetch {repo_id} from the Hugging Face hub ({type(unreachable).__name__}); {instead}"
        ) from unreachable
    raise CheckpointError(f"{repo_id}: no {CONFIG_FILE}/{WEIGHTS_FILE} at the root or under {SUBFOLDER}/")


def _from_cache(repo_id: str, hf_hub_download, missing: tuple[type[Exception], ...]) -> Path | None:
    """The tokenizer files of ``repo_id`` already in the Hugging Face cache, asking no network."""
    for sub in (SUBFOLDER, None):
        try:
            cfg = hf_hub_download(repo_id, CONFIG_FILE, subfolder=sub, local_files_only=True)
            hf_hub_download(repo_id, WEIGHTS_FILE, subfolder=sub, local_files_only=True)
            return Path(cfg).parent
        except missing:
            continue
    return None


def read_config(ckpt: Path) -> DecoderConfig:
    try:
        raw = json.loads((ckpt / CONFIG_FILE).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{ckpt / CONFIG_FILE}: unreadable ({e})") from e
    dec = raw.get("decoder_config", raw)
    if not isinstance(dec, dict):
        raise CheckpointError(f"{ckpt / CONFIG_FILE}: decoder_config is not an object")
    try:
        return DecoderConfig.from_dict(dec, sample_rate=int(raw.get("output_sample_rate", 24000)))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{ckpt / CONFIG_FILE}: bad decoder_config ({e})") from e


def load_decoder(
    spec: str | os.PathLike[str] | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    channels_last: bool = True,
    low_rate_dtype: torch.dtype | str | None = "auto",
    layers: LayerChoices | None = None,
) -> Decoder:
    """Load the decoder, fold its codebooks and move it to ``device``/``dtype`` in eval mode
    (the stages before the conv stack in ``low_rate_dtype``: see ``Decoder.to_dtypes``; the
    default ``"auto"``: float16 on CUDA under a half ``dtype`` where the loaded weights leave it
    room, ``model/low_rate.py``; None: float32 under a half ``dtype``).
    ``channels_last`` (CUDA only; default) runs the conv stack in [B, L, C] memory layout, which
    cuDNN's NHWC kernels and the Triton kernels run fastest on (BENCHMARKS.md). ``layers``: which
    kernel or layer forms the model runs (``model/choices.py``; default ``LayerChoices()``)."""
    from safetensors import safe_open

    ckpt = resolve_checkpoint(spec)
    cfg = read_config(ckpt)
    model = Decoder(cfg)
    expected = model.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(ckpt / WEIGHTS_FILE), framework="pt") as f:
            for key in f.keys():
                if key.startswith(PREFIX):
                    tensors[key[len(PREFIX) :]] = f.get_tensor(key)
    except Exception as e:
        raise CheckpointError(f"{ckpt / WEIGHTS_FILE}: unreadable safetensors file ({e})") from e
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    mismatched = [
        f"{k}: checkpoint {tuple(tensors[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in sorted(set(expected) & set(tensors))
        if tensors[k].shape != expected[k].shape
    ]
    if missing or unexpected or mismatched:
        lines = [f"{ckpt / WEIGHTS_FILE} does not match the decoder in {CONFIG_FILE}:"]
        for title, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", mismatched)):
            if items:
                shown = ", ".join(PREFIX + i if title != "shape mismatch" else PREFIX + i for i in items[:20])
                more = f" (+{len(items) - 20} more)" if len(items) > 20 else ""
                lines.append(f"  {title} ({len(items)}): {shown}{more}")
        raise CheckpointError("\n".join(lines))
    # The stored weights as they are; to_dtypes folds in float64 and casts once to each dtype.
    model.load_state_dict(tensors, strict=True, assign=True)
    auto = low_rate_dtype == "auto"
    model.to_dtypes(dtype, device, None if auto else low_rate_dtype)  # type: ignore[arg-type]
    if layers is not None:
        model.set_layer_choices(layers)
    if torch.device(device).type == "cuda":
        configure_cuda(dtype)
        if channels_last:
            model.channels_last()
    if auto:
        from code2wav.model.low_rate import auto_low_rate

        auto_low_rate(model)
    return model


def low_rate_arg(name: str | None) -> torch.dtype | str | None:
    """A ``--low-rate-dtype`` / ``EngineConfig.low_rate_dtype`` value as ``load_decoder`` takes
    it: a dtype's name, ``"auto"``, or None."""
    return name if name in (None, "auto") else getattr(torch, name)


def configure_cuda(dtype: torch.dtype) -> None:
    """Process-wide cuDNN settings for decoding on a GPU.

    float32 means float32: cuDNN convolutions default to TF32 (10-bit mantissa), which puts a
    ~1e-3 relative error on this decoder's output, so TF32 is turned off (bfloat16 is the fast
    dtype). Step shapes are bucketed and repeat, so letting cuDNN time its algorithms once per
    shape pays: its default heuristic picks slow legacy kernels for some of them (BENCHMARKS.md)."""
    if dtype == torch.float32:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True


def default_checkpoint(seed: int = DEFAULT_SEED, quiet: bool = False) -> Path:
    """The embedded default: random weights of the released architecture, written once."""
    from code2wav.model.init import random_decoder

    target = cache_dir() / f"random-seed{seed}"
    if not quiet:
        print(
            "code2wav: no --model given; using deterministic RANDOM weights of the real architecture "
            f"(not the released Qwen3-TTS weights; the audio is noise) from {target}",
            file=sys.stderr,
        )
    if _is_tokenizer_dir(target):
        return target
    tmp = save_checkpoint(random_decoder(DecoderConfig(), seed=seed), target.with_name(target.name + f".tmp{os.getpid()}"))
    try:
        tmp.rename(target)
    except OSError:  # another process won the race; use theirs
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return target


def save_checkpoint(model: Decoder, path: Path) -> Path:
    """Write ``model`` in the official tokenizer layout (``config.json`` + ``decoder.*`` safetensors)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file({PREFIX + k: v.contiguous() for k, v in model.state_dict().items()}, str(path / WEIGHTS_FILE))
    (path / CONFIG_FILE).write_text(json.dumps(checkpoint_config(model.config), indent=2))
    return path


def checkpoint_config(cfg: DecoderConfig) -> dict:
    """The top-level tokenizer config.json for a decoder config (the official layout)."""
    return {
        "model_type": "qwen3_tts_tokenizer_12hz",
        "decoder_config": cfg.to_dict(),
        "output_sample_rate": cfg.sample_rate,
        "decode_upsample_rate": cfg.samples_per_frame,
        "code2wav_note": "random weights written by code2wav; not the released model",
    }
