"""``bench/ttfp_parts.py``: every first chunk pushed inside a timed window is seen at each of its
six points (pushed, taken by the worker, grouped, launched, handed over, landed), so its legs add up to
the bench's own first packet; warm-ups are left out; a stream whose prefix was found in the
cache is counted as such; the loop's lateness, the threads' CPU shares and the collector's passes
are there per phase. Run over ``bench/service_host.py``'s simulated device (no decoder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LEGS = ("push->taken", "taken->grouped", "grouped->launched", "launched->handed", "handed->landed")


@pytest.mark.parametrize(("restores", "switch"), [("--free-restores", []), ("--in-step", ["--switch-interval", "0.5"])])
def test_each_phase_times_every_leg_of_its_first_chunks(restores, switch):
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ttfp_parts.py"), *switch, "--", "host", "--levels", "4", "--seconds", "0.5", "--step-ms", "1,0.1",
         "--chunks", "1,4", "--prefix", "0,20", "--voices", "2", "--prefix-cache-bytes", "100000000", restores],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    phases = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [p["prefix"] for p in phases] == [0, 20]  # the timed phases only, in order
    none, cached = phases
    assert none["cached_pct"] == 0 and cached["cached_pct"] == 100  # every voice was warmed into the cache
    for p in phases:
        assert p["first_chunks"] > 0 and p["first_rows_per_group"] >= 1
        assert all(p[leg]["mean_ms"] >= 0 for leg in LEGS)
        assert p["steps_1_frame"]["n"] > 0 and p["steps_all"]["n"] >= p["steps_1_frame"]["n"]  # the first chunks' steps among all
        # the legs are consecutive points of one chunk: their means add up to the first packet's
        assert abs(sum(p[leg]["mean_ms"] for leg in LEGS) - p["ttfp"]["mean_ms"]) < 0.01
        # the loop's lateness and both threads' CPU shares over the window; the collector's passes in it
        loop = p["loop"]
        assert loop["lag_p99_ms"] >= loop["lag_p50_ms"] >= 0 and 0 < loop["loop_cpu_pct"] <= 100 and 0 < loop["worker_cpu_pct"] <= 100
        assert loop["switch_interval_ms"] == pytest.approx(0.5 if switch else 5.0)  # the GIL's switch interval the run had
        assert all(p[f"gc{g}"]["n"] >= 0 and p[f"gc{g}"]["total_ms"] >= p[f"gc{g}"]["max_ms"] >= 0 for g in (0, 1, 2))
