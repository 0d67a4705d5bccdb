"""The ``code2wav`` command line.

Every subcommand is one ``_add_<name>(subparsers)`` function that adds its parser and sets
``func`` (``func(args) -> int``); list it in ``SUBCOMMANDS``. A subcommand reports bad input by
raising ``CliError`` (or ``CodesError``/``CheckpointError``/``StreamError``): ``main`` prints one
line on stderr and returns 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

PROG = "code2wav"
EXIT_BAD_INPUT = 2
OUTPUT_KINDS = (".wav", ".flac", ".npy")
DTYPES = ("float32", "float64", "bfloat16", "float16")
DECODE_MODES = ("exact", "official", "windowed", "full")
DEFAULT_STREAM_CHUNKS = (25,)
PROGRESS_MIN_FRAMES = 250  # 20 s of audio: shorter inputs get no progress bar


class CliError(Exception):
    """Bad input or environment, reported as one line on stderr with exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of usage + message
        raise CliError(f"{message} (see '{self.prog} --help')")


# -- shared helpers (for every subcommand) -----------------------------------------------------------


def parse_chunks(text: str) -> list[int]:
    """``"1,4,8,25"`` -> ``[1, 4, 8, 25]``; every size a positive integer."""
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or any(n <= 0 for n in sizes):
        raise CliError(f"bad --chunks {text!r}: expected comma-separated positive integers, e.g. 1,4,8,25")
    return sizes


def chunk_schedule(total: int, sizes: Sequence[int]) -> list[int]:
    """Chunk sizes covering ``total`` frames: ``sizes`` in order, the last repeating, the final one cut."""
    out, done = [], 0
    while done < total:
        n = min(sizes[min(len(out), len(sizes) - 1)], total - done)
        out.append(n)
        done += n
    return out


def parse_device(text: str):
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise CliError(f"bad --device {text!r}: expected cpu or cuda[:N]") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise CliError(f"--device {text}: CUDA is not available here (torch {torch.__version__}); use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise CliError(f"--device {text}: only {torch.cuda.device_count()} CUDA device(s) here")
    elif dev.type != "cpu":
        raise CliError(f"bad --device {text!r}: expected cpu or cuda[:N]")
    return dev


def valid_frames(arr: np.ndarray, path: str, num_quantizers: int, codebook_size: int, what: str = "codes") -> np.ndarray:
    """Check an integer ``[F, Q]`` array read from ``path``; return its frames, trailing ``-1`` padding dropped.

    Range, shape and padding rules are ``code2wav.codes``'; this adds the CLI's stricter padding
    marker (exactly ``-1`` in codebook 0) and names the file in the message."""
    from code2wav.codes import CodesError, padded_batch

    if arr.dtype.kind not in "iu":
        raise CliError(f"{what} {path}: codes must be integers, got {arr.dtype}")
    if arr.ndim != 2 or arr.shape[1] != num_quantizers:
        raise CliError(f"{what} {path}: expected shape [frames, {num_quantizers}], got {list(arr.shape)}")
    arr = arr.astype(np.int64)
    bad = arr[:, 0][(arr[:, 0] < 0) & (arr[:, 0] != -1)]
    if bad.size:
        raise CliError(f"{what} {path}: code {int(bad[0])} outside [0, {codebook_size})")
    try:
        _, lens = padded_batch(arr, num_quantizers, codebook_size)
    except CodesError as e:
        raise CliError(f"{what} {path}: {e}") from None
    return np.ascontiguousarray(arr[: int(lens[0])])


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
    """``.wav``/``.flac``: 16-bit PCM; ``.npy``: the samples unquantized (bfloat16 as float32, exact)."""
    import torch

    if wav.dtype == torch.bfloat16:
        wav = wav.float()
    data = wav.detach().cpu().numpy()
    try:
        if kind == ".npy":
            np.save(path, data)
        else:
            import soundfile as sf

            if data.dtype == np.float16:  # soundfile takes float32/64 (exact for float16 values)
                data = data.astype(np.float32)
            sf.write(path, data, sample_rate, subtype="PCM_16", format=kind[1:].upper())
    except (OSError, RuntimeError) as e:  # soundfile raises LibsndfileError (a RuntimeError)
        raise CliError(f"output {path}: cannot write ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def progress_bar(total: int, desc: str):
    from tqdm import tqdm

    disable = total < PROGRESS_MIN_FRAMES or not sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit="frame", file=sys.stderr, disable=disable, leave=False)


# -- decode ------------------------------------------------------------------------------------------


def add_low_rate_dtype(p: argparse.ArgumentParser) -> None:
    p.add_argument("--low-rate-dtype", choices=DTYPES, default=None,
                   help="dtype of the stages before the conv stack (dequantizer, transformer, upsampling; 3.6 %% of the "
                        "FLOPs); default: float32 under a half --dtype (TF32 on CUDA; on an H200, bf16 31.5 instead of 26.8 dB "
                        "from float64; 6 %% less throughput at 256 streams before attention ran in bf16, not "
                        "re-measured since), else --dtype")


def low_rate_dtype(args: argparse.Namespace) -> "torch.dtype | None":
    import torch

    return getattr(torch, args.low_rate_dtype) if args.low_rate_dtype else None


def _add_decode(sub) -> None:
    p = sub.add_parser(
        "decode",
        help="decode a codes .npy to audio",
        description=(
            "Decode Qwen3-TTS 12 Hz codec frames (an integer .npy [frames, 16]; trailing frames whose "
            "codebook-0 code is -1 are padding) to 24 kHz audio, 1920 samples per frame. Without --chunks "
            "or --prefix the whole sequence is decoded offline; with them it is fed through the streaming "
            "engine chunk by chunk."
        ),
    )
    p.add_argument("codes", metavar="CODES.npy", help="integer .npy of shape [frames, 16]")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="output file: .wav / .flac (16-bit PCM) or .npy (raw samples)")
    p.add_argument("--model", metavar="PATH", default=None, help="tokenizer dir, full Qwen3-TTS model dir, or hub id (default: embedded random weights)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="compute dtype (default float32)")
    add_low_rate_dtype(p)
    p.add_argument(
        "--mode",
        choices=DECODE_MODES,
        default="exact",
        help="exact (default; equals the whole-utterance forward), official (qwen-tts 300/25 chunked decode, offline only), "
        "windowed or full (streaming baselines)",
    )
    p.add_argument("--chunks", metavar="N[,N...]", default=None, help="stream in these chunk sizes, the last repeating (e.g. 1,4,8,25)")
    p.add_argument("--prefix", metavar="REF.npy", default=None, help="reference (voice-clone) codes opening the stream; their audio is not output")
    p.set_defaults(func=_run_decode)


def _run_decode(args: argparse.Namespace) -> int:
    import torch

    from code2wav.model.loading import load_decoder, read_config, resolve_checkpoint

    # Everything that can be checked without the model, first.
    kind = check_output(args.output)
    chunks = parse_chunks(args.chunks) if args.chunks is not None else None
    streaming = chunks is not None or args.prefix is not None or args.mode in ("windowed", "full")
    sizes = chunks or list(DEFAULT_STREAM_CHUNKS)
    if streaming and args.mode == "official":
        raise CliError("--mode official is an offline decode; it cannot be combined with --chunks or --prefix")
    device = parse_device(args.device)
    dtype = getattr(torch, args.dtype)
    raw_codes = read_npy(args.codes, "codes")  # file errors surface before any weights load
    raw_prefix = read_npy(args.prefix, "prefix") if args.prefix is not None else None

    t0 = time.perf_counter()
    ckpt = resolve_checkpoint(args.model)
    cfg = read_config(ckpt)
    codes = valid_frames(raw_codes, args.codes, cfg.num_quantizers, cfg.codebook_size, "codes")
    if codes.shape[0] == 0:
        raise CliError(f"codes {args.codes}: no frames (after dropping -1 padding)")
    prefix = None if raw_prefix is None else valid_frames(raw_prefix, args.prefix, cfg.num_quantizers, cfg.codebook_size, "prefix")
    model = load_decoder(ckpt, device=device, dtype=dtype, low_rate_dtype=low_rate_dtype(args))
    t_load = time.perf_counter() - t0

    frames = codes.shape[0]
    t1 = time.perf_counter()
    with progress_bar(frames, "decode") as bar:
        if streaming:
            wav = _stream(model, codes, prefix, args.mode, sizes, bar.update)
        else:
            from code2wav.offline import decode

            wav = decode(model, torch.from_numpy(codes), mode=args.mode, progress=bar.update)[0]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t_decode = time.perf_counter() - t1

    expected = frames * cfg.samples_per_frame
    if wav.numel() != expected:  # a decoder bug, not bad input: fail loudly
        raise RuntimeError(f"decoded {wav.numel()} samples for {frames} frames, expected {expected}")
    write_audio(args.output, kind, wav, cfg.sample_rate)

    seconds = expected / cfg.sample_rate
    how = f"streaming {args.mode}, chunks {','.join(map(str, sizes))}" if streaming else f"offline {args.mode}"
    if prefix is not None:
        how += f", prefix {prefix.shape[0]} frames"
    print(
        f"{PROG}: {frames} frames -> {seconds:.2f} s of audio in {t_decode:.2f} s "
        f"(RTF {t_decode / seconds:.3f}, {seconds / max(t_decode, 1e-9):.1f}x real time; model load {t_load:.2f} s); "
        f"{how}, {args.dtype} on {device}; wrote {args.output}"
    )
    return 0


def _stream(model, codes: np.ndarray, prefix: np.ndarray | None, mode: str, sizes: list[int], progress: Callable[[int], None]):
    """Feed ``codes`` through one ``StreamEngine`` stream; returns the concatenated pushed audio."""
    import torch

    from code2wav.stream.engine import StreamEngine

    engine = StreamEngine(model, max_streams=1, mode=mode, max_prefix_frames=max(4096, 0 if prefix is None else prefix.shape[0]))
    rid = "cli"
    engine.open(rid, prefix)
    pieces, done = [], 0
    try:
        for n in chunk_schedule(codes.shape[0], sizes):
            pieces.append(engine.push(rid, codes[done : done + n]))
            done += n
            progress(n)
        pieces.append(engine.finish(rid))
    except BaseException:
        if engine.active:
            engine.abort(rid)
        raise
    return torch.cat(pieces)


# -- bench -------------------------------------------------------------------------------------------


def _add_bench(sub) -> None:
    from code2wav import bench

    p = sub.add_parser("bench", help="streaming benchmark: exact (graphs/eager) vs windowed vs full", description=bench.__doc__)
    bench.add_arguments(p)
    p.set_defaults(func=bench.main)


# -- serve -------------------------------------------------------------------------------------------


def _add_serve(sub) -> None:
    import os

    p = sub.add_parser(
        "serve",
        help="run the HTTP + WebSocket service",
        description=(
            "Serve POST /v1/decode, WebSocket /v1/stream, GET /health and GET /metrics (see docs/protocol.md). "
            "Needs the serve extra: pip install 'code2wav[serve]'."
        ),
    )
    p.add_argument("--model", metavar="PATH", default=None, help="tokenizer dir, full Qwen3-TTS model dir, or hub id (default: embedded random weights)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8091, help="port (default 8091)")
    p.add_argument("--max-streams", type=int, default=64, help="concurrent streams (state-pool slots; default 64)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="compute dtype (default float32)")
    add_low_rate_dtype(p)
    p.add_argument("--api-key", default=os.environ.get("CODE2WAV_API_KEY"), help="require 'Authorization: Bearer KEY' on every endpoint but /health (default: $CODE2WAV_API_KEY)")
    p.add_argument("--idle-timeout", type=float, default=30.0, help="close a WebSocket stream idle this many seconds (default 30; 0: never)")
    p.add_argument("--max-message-bytes", type=int, default=1 << 20, help="largest WebSocket message (default 1 MiB)")
    p.add_argument("--max-stream-frames", type=int, default=45_000, help="most frames one stream or request may decode (default 45000 = 1 hour)")
    p.add_argument("--max-body-bytes", type=int, default=16 << 20, help="largest POST /v1/decode body (default 16 MiB)")
    p.add_argument("--no-graphs", action="store_true", help="on CUDA, run steps eagerly instead of replaying CUDA graphs")
    p.add_argument("--first-chunk-wait-ms", type=float, default=None,
                   help="under load, a stream's first chunk may wait this long for other first chunks to share its forward; "
                        "only while the device is saturated (default: the engine's, code2wav.stream.engine.FIRST_CHUNK_WAIT_S; 0: at once)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    try:  # lazily: the GPU benchmark machine has no web stack
        import uvicorn

        from code2wav.server.app import Limits, create_app
    except ImportError as e:
        raise CliError(f"serve needs the web stack ({e.name or e} is missing): pip install 'code2wav[serve]'") from None
    import torch

    from code2wav.engine.async_engine import AsyncEngine
    from code2wav.model.loading import load_decoder
    from code2wav.stream.engine import StreamEngine

    for name in ("max_streams", "port", "max_message_bytes", "max_stream_frames", "max_body_bytes"):
        if getattr(args, name) <= 0:
            raise CliError(f"--{name.replace('_', '-')} must be positive")
    if args.idle_timeout < 0:
        raise CliError("--idle-timeout must be >= 0")
    if args.first_chunk_wait_ms is not None and args.first_chunk_wait_ms < 0:
        raise CliError("--first-chunk-wait-ms must be >= 0")
    device = parse_device(args.device)
    model = load_decoder(args.model, device=device, dtype=getattr(torch, args.dtype), low_rate_dtype=low_rate_dtype(args))
    use_graphs = device.type == "cuda" and not args.no_graphs
    from code2wav.engine.graphs import GraphRunner, default_batch_frames

    core = StreamEngine(model, max_streams=args.max_streams, max_step_frames=32 if use_graphs else 64,
                        max_batch_frames=default_batch_frames() if use_graphs else 1024,
                        **({} if args.first_chunk_wait_ms is None else {"first_chunk_wait": args.first_chunk_wait_ms / 1e3}))
    if use_graphs:
        t0 = time.perf_counter()
        runner = GraphRunner(model, core.pool, max_batch_frames=core.max_batch_frames)
        runner.capture(core.prefill_shapes())
        core.runner = runner
        g = runner.stats()
        print(f"{PROG}: captured {g['graphs']} step graphs and {g['prefill_graphs']} prefill graphs in "
              f"{time.perf_counter() - t0:.0f} s (up to {core.max_batch_frames} padded frames per forward; "
              f"graph pool {g['pool_bytes'] / 2**20:.0f} MiB)", file=sys.stderr, flush=True)
    limits = Limits(
        max_message_bytes=args.max_message_bytes,
        max_stream_frames=args.max_stream_frames,
        max_body_bytes=args.max_body_bytes,
        idle_timeout=args.idle_timeout or None,
    )
    app = create_app(AsyncEngine(core), api_key=args.api_key or None, limits=limits)
    print(f"{PROG}: serving on http://{args.host}:{args.port} ({args.max_streams} streams, {args.dtype} on {device}, "
          f"low-rate stages {str(model.low_rate_dtype).removeprefix('torch.')}"
          f"{', auth on' if args.api_key else ''})", file=sys.stderr, flush=True)
    # The transport drops messages far over the limit itself (close 1009, no JSON error).
    # No permessage-deflate: PCM barely compresses (<2 %) and zlib on the event loop capped the
    # service at ~13 MB/s of audio (~280x real time) however fast the GPU steps were.
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                ws_max_size=4 * args.max_message_bytes + (64 << 10), ws_per_message_deflate=False)
    return 0


def _add_loadtest(sub) -> None:
    from code2wav import loadtest

    p = sub.add_parser("loadtest", help="bounded WebSocket load test of a running server", description=loadtest.__doc__)
    loadtest.add_arguments(p)
    p.set_defaults(func=loadtest.main)


# -- entry point -------------------------------------------------------------------------------------

SUBCOMMANDS: list[Callable] = [_add_decode, _add_bench, _add_serve, _add_loadtest]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Exact streaming Code2Wav for Qwen3-TTS 12 Hz codec frames.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def _one_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    if len(lines) == 1:
        return lines[0]
    # A multi-line CheckpointError: its first line plus each detail line's title and count.
    details = [line.split(":", 1)[0] for line in lines[1:]]
    return f"{lines[0].rstrip(':')}: {'; '.join(details)}"


def main(argv: Sequence[str] | None = None) -> int:
    from code2wav.codes import CodesError
    from code2wav.model.loading import CheckpointError
    from code2wav.stream.engine import StreamError

    from code2wav.engine.graphs import use_expandable_segments

    use_expandable_segments()  # before anything touches CUDA
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_BAD_INPUT)
    except (CliError, CodesError, CheckpointError, StreamError) as e:
        print(f"{PROG}: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
