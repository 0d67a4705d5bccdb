#!/usr/bin/env bash
# Session 12, the last GPU call (repo root on the device, .whl carried): a cold start with graphs
# captured while serving, on a fresh machine and then again; the service at full load after this
# session's host fixes (graphs captured before serving, for the steady state); then in-process,
# the same workload with and without a 200-frame prefix from 8 voices, the prefix cache warm.
source bench/device_env.sh
log="$OUT/final.txt"
for i in 1 2; do
  echo "=== cold start $i: background capture, until the first audio" | tee -a "$log"
  COLD_START_UNTIL="first audio" timeout $((i == 1 ? 75 : 45)) python3 bench/cold_start.py serve --device cuda --dtype bfloat16 --max-streams 256 --set graph_capture=background 2>&1 | tee -a "$log" | grep -v '^{"'
done
loads='for spec in "1 1 0" "4 16 0" "4 64 0" "8 32 0" "4 64 200"; do set -- $spec; echo "=== service: $1 procs x $2 streams, prefix $3";
  timeout 40 python3 bench/service_load.py http://127.0.0.1:8091 $1 $2 8 --prefix $3 | tee -a '"$OUT"'/service_load.jsonl | cut -c1-250; done'
echo "=== full load (graphs captured before serving)" | tee -a "$log"
timeout 210 python3 bench/cold_start.py serve --then "$loads" --device cuda --dtype bfloat16 --max-streams 256 2>&1 | tee -a "$log" | grep -v '^{"'
echo "=== in-process, prefix 0 and 200 from 8 voices, the cache warm" | tee -a "$log"
timeout 160 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --prefix 0,200 --voices 8 --seconds 3 \
  --set prefix_cache_bytes=1000000000 --out "$OUT/inprocess" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee -a "$log" | tail -12
echo "=== warm_check float32 4 (what time is left)" | tee -a "$log"
timeout 90 python3 bench/warm_check.py float32 4 2>&1 | tee -a "$log" | tail -6
