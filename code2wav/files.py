"""The CLI's files: codes read from ``.npy``, audio written as ``.wav``/``.flac``/``.npy``.

Every problem with a file is a :class:`CliError` naming the file, raised before any weights load
where it can be.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from code2wav.options import CliError

OUTPUT_KINDS = (".wav", ".flac", ".npy")


def valid_frames(arr: np.ndarray, path: str, num_quantizers: int, codebook_size: int, what: str = "codes") -> np.ndarray:
    """Check an integer ``[F, Q]`` array read from ``path``; return its frames, trailing ``-1``
    padding dropped (``codes.drop_trailing_padding``: the one padding rule). Range and shape
    rules are ``codes.as_frames``'; the messages name the file."""
    from code2wav.codes import CodesError, as_frames, drop_trailing_padding

    if arr.dtype.kind not in "iu":
        raise CliError(f"{what} {path}: codes must be integers, got {arr.dtype}")
    if arr.ndim != 2 or arr.shape[1] != num_quantizers:
        raise CliError(f"{what} {path}: expected shape [frames, {num_quantizers}], got {list(arr.shape)}")
    arr = arr.astype(np.int64)
    bad = arr[:, 0][(arr[:, 0] < 0) & (arr[:, 0] != -1)]
    if bad.size:
        raise CliError(f"{what} {path}: code {int(bad[0])} outside [0, {codebook_size})")
    kept = drop_trailing_padding(arr)
    if (kept[:, 0] == -1).any():
        raise CliError(f"{what} {path}: -1 padding must come after every valid frame")
    try:
        return as_frames(kept, num_quantizers, codebook_size, what, allow_empty=True).numpy()
    except CodesError as e:
        raise CliError(f"{what} {path}: {str(e).removeprefix(what + ': ')}") from None


def read_npy(path: str, what: str) -> np.ndarray:
    p = Path(path)
    if not p.exists():
        raise CliError(f"{what} {path}: no such file")
    if not p.is_file():
        raise CliError(f"{what} {path}: not a file")
    try:
        arr = np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CliError(f"{what} {path}: not a readable .npy file ({reason})") from None
    if not isinstance(arr, np.ndarray):  # an .npz archive
        arr.close()
        raise CliError(f"{what} {path}: an .npz archive; expected one .npy array")
    return arr


def out_dir(path: str, flag: str) -> Path:
    """An output directory (``flag``'s value), made if missing."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CliError(f"{flag} {path}: cannot make the directory ({e.strerror or e})") from None
    return p


def check_output(path: str) -> str:
    """Validate an output path before any work is done; returns its kind (the extension)."""
    p = Path(path)
    kind = p.suffix.lower()
    if kind not in OUTPUT_KINDS:
        raise CliError(f"output {path}: unknown extension {p.suffix or '(none)'!r}; use one of {', '.join(OUTPUT_KINDS)}")
    if not p.parent.is_dir():
        raise CliError(f"output {path}: directory {p.parent} does not exist")
    if p.is_dir():
        raise CliError(f"output {path}: is a directory")
    if kind != ".npy":
        try:
            import soundfile  # noqa: F401
        except (ImportError, OSError):
            raise CliError(f"output {path}: writing {kind} needs the soundfile package; install it or write .npy") from None
    return kind


def write_audio(path: str, kind: str, wav, sample_rate: int) -> None:
    """``.wav``/``.flac``: 16-bit PCM, quantized as the service does (``code2wav.audio.to_int16``:
    soundfile's own float conversion rounds differently); ``.npy``: the samples unquantized
    (bfloat16 as float32, exact)."""
    import torch

    try:
        if kind == ".npy":
            np.save(path, (wav.float() if wav.dtype == torch.bfloat16 else wav).detach().cpu().numpy())
        else:
            import soundfile as sf

            from code2wav.audio import to_int16

            sf.write(path, to_int16(wav), sample_rate, subtype="PCM_16", format=kind[1:].upper())
    except (OSError, RuntimeError) as e:  # soundfile raises LibsndfileError (a RuntimeError)
        raise CliError(f"output {path}: cannot write ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
