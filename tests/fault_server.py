"""``code2wav serve`` with a fault injected, for ``tests/test_service_faults.py`` only: the app is
built by ``code2wav serve``'s own code path (``cli.build_serve_engine`` then ``cli.run_serve``),
with one step hook added to its engine. Nothing in the package can reach it.

    python -m tests.fault_server FAULT serve [serve options]

FAULT is one of:
  die_after_steps=N   the engine's worker dies at its N-th step (a BaseException out of the step,
                      which no per-decode handler takes for a device error)
  slow_steps=SECONDS  every step lasts at least SECONDS (a decode long enough to outlast a drain)
"""

from __future__ import annotations

import sys
import time

from code2wav import cli


class InjectedFault(BaseException):
    """What the injected step raises: a BaseException, as nothing decoding rows may catch it."""


def inject(engine, fault: str) -> None:
    name, _, value = fault.partition("=")
    if name == "die_after_steps":
        steps, limit = [0], int(value)

        def die(seconds: float, rows: int, frames: int) -> None:
            steps[0] += 1
            if steps[0] >= limit:
                raise InjectedFault(f"injected worker failure at step {steps[0]}")

        engine.on_step.append(die)
    elif name == "slow_steps":
        delay = float(value)
        engine.on_step.append(lambda seconds, rows, frames: time.sleep(delay))
    else:
        raise SystemExit(f"unknown fault {fault!r}")


def main(argv: list[str]) -> int:
    fault, rest = argv[0], argv[1:]
    args = cli.build_parser().parse_args(rest)
    engine = cli.build_serve_engine(args)
    inject(engine, fault)
    return cli.run_serve(args, engine)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
