#!/usr/bin/env bash
# Session 13, GPU call 4 (repo root on the device, .whl carried): A/B of SchedulePolicy.steps_ahead
# (steps left queued on the GPU while the host delivers an earlier one) through the service, one
# machine: a server with 2, then one with the default; the same loads against each.
source bench/device_env.sh
log="$OUT/log.txt"
for ahead in 2 1; do
  export AHEAD=$ahead
  loads='for spec in "1 1" "4 16 --reuse-connections" "4 64 --reuse-connections" "4 16" "4 64"; do
    set -- $spec; echo "=== steps_ahead $AHEAD, service: $1 procs x $2 streams ${3:-}";
    timeout 30 python3 bench/service_load.py http://127.0.0.1:8091 $1 $2 8 ${3:-} | tee -a '"$OUT"'/service_load.jsonl | python3 -c "import json, sys; d = json.loads(sys.stdin.readline()); d.pop(\"runs\"); d[\"ahead\"] = $AHEAD; print(json.dumps(d))"; done'
  echo "=== server with schedule.steps_ahead=$ahead (graphs captured before serving)" | tee -a "$log"
  timeout 200 python3 bench/cold_start.py serve --then "$loads" --device cuda --dtype bfloat16 --max-streams 256 --set graph_capture=blocking \
    --set schedule.steps_ahead=$ahead 2>&1 | tee -a "$log" | grep -v '^{"' | head -40
done
