"""Command-line options shared by the subcommands (decode, serve, bench, loadtest).

A bad value raises :class:`CliError`, which ``code2wav.cli.main`` prints as one line (exit 2).
``--set FIELD=VALUE`` reaches every :class:`EngineConfig` field, sub-configs dotted
(``--set layers.convt_gemm=false``, ``--set schedule.first_chunk_wait=0``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import typing
from collections.abc import Callable, Sequence
from typing import Any

from code2wav.model.config import DTYPES


class CliError(Exception):
    """Bad input or environment, reported as one line on stderr with exit status 2."""


# -- argparse types (their message follows "argument --flag: ") -------------------------------------


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def server_url(text: str) -> str:
    if not text.startswith(("http://", "https://")) or len(text.split("://", 1)[1].strip("/")) == 0:
        raise argparse.ArgumentTypeError(f"expected the server's base URL, e.g. http://127.0.0.1:8091, got {text!r}")
    return text.rstrip("/")


# -- defaults from the environment -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EnvDefault:
    """An option's default taken from environment variable ``var`` when the command runs
    (``fallback`` when it is unset or empty); the flag, when given, wins. ``code2wav.cli``'s
    parser resolves it after parsing (:func:`resolve_env_defaults`), so that a bad value is one
    error line naming the variable, and only for the subcommand that reads it."""

    var: str
    fallback: Any = None
    parse: Callable[[str], Any] = str

    def value(self) -> Any:
        text = os.environ.get(self.var, "")
        if not text:
            return self.fallback
        try:
            return self.parse(text)
        except (ValueError, argparse.ArgumentTypeError) as e:
            raise CliError(f"bad ${self.var} {text!r}: {e}") from None

    def __str__(self) -> str:  # what %(default)s shows in --help
        return f"{self.fallback}, or ${self.var}"


def resolve_env_defaults(args: argparse.Namespace) -> argparse.Namespace:
    for name, value in vars(args).items():
        if isinstance(value, EnvDefault):
            setattr(args, name, value.value())
    return args


def add_env_option(p: argparse.ArgumentParser, flag: str, var: str, fallback: Any, parse: Callable[[str], Any], help: str, **kw: Any) -> None:
    """``flag`` with its default from ``$var`` (else ``fallback``); the help names both."""
    p.add_argument(flag, type=parse, default=EnvDefault(var, fallback, parse), help=f"{help} (default {fallback}; ${var})", **kw)


def add_threads(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=positive_int, default=EnvDefault("CODE2WAV_THREADS", None, positive_int), metavar="N",
                   help="CPU threads for torch's kernels (torch.set_num_threads). On a shared CPU give the cores this process may "
                        "use; by default torch takes one per core on a CPU device, and one in all with --device cuda "
                        "($CODE2WAV_THREADS)")


def apply_threads(args: argparse.Namespace) -> None:
    """``--threads N``: torch's intra-op threads, before any work runs. With a CUDA device and no
    ``--threads``, one: the host's torch work is then small copies and conversions between steps,
    where a team of threads per op costs more than it saves, and its waits on threads that the
    event loop and other processes keep busy stall the step loop."""
    n = getattr(args, "threads", None)
    if n is None and str(getattr(args, "device", "cpu")).startswith("cuda"):
        n = 1
    if n:
        import torch

        torch.set_num_threads(n)


def parse_ints(text: str, what: str, example: str = "1,4,8,25") -> list[int]:
    """``"1,4,8,25"`` -> ``[1, 4, 8, 25]``; every value a positive integer."""
    try:
        values = [int(s) for s in text.split(",")]
    except ValueError:
        values = []
    if not values or any(n <= 0 for n in values):
        raise CliError(f"bad {what} {text!r}: expected comma-separated positive integers, e.g. {example}")
    return values


def parse_floats(text: str, what: str, example: str = "0,5") -> list[float]:
    """``"0,5"`` -> ``[0.0, 5.0]``; every value a finite number >= 0."""
    try:
        values = [float(s) for s in text.split(",")]
    except ValueError:
        values = []
    if not values or any(not math.isfinite(v) or v < 0 for v in values):
        raise CliError(f"bad {what} {text!r}: expected comma-separated numbers >= 0, e.g. {example}")
    return values


def parse_chunks(text: str) -> list[int]:
    """A chunk schedule: ``"1,4,8,25"``, the last size repeating (see :func:`chunk_schedule`)."""
    return parse_ints(text, "--chunks")


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


def add_low_rate_dtype(p: argparse.ArgumentParser) -> None:
    p.add_argument("--low-rate-dtype", choices=(*DTYPES, "auto"), default="auto",
                   help="dtype of the stages before the conv stack (dequantizer, transformer, upsampling: a few %% of the "
                        "FLOPs); auto (default): float16 on CUDA under a half --dtype where the loaded weights' values leave "
                        "float16 room (measured at load), else float32 under a half --dtype (TF32 on CUDA), else --dtype")


def add_set(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="settings",
                   help="set any engine knob (an EngineConfig field; sub-configs dotted: layers.convt_gemm=false, "
                        "schedule.first_chunk_wait=0); repeatable")


def engine_config(args: argparse.Namespace, device: Any, extra: Sequence[str] = ()) -> Any:
    """The ``EngineConfig`` of a subcommand's engine options (--model, --device, --dtype,
    --low-rate-dtype, --max-streams where it has them; ``gc_freeze`` on), then ``extra`` and
    ``--set`` applied."""
    from code2wav.engine.build import EngineConfig

    kw = {name: getattr(args, name) for name in ("model", "dtype", "low_rate_dtype", "max_streams") if getattr(args, name, None) is not None}
    try:
        cfg = EngineConfig(device=str(device), gc_freeze=True, **kw)  # the subcommand owns its process
    except ValueError as e:
        raise CliError(str(e)) from None
    return apply_settings(cfg, [*extra, *getattr(args, "settings", [])])


def apply_settings(cfg: Any, settings: Sequence[str]) -> Any:
    """``cfg`` (a dataclass) with each ``FIELD=VALUE`` applied, values parsed by the field's type
    (bool: true/false/1/0/on/off; none: None where the field allows it)."""
    for item in settings:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise CliError(f"bad --set {item!r}: expected FIELD=VALUE, e.g. layers.convt_gemm=false")
        cfg = _set(cfg, name.strip().split("."), text.strip(), item)
    return cfg


def _set(obj: Any, path: list[str], text: str, item: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(obj)}
    f = fields.get(path[0])
    if f is None:
        raise CliError(f"bad --set {item!r}: {type(obj).__name__} has no field {path[0]!r} (fields: {', '.join(fields)})")
    current = getattr(obj, f.name)
    if len(path) > 1:
        if not dataclasses.is_dataclass(current):
            raise CliError(f"bad --set {item!r}: {path[0]!r} has no sub-fields")
        value = _set(current, path[1:], text, item)
    elif dataclasses.is_dataclass(current):
        raise CliError(f"bad --set {item!r}: {path[0]!r} is a sub-config; expected one of its fields, e.g. {path[0]}.FIELD=VALUE")
    else:
        hint = typing.get_type_hints(type(obj))[f.name]
        value = _parse(hint, text, item)
    try:
        return dataclasses.replace(obj, **{f.name: value})
    except (ValueError, TypeError) as e:
        raise CliError(f"bad --set {item!r}: {e}") from None


def _parse(hint: Any, text: str, item: str) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    optional = type(None) in typing.get_args(hint)
    if optional and text.lower() == "none":
        return None
    if typing.get_origin(hint) is typing.Literal:
        if text not in typing.get_args(hint):
            raise CliError(f"bad --set {item!r}: expected one of {', '.join(map(str, typing.get_args(hint)))}")
        return text
    base = args[0] if args and typing.get_origin(hint) is not typing.Literal else hint
    if base is bool:
        words = {"true": True, "1": True, "on": True, "yes": True, "false": False, "0": False, "off": False, "no": False}
        if text.lower() not in words:
            raise CliError(f"bad --set {item!r}: expected true or false")
        return words[text.lower()]
    if base in (int, float):
        try:
            return base(text)
        except ValueError:
            raise CliError(f"bad --set {item!r}: expected a number") from None
    return text


def parse_prefixes(text: str) -> tuple[int, ...]:
    """``--prefix``: comma-separated reference prefix lengths in frames, each >= 0."""
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 0:
        raise CliError(f"bad --prefix {text!r}: expected comma-separated frame counts >= 0, e.g. 0,72")
    return values
