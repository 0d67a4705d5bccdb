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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from code2wav import __version__
from code2wav.files import check_output, read_npy, valid_frames, write_audio
from code2wav.options import (
    DTYPES,
    CliError,
    add_env_option,
    add_low_rate_dtype,
    add_set,
    add_threads,
    apply_threads,
    chunk_schedule,
    engine_config,
    parse_chunks,
    parse_device,
    resolve_env_defaults,
)

if TYPE_CHECKING:
    from code2wav.engine.async_engine import AsyncEngine

PROG = "code2wav"
EXIT_BAD_INPUT = 2
DECODE_MODES = ("exact", "official", "windowed", "full")
DEFAULT_STREAM_CHUNKS = (25,)
PROGRESS_MIN_FRAMES = 250  # 20 s of audio: shorter inputs get no progress bar


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of usage + message
        raise CliError(f"{message} (see '{self.prog} --help')")

    def parse_known_args(self, args=None, namespace=None):  # defaults from the environment, once parsed (options.EnvDefault)
        ns, rest = super().parse_known_args(args, namespace)
        return resolve_env_defaults(ns), rest


# -- shared helpers ----------------------------------------------------------------------------------


def progress_bar(total: int, desc: str):
    from tqdm import tqdm

    disable = total < PROGRESS_MIN_FRAMES or not sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit="frame", file=sys.stderr, disable=disable, leave=False)


# -- decode ------------------------------------------------------------------------------------------


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
    add_threads(p)
    p.set_defaults(func=_run_decode)


def _run_decode(args: argparse.Namespace) -> int:
    import torch

    from code2wav.model.loading import load_decoder, low_rate_arg, read_config, resolve_checkpoint

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
    model = load_decoder(ckpt, device=device, dtype=dtype, low_rate_dtype=low_rate_arg(args.low_rate_dtype))
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
    """Feed ``codes`` through one stream of an engine; returns the concatenated pushed audio."""
    import torch

    from code2wav.engine.build import EngineConfig, build_engine

    cfg = EngineConfig(mode=mode, max_streams=1, max_prefix_frames=max(4096, 0 if prefix is None else prefix.shape[0]), graphs=False)
    engine = build_engine(cfg, model=model)
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
    # Every limit and address also reads a CODE2WAV_* variable (a container's settings); a flag wins.
    add_env_option(p, "--host", "CODE2WAV_HOST", "127.0.0.1", str, "address to bind")
    add_env_option(p, "--port", "CODE2WAV_PORT", 8091, int, "port")
    add_env_option(p, "--max-streams", "CODE2WAV_MAX_STREAMS", 64, int, "concurrent streams (state-pool slots)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="compute dtype (default float32)")
    add_low_rate_dtype(p)
    p.add_argument("--api-key", default=os.environ.get("CODE2WAV_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on every path but /health, the OpenAPI pages included "
                        "(default: $CODE2WAV_API_KEY)")
    add_env_option(p, "--idle-timeout", "CODE2WAV_IDLE_TIMEOUT", 30.0, float,
                   "close a WebSocket whose client has sent nothing this many seconds since its last message or the last audio sent, "
                   "with no chunk in flight (0: never)")
    add_env_option(p, "--max-message-bytes", "CODE2WAV_MAX_MESSAGE_BYTES", 1 << 20, int, "largest WebSocket message in bytes")
    add_env_option(p, "--max-stream-frames", "CODE2WAV_MAX_STREAM_FRAMES", 45_000, int, "most frames one stream or request may decode (45000: 1 hour)")
    add_env_option(p, "--max-body-bytes", "CODE2WAV_MAX_BODY_BYTES", 16 << 20, int, "largest POST /v1/decode body in bytes")
    p.add_argument("--max-connections", type=int, default=1024,
                   help="open connections (HTTP and WebSocket) and requests in progress; past it new HTTP requests get 503 "
                        "(default 1024; keep it above --max-streams and under the open-file limit, ulimit -n)")
    p.add_argument("--read-timeout", type=float, default=30.0,
                   help="seconds for a whole HTTP request (headers and body) to arrive, else 408 and the connection closed "
                        "(default 30; 0: never)")
    p.add_argument("--send-timeout", type=float, default=20.0,
                   help="drop a connection whose client has read nothing for this many seconds while the server has audio "
                        "waiting for it, freeing its stream's slot (default 20; 0: never)")
    p.add_argument("--keep-alive-timeout", type=float, default=5.0, help="close an idle HTTP keep-alive connection after this many seconds (default 5)")
    p.add_argument("--shutdown-timeout", type=float, default=5.0,
                   help="on SIGTERM, requests in flight may finish for this many seconds, then they are ended; new ones get "
                        "503 shutdown meanwhile (default 5)")
    p.add_argument("--max-http-requests", type=int, default=64,
                   help="POST /v1/decode requests in progress at once; more are answered 503 busy (default 64)")
    p.add_argument("--no-graphs", action="store_true", help="on CUDA, run steps eagerly instead of replaying CUDA graphs")
    p.add_argument("--first-chunk-wait-ms", type=float, default=None,
                   help="under load, a stream's first chunk may wait this long for other first chunks to share its step; "
                        "only while the device is saturated (default: SchedulePolicy.first_chunk_wait; 0: at once)")
    add_set(p)
    add_threads(p)
    p.add_argument("--loop", default="auto", choices=("auto", "asyncio", "uvloop"),
                   help="event loop: auto is uvloop where it is installed (the serve extra installs it), else asyncio's own")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    return run_serve(args, build_serve_engine(args))


def build_serve_engine(args: argparse.Namespace) -> AsyncEngine:
    """``serve``'s options checked and its engine built (an ``AsyncEngine``, not started)."""
    try:  # lazily: the GPU benchmark machine has no web stack
        import uvicorn  # noqa: F401

        import code2wav.server.run  # noqa: F401
    except ImportError as e:
        raise CliError(f"serve needs the web stack ({e.name or e} is missing): pip install 'code2wav[serve]'") from None
    from code2wav.engine.build import build_async_engine

    for name in ("max_streams", "port", "max_message_bytes", "max_stream_frames", "max_body_bytes", "max_http_requests", "max_connections",
                 "keep_alive_timeout"):
        if getattr(args, name) <= 0:
            raise CliError(f"--{name.replace('_', '-')} must be positive")
    for name in ("idle_timeout", "read_timeout", "send_timeout"):
        if getattr(args, name) < 0:
            raise CliError(f"--{name.replace('_', '-')} must be >= 0")
    if not args.shutdown_timeout >= 0:
        raise CliError("--shutdown-timeout must be >= 0")
    if args.first_chunk_wait_ms is not None and args.first_chunk_wait_ms < 0:
        raise CliError("--first-chunk-wait-ms must be >= 0")
    from code2wav.server.run import pick_loop

    try:
        pick_loop(args.loop)
    except ValueError as e:
        raise CliError(str(e)) from None
    device = parse_device(args.device)
    settings = ([] if args.first_chunk_wait_ms is None else [f"schedule.first_chunk_wait={args.first_chunk_wait_ms / 1e3}"])
    cfg = engine_config(args, device, settings + (["graphs=false"] if args.no_graphs else []))
    t0 = time.perf_counter()
    engine = build_async_engine(cfg)
    if engine.warmup is not None:
        print(f"{PROG}: serving at once; {len(engine.warmup.shapes)} graphs are captured while it serves (/health: graphs)",
              file=sys.stderr, flush=True)
    elif cfg.use_graphs():
        g = engine.engine.runner.stats()  # type: ignore[attr-defined]
        print(f"{PROG}: captured {g['graphs']} step graphs and {g['prefill_graphs']} prefill graphs in "
              f"{time.perf_counter() - t0:.0f} s (up to {cfg.batch_frames()} padded frames per step; "
              f"graph pool {g['pool_bytes'] / 2**20:.0f} MiB)", file=sys.stderr, flush=True)
    return engine


def run_serve(args: argparse.Namespace, engine: AsyncEngine) -> int:
    """Serve ``engine`` (from :func:`build_serve_engine`) with ``serve``'s options until SIGTERM
    (exit 0 after the drain) or an engine failure (exit ``EXIT_ENGINE_FAILED``)."""
    from code2wav.server.app import Limits, create_app
    from code2wav.server.connections import uvicorn_settings
    from code2wav.server.run import http_parser, pick_loop, serve

    model = engine.engine.model
    limits = Limits(
        max_message_bytes=args.max_message_bytes,
        max_stream_frames=args.max_stream_frames,
        max_body_bytes=args.max_body_bytes,
        max_http_requests=args.max_http_requests,
        idle_timeout=args.idle_timeout or None,
        read_timeout=args.read_timeout or None,
        send_timeout=args.send_timeout or None,
        keep_alive_timeout=args.keep_alive_timeout,
        max_connections=args.max_connections,
    )
    app = create_app(engine, api_key=args.api_key or None, limits=limits)
    print(f"{PROG}: serving on http://{args.host}:{args.port} ({args.max_streams} streams, {args.dtype} on {parse_device(args.device)}, "
          f"low-rate stages {model.precision()['low_rate_dtype']}"
          f"{'' if model.low_rate_peak is None else f' (auto: peak {model.low_rate_peak:.3g} on the probe)'}"
          f"{', auth on' if args.api_key else ''}; {pick_loop(args.loop)} loop, {http_parser()} HTTP parser)", file=sys.stderr, flush=True)
    # The transport drops messages far over the limit itself (close 1009, no JSON error).
    # The bounds on slow, idle and non-reading clients: server/connections.py.
    return serve(app, host=args.host, port=args.port, log_level=args.log_level, shutdown_timeout=args.shutdown_timeout,
                 ws_max_size=4 * args.max_message_bytes + (64 << 10), transport=uvicorn_settings(limits), loop=args.loop)


def _add_loadtest(sub) -> None:
    from code2wav import loadtest

    p = sub.add_parser("loadtest", help="bounded WebSocket load test of a running server", description=loadtest.__doc__)
    loadtest.add_arguments(p)
    p.set_defaults(func=loadtest.main)


# -- entry point -------------------------------------------------------------------------------------

SUBCOMMANDS: list[Callable] = [_add_decode, _add_bench, _add_serve, _add_loadtest]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Exact streaming Code2Wav for Qwen3-TTS 12 Hz codec frames.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
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
    from code2wav.engine.graphs import use_expandable_segments
    from code2wav.model.loading import CheckpointError
    from code2wav.stream.rows import StreamError

    use_expandable_segments()  # before anything touches CUDA
    try:
        args = build_parser().parse_args(argv)
        apply_threads(args)
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
