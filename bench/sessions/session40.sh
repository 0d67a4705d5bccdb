#!/usr/bin/env bash
# Session 40 (repo root on the device), most telling first: whether a stream restored inside its
# first step (EngineConfig.restores_in_step) gives a prefilled stream's audio bit for bit on a GPU,
# eager and through graphs (bench/restore_cost.py: the check before it goes on by default); then
# a cached voice at one stream in six processes, the restore's own launch and restores_in_step
# alternating (TTFP moves ~20 us between processes: one pair says little); restores_in_step at
# 64 / 256 streams; the service at one stream with and without a cached prefix
# (restores_in_step on), from a client process.
# `bash bench/sessions/session40.sh default` (once restores_in_step is on by default where its kernel runs):
# the default config's choice printed, then the cached voice at one stream in four processes and at
# 64 / 256 streams with nothing set but the cache.
# `bash bench/sessions/session40.sh order`: the phase order's part: at one stream the cached voice first,
# then none, three times in one process (two processes); then 512 streams on a ramped chunk
# schedule (1, 4, 8, 16, then 25 frames), none against a cached voice.
# `bash bench/sessions/session40.sh abba`: the same, each form twice in the order none, cached, cached,
# none (drift within a process falls on both alike): 512 streams ramped, then one stream.
# `bash bench/sessions/session40.sh abba2`: 512 streams ramped, with the restore's own launch
# (restores_in_step=false) and then inside the step, in the same order (one process each).
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
if [ "${1:-}" = abba ] || [ "${1:-}" = abba2 ]; then
  specs=("512 1,4,8,16,25 prefix_512_ramp_abba" "1 1,25 prefix_1_abba")
  [ "$1" = abba2 ] && specs=("512 1,4,8,16,25 prefix_512_ramp_launch_abba restores_in_step=false" "512 1,4,8,16,25 prefix_512_ramp_in_step_abba restores_in_step=true")
  for spec in "${specs[@]}"; do
    set -- $spec
    stamp "$1 streams, chunks $2, none / cached / cached / none ($3 ${4:-})"
    timeout 140 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels "$1" --chunks "$2" --prefix 0,200,200,0 --voices 8 \
      --seconds 3 --set prefix_cache_bytes=1000000000 ${4:+--set $4} --out "$OUT/$3" 2>&1 | tr "\r" "\n" | grep -v "it/s]" \
      | tee "$OUT/$3.txt" | grep -A6 "^mode" | tee -a "$log"
    rm -f "$OUT/$3/plot.png"
  done
  pack_out
  exit 0
fi
if [ "${1:-}" = order ]; then
  for i in 1 2; do
    stamp "one stream, the cached voice first, alternating three times (prefix_1_order_$i)"
    timeout 150 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1 --prefix 200,0,200,0,200,0 --voices 8 --seconds 3 \
      --set prefix_cache_bytes=1000000000 --out "$OUT/prefix_1_order_$i" 2>&1 | tr "\r" "\n" | grep -v "it/s]" \
      | tee "$OUT/prefix_1_order_$i.txt" | grep -A8 "^mode" | tee -a "$log"
    rm -f "$OUT/prefix_1_order_$i/plot.png"
  done
  stamp "512 streams, ramped chunks, none against a cached voice (prefix_512_ramp)"
  timeout 200 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 512 --chunks 1,4,8,16,25 --prefix 0,200 --voices 8 \
    --seconds 3 --set prefix_cache_bytes=1000000000 --out "$OUT/prefix_512_ramp" 2>&1 | tr "\r" "\n" | grep -v "it/s]" \
    | tee "$OUT/prefix_512_ramp.txt" | grep -A4 "^mode" | tee -a "$log"
  rm -f "$OUT/prefix_512_ramp/plot.png"
  pack_out
  exit 0
fi
if [ "${1:-}" = default ]; then
  python3 -c "from code2wav.engine.build import EngineConfig as C; print('restores_in_step by default on cuda:', C(device='cuda').use_restores_in_step())" | tee -a "$log"
  for i in 1 2 3 4; do prefix_levels "prefix_1_default_$i" 1; done
  prefix_levels prefix_64_256_default 64,256
  pack_out
  exit 0
fi
stamp "the restore's cost and a restored stream's audio (bench/restore_cost.py)"
timeout 120 python3 bench/restore_cost.py bfloat16 300 2>&1 | grep -v Warning | tee "$OUT/restore_cost.txt" | tee -a "$log"
for i in 1 2 3; do
  prefix_levels "prefix_1_launch_$i" 1
  prefix_levels "prefix_1_in_step_$i" 1 --set restores_in_step=true
done
prefix_levels prefix_64_256_in_step 64,256 --set restores_in_step=true
stamp "the service at one stream: no prefix / a cached 200-frame prefix (restores_in_step)"
loads='for spec in "0" "200 --voices 8" "0" "200 --voices 8"; do
  echo "=== service: 1 x 1, prefix $spec"; timeout 30 python3 bench/service_load.py http://127.0.0.1:8091 1 1 6 --reuse-connections --prefix $spec \
  | tee -a '"$OUT"'/service_prefix.jsonl | grep -o "\"throughput_x\": [0-9.]*, \"ttfp_p50_ms\": [0-9.]*"; done'
timeout 150 python3 bench/cold_start.py serve --then "$loads" --device cuda --dtype bfloat16 --max-streams 16 \
  --set prefix_cache_bytes=1000000000 --set restores_in_step=true 2>&1 | tee "$OUT/service_prefix.txt" | grep -v '^{"' | tee -a "$log"
keep_triton_cache
