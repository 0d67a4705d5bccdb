"""Write a sweep's best tiles into this copy's kernel module, so the runs after it in the same
device call use them: ``python3 bench/put_tiles.py MODULE CLASS TILES.json`` replaces the line
``TILES: dict[int, CLASS] = ...`` of MODULE with the JSON's ``{width: [fields...]}`` (what
``bench/unit_conv.py`` and ``bench/convt.py`` write with ``--tiles-out``) and prints it. The
result is for that call only; the sweep's figures go to BENCHMARKS.md and the tiles into the
module by hand."""

from __future__ import annotations

import json
import re
import sys


def main() -> int:
    module, cls, path = sys.argv[1:4]
    tiles = json.load(open(path))
    line = f"TILES: dict[int, {cls}] = {{" + ", ".join(f"{c}: {cls}({', '.join(map(repr, t))})" for c, t in tiles.items()) + "}"
    src = open(module).read()
    new, n = re.subn(rf"^TILES: dict\[int, {cls}\] = .*$", line, src, flags=re.M)
    if n != 1:
        print(f"{module}: no single 'TILES: dict[int, {cls}] = ...' line", file=sys.stderr)
        return 1
    open(module, "w").write(new)
    print(f"this copy's {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
