#!/usr/bin/env bash
# Session 12, GPU call 3 (run from the repo root on the device, .whl carried): a cold start with
# graphs captured while serving, on a fresh machine and then again (the Triton cache warm); the
# first runs of new shapes in the instant forms; the server under load, profiled
# (bench/gpu.sh serveprof); graphs captured while serving, checked against eager.
source bench/device_env.sh
log="$OUT/session12.txt"
for i in 1 2; do
  echo "=== cold start $i: background capture, until the first audio" | tee -a "$log"
  COLD_START_UNTIL="first audio" timeout 150 python3 bench/cold_start.py serve --device cuda --dtype bfloat16 --max-streams 256 --set graph_capture=background 2>&1 | tee -a "$log" | grep -v '^{"'
done
echo "=== first runs in the instant forms" | tee -a "$log"
INSTANT=1 timeout 80 python3 bench/first_run.py bfloat16 2>&1 | tee -a "$log" | grep "==="
bash bench/gpu.sh serveprof
echo "=== warm_check float32 8" | tee -a "$log"
timeout 150 python3 bench/warm_check.py float32 8 2>&1 | tee -a "$log" | tail -12
