"""Where a server process's threads spend their time, from a py-spy raw (collapsed stacks) profile.

Record a running process (``--threads`` puts each sample's thread first in its stack; without
``--idle`` py-spy keeps only the samples of threads it finds running), then summarize::

    py-spy record -p PID --threads --rate 200 --duration 6 --format raw --nonblocking -o prof.txt
    python3 bench/server_profile.py prof.txt [--rate 200 --duration 6] [--top 30] [--top-inclusive 20] [--lines]

It prints the samples of each thread, the top functions by self samples (the leaf of a stack)
over all threads and then within each busy thread (at least ``--min-share`` of the samples),
the top by inclusive samples (a function counted once in each stack it appears in), the self
samples by package (the source file's first two directories), then one JSON line of the same.
Percentages are of all samples; within a thread, of that thread's. With ``--rate`` and
``--duration`` (py-spy's own) each thread's samples are also given as a share of the wall time:
without ``--idle``, how much of it the thread was running (or runnable: on a crowded CPU a
thread waiting for a core counts); recorded with ``--gil``, how much of it it held the GIL.
Functions are ``name (file)``; ``--lines`` keeps py-spy's line numbers apart. py-spy shortens a
file to its package path, and a directory without ``__init__.py`` ends a package: a module there
shows as its file name alone.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

THREAD = re.compile(r"thread \((?P<id>[^)]*)\)(?::\s*(?P<name>.*))?$")
LINE_NO = re.compile(r":\d+\)$")


def parse(lines: Iterable[str], keep_lines: bool = False) -> Iterator[tuple[str, list[str], int]]:
    """(thread, frames from the root to the leaf, samples) for each line of a raw profile."""
    for line in lines:
        stack, _, count = line.strip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if frames[0].startswith("process "):  # recorded with --subprocesses
            frames = frames[1:]
        thread = "(no thread ids)"
        if frames and (m := THREAD.match(frames[0])):
            thread, frames = f"{m['name'] or '?'} [{m['id']}]", frames[1:]
        yield thread, frames if keep_lines else [LINE_NO.sub(")", f) for f in frames], int(count)


def package(frame: str) -> str:
    """``websockets/legacy/protocol.py`` -> ``websockets/legacy``; ``threading.py`` -> ``threading``."""
    if not frame.endswith(")") or "(" not in frame[1:]:
        return frame
    path = frame[frame.rfind("(") + 1 : -1].rsplit(":", 1)[0]
    parts = path.split("/")
    return "/".join(parts[:-1][:2]) or parts[-1].removesuffix(".py")


def summarize(
    stacks: Iterable[tuple[str, list[str], int]], top: int = 30, top_inclusive: int = 20, min_share: float = 0.05, wall_samples: float | None = None
) -> dict:
    """The tables, as lists of (function, samples), most first; ``of_wall`` (each thread's samples
    over ``wall_samples``, py-spy's rate x duration) where that is given."""
    threads: Counter[str] = Counter()
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    per_thread: dict[str, Counter[str]] = {}
    for thread, frames, n in stacks:
        leaf = frames[-1] if frames else "(no frames)"
        threads[thread] += n
        own[leaf] += n
        packages[package(leaf)] += n
        per_thread.setdefault(thread, Counter())[leaf] += n
        for f in set(frames):  # once per stack: recursion does not count twice
            inclusive[f] += n
    total = sum(threads.values())
    busy = [t for t, n in threads.most_common() if n >= min_share * total]
    out = {
        "samples": total,
        "threads": dict(threads.most_common()),
        "self": own.most_common(top),
        "self_by_thread": {t: per_thread[t].most_common(top) for t in busy},
        "inclusive": inclusive.most_common(top_inclusive),
        "packages": packages.most_common(top),
    }
    if wall_samples:
        out["of_wall"] = {t: round(n / wall_samples, 4) for t, n in threads.items()}
    return out


def report(s: dict) -> str:
    """The tables as text, then ``s`` as one JSON line."""
    total, of_wall = max(1, s["samples"]), s.get("of_wall", {})
    table = lambda rows, of: "\n".join(f"{n:>8} {100 * n / max(1, of):>6.1f}%  {name}" for name, n in rows)
    out = [f"{s['samples']} samples, {len(s['threads'])} threads", "--- samples per thread"]
    out += [f"{n:>8} {100 * n / total:>6.1f}%  {t}" + (f"  ({100 * of_wall[t]:.0f}% of the wall)" if t in of_wall else "") for t, n in s["threads"].items()]
    out += ["--- top functions by self samples, all threads", table(s["self"], total)]
    for t, rows in s["self_by_thread"].items():
        out += [f"--- top functions by self samples in {t} (% of its {s['threads'][t]})", table(rows, s["threads"][t])]
    out += ["--- top functions by inclusive samples, all threads", table(s["inclusive"], total)]
    out += ["--- self samples by package", table(s["packages"], total)]
    return "\n".join(out) + "\n" + json.dumps(s)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("raw", type=Path, help="py-spy record --format raw output, recorded with --threads")
    p.add_argument("--top", type=int, default=30, help="rows of each self-samples table")
    p.add_argument("--top-inclusive", type=int, default=20, help="rows of the inclusive table")
    p.add_argument("--min-share", type=float, default=0.05, help="a thread gets its own table from this share of the samples")
    p.add_argument("--rate", type=float, default=None, help="py-spy's --rate, for each thread's share of the wall")
    p.add_argument("--duration", type=float, default=None, help="py-spy's --duration, in s")
    p.add_argument("--lines", action="store_true", help="keep line numbers: one row per line, not per function")
    a = p.parse_args(argv)
    with a.raw.open() as f:
        s = summarize(parse(f, a.lines), a.top, a.top_inclusive, a.min_share, a.rate * a.duration if a.rate and a.duration else None)
    print(report(s))
    return 0 if s["samples"] else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
