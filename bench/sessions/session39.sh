#!/usr/bin/env bash
# Session 39 (repo root on the device), for little device time, most telling first: whether the
# restore's direct launch is in use now (bench/restore_cost.py); a cached voice's first push
# beside a fresh stream's, synchronously and through the async engine with the worker's restore
# and decode marked from the push (bench/prefix_first_packet.py), with the restore's own launch
# and then with the cached state written inside the first step (EngineConfig.restores_in_step,
# off by default); the record's prefix form at one stream: this tree, with restores_in_step,
# the tree in _base (a04bcd0: `mkdir _base && git archive a04bcd0 code2wav | tar -x -C _base`);
# the service at one stream with and without a cached prefix.
# `bash bench/sessions/session39.sh short`: the two first-push runs alone (what ~90 s of device time holds).
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
if [ "${1:-}" != short ]; then
  stamp "the restore's cost (bench/restore_cost.py)"
  timeout 60 python3 bench/restore_cost.py bfloat16 300 2>&1 | grep -v Warning | tee "$OUT/restore_cost.txt" | tee -a "$log"
fi
for variant in launch in_step; do
  stamp "a cached voice's first packet, the restore $variant (bench/prefix_first_packet.py)"
  timeout 120 python3 bench/prefix_first_packet.py cuda 20 "$OUT/prefix_first_packet_$variant.trace.json" $variant 2>&1 | grep -v Warning \
    | tee "$OUT/prefix_first_packet_$variant.txt" | grep -E "push|cache|restore|timeline|runtime calls|async" | tee -a "$log"
  gzip -f "$OUT/prefix_first_packet_$variant.trace.json"
done
[ "${1:-}" = short ] && exit 0
prefix_levels prefix_1_new 1
stamp "sustained 1: no prefix, a cached 200-frame prefix, restores_in_step (prefix_1_in_step)"
timeout 120 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1 --prefix 0,200 --voices 8 --seconds 3 \
  --set prefix_cache_bytes=1000000000 --set restores_in_step=true --out "$OUT/prefix_1_in_step" 2>&1 | tr "\r" "\n" | grep -v "it/s]" \
  | tee "$OUT/prefix_1_in_step.txt" | grep -A5 "^mode" | tee -a "$log"
rm -f "$OUT/prefix_1_in_step/plot.png"
[ -d _base ] && (cd _base && export PYTHONPATH="$PWD:/tmp/site" && prefix_levels prefix_1_base 1)
# The service at one stream on a kept connection, from a client process: no prefix, then a
# 200-frame prefix from 8 voices (the cache on), alternating twice (where users meet the first
# packet: the start message opens the stream, the frames come in the next).
stamp "the service at one stream: no prefix / a cached 200-frame prefix"
loads='for spec in "0" "200 --voices 8" "0" "200 --voices 8"; do
  echo "=== service: 1 x 1, prefix $spec"; timeout 30 python3 bench/service_load.py http://127.0.0.1:8091 1 1 6 --reuse-connections --prefix $spec \
  | tee -a '"$OUT"'/service_prefix.jsonl | grep -o "\"throughput_x\": [0-9.]*, \"ttfp_p50_ms\": [0-9.]*"; done'
timeout 150 python3 bench/cold_start.py serve --then "$loads" --device cuda --dtype bfloat16 --max-streams 16 \
  --set prefix_cache_bytes=1000000000 2>&1 | tee "$OUT/service_prefix.txt" | grep -v '^{"' | tee -a "$log"
keep_triton_cache
