#!/usr/bin/env bash
# Session 13, GPU call 2 (repo root on the device, .whl carried): the service at full load after
# the engine quantizes 16-bit streams on the device (graphs captured before serving, for the
# steady state), a connection per stream and kept connections, with the server's steps/s, rows
# a step and device busy share from /metrics; py-spy on the server under 4 x 64 kept streams;
# then in-process, the same workload, for the ratio.
source bench/device_env.sh
log="$OUT/log.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
loads='for spec in "1 1" "1 1 --reuse-connections" "4 16" "4 16 --reuse-connections" "4 64" "4 64 --reuse-connections" "8 32 --reuse-connections"; do
  set -- $spec; echo "=== service: $1 procs x $2 streams ${3:-}";
  timeout 40 python3 bench/service_load.py http://127.0.0.1:8091 $1 $2 8 ${3:-} | tee -a '"$OUT"'/service_load.jsonl | python3 -c "import json, sys; d = json.loads(sys.stdin.readline()); d.pop(\"runs\"); print(json.dumps(d))"; done
  echo "=== py-spy, 4 x 64 kept streams"
  timeout 40 python3 bench/service_load.py http://127.0.0.1:8091 4 64 10 --reuse-connections >'"$OUT"'/prof_load.json & sleep 5
  timeout 30 /tmp/site/bin/py-spy record --threads --rate 200 --duration 6 --format raw --nonblocking -p $(pgrep -f "code2wav serve" | head -1) -o '"$OUT"'/prof_kept.txt >/dev/null 2>&1; wait
  python3 bench/server_profile.py '"$OUT"'/prof_kept.txt --rate 200 --duration 6 --top 30 --top-inclusive 30 | grep -v "^{" | head -120'
echo "=== full load (graphs captured before serving)" | tee -a "$log"
timeout 330 python3 bench/cold_start.py serve --then "$loads" --device cuda --dtype bfloat16 --max-streams 256 --set graph_capture=blocking 2>&1 | tee -a "$log" | grep -v '^{"' | head -60
echo "=== in-process" | tee -a "$log"
timeout 120 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --seconds 3 --out "$OUT/inprocess" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee -a "$log" | tail -6
