"""The service at full load: several ``code2wav loadtest`` client processes at once, so that no
one client's event loop is the limit, their figures summed.

``python3 bench/service_load.py URL PROCS STREAMS_PER_PROC SECONDS [loadtest options ...]``
prints one JSON line: the streams, the summed throughput (audio s per wall s), the client-side
first packet (the processes' p50s averaged by streams served, the worst p99), errors by code, the
server's steps over the first process's run (``LoadResult.server_rates``), and each process's summary.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path


def main(argv: list[str]) -> int:
    url, procs, per, seconds, *extra = argv
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"{i}.json" for i in range(int(procs))]
        running = [subprocess.Popen([sys.executable, "-m", "code2wav", "loadtest", "--server", url, "--streams", per, "--seconds", seconds,
                                     "--json", str(o), *extra], stdout=subprocess.DEVNULL) for o in outs]
        codes = [p.wait() for p in running]
        runs = [json.loads(o.read_text()) for o in outs if o.exists()]
    errors: dict[str, int] = {}
    for r in runs:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    weights = [r["streams_served"] for r in runs]
    mean = lambda key: sum(r[key] * w for r, w in zip(runs, weights)) / max(1, sum(weights))  # noqa: E731
    print(json.dumps({"streams": int(procs) * int(per), "procs": int(procs), "exit": codes,
                      "throughput_x": sum(r["throughput_x"] for r in runs), "ttfp_p50_ms": mean("ttfp_p50_ms"),
                      "ttfp_p99_ms": max((r["ttfp_p99_ms"] for r in runs), default=None), "streams_served": sum(weights), "errors": errors,
                      "server": runs[0].get("server", {}) if runs else {},  # the whole server's, over the first client's run
                      "runs": runs}))
    return 0 if runs and all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
