"""``bench/server_profile.py``, the summary of a py-spy raw profile recorded with ``--threads``:
samples per thread, functions ranked by self samples (the stack's leaf) overall and within each
busy thread, by inclusive samples (once per stack, so recursion does not count twice), and by
package; line numbers of one function merge; the last line is the same summary as JSON."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "server_profile.py"
_spec = importlib.util.spec_from_file_location("server_profile", SCRIPT)
server_profile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(server_profile)

LOOP = "thread (101): MainThread;run (asyncio/runners.py:118);_run_once (asyncio/base_events.py:{line})"
STEP = "thread (202): code2wav-step;_work (code2wav/engine/async_engine.py:270)"
RAW = f"""\
{LOOP.format(line=1922)};send (websockets/legacy/protocol.py:635) 30
{LOOP.format(line=1930)};select (selectors.py:468) 10
{STEP};to_int16 (code2wav/server/audio.py:12) 50
{STEP};_work (code2wav/engine/async_engine.py:281) 8
thread (303): ThreadPoolExecutor-0_0;_worker (concurrent/futures/thread.py:83) 2
"""


def summary(keep_lines: bool = False, **kw) -> dict:
    return server_profile.summarize(server_profile.parse(RAW.splitlines(), keep_lines), **kw)


def test_samples_per_thread_by_name_and_id_most_first():
    s = summary()
    assert s["samples"] == 100
    assert list(s["threads"].items()) == [("code2wav-step [202]", 58), ("MainThread [101]", 40), ("ThreadPoolExecutor-0_0 [303]", 2)]


def test_self_samples_rank_the_leaves_and_busy_threads_get_their_own_table():
    s = summary(min_share=0.05)
    assert s["self"] == [
        ("to_int16 (code2wav/server/audio.py)", 50),
        ("send (websockets/legacy/protocol.py)", 30),
        ("select (selectors.py)", 10),
        ("_work (code2wav/engine/async_engine.py)", 8),
        ("_worker (concurrent/futures/thread.py)", 2),
    ]
    assert list(s["self_by_thread"]) == ["code2wav-step [202]", "MainThread [101]"]  # 2 % is under the 5 % bar
    assert s["self_by_thread"]["MainThread [101]"] == [("send (websockets/legacy/protocol.py)", 30), ("select (selectors.py)", 10)]


def test_inclusive_counts_a_function_once_per_stack_and_merges_its_lines():
    inclusive = dict(summary()["inclusive"])
    assert inclusive["_work (code2wav/engine/async_engine.py)"] == 58  # recursive in 8 samples: still 58, not 66
    assert inclusive["_run_once (asyncio/base_events.py)"] == 40  # lines 1922 and 1930: one function
    assert dict(summary(keep_lines=True)["inclusive"])["_run_once (asyncio/base_events.py:1922)"] == 30  # --lines keeps them apart


def test_packages_are_the_files_first_two_directories():
    assert summary()["packages"][:3] == [("code2wav/server", 50), ("websockets/legacy", 30), ("selectors", 10)]


def test_the_command_prints_the_tables_then_the_summary_as_json_with_each_threads_share_of_the_wall(tmp_path):
    raw = tmp_path / "prof.txt"
    raw.write_text(RAW)
    out = subprocess.run([sys.executable, str(SCRIPT), str(raw), "--rate", "10", "--duration", "10"], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == "100 samples, 3 threads"
    assert "      58   58.0%  code2wav-step [202]  (58% of the wall)" in lines
    last = json.loads(lines[-1])
    assert last["of_wall"] == {"code2wav-step [202]": 0.58, "MainThread [101]": 0.4, "ThreadPoolExecutor-0_0 [303]": 0.02}
    assert last["self"][0] == ["to_int16 (code2wav/server/audio.py)", 50]
