#!/usr/bin/env bash
# Session 13, GPU call 3 (repo root on the device, .whl carried): A/B of the interpreter's switch
# interval in the server process (sys.setswitchinterval; CPython's default 5 ms), one machine:
# the same loads against a server with 0.5 ms, then with the default; py-spy (with --gil) under
# 4 x 64 kept streams in the first.
source bench/device_env.sh
log="$OUT/log.txt"
mkdir -p /tmp/sw && printf 'import os, sys\nif os.environ.get("SWITCH_MS"):\n    sys.setswitchinterval(float(os.environ["SWITCH_MS"]) / 1e3)\n' >/tmp/sw/sitecustomize.py
spy=$(command -v py-spy || echo /tmp/site/bin/py-spy)
for sw in 0.5 ""; do
  loads='for spec in "4 16 --reuse-connections" "4 64 --reuse-connections" "4 64"; do
    set -- $spec; echo "=== switch ${SWITCH_MS:-default} ms, service: $1 procs x $2 streams ${3:-}";
    timeout 40 python3 bench/service_load.py http://127.0.0.1:8091 $1 $2 8 ${3:-} | tee -a '"$OUT"'/service_load.jsonl | python3 -c "import json, sys; d = json.loads(sys.stdin.readline()); d.pop(\"runs\"); print(json.dumps(d))"; done'
  [ -n "$sw" ] && loads="$loads"'
    pid=$(pgrep -f "^[^ ]*python3 -m code2wav serve" | head -1); echo "=== py-spy --gil, 4 x 64 kept streams, server $pid"
    timeout 40 python3 bench/service_load.py http://127.0.0.1:8091 4 64 10 --reuse-connections >/dev/null & sleep 5
    timeout 30 '"$spy"' record --threads --gil --rate 200 --duration 6 --format raw --nonblocking -p $pid -o '"$OUT"'/prof_gil.txt 2>&1 | tail -2; wait
    python3 bench/server_profile.py '"$OUT"'/prof_gil.txt --rate 200 --duration 6 --top 40 | grep -v "^{" | head -70'
  echo "=== server with switch interval ${sw:-default} ms (graphs captured before serving)" | tee -a "$log"
  SWITCH_MS=$sw PYTHONPATH="/tmp/sw:$PYTHONPATH" timeout 300 python3 bench/cold_start.py serve --then "$loads" --device cuda --dtype bfloat16 --max-streams 256 --set graph_capture=blocking 2>&1 | tee -a "$log" | grep -v '^{"' | head -90
done
