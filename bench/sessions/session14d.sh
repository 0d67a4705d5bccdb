#!/usr/bin/env bash
# Session 14, GPU call 4 (repo root on the device): the step layer by layer at this commit's
# defaults; graph replay per step shape, conv_fold dilated vs multi-row; sustained in-process at
# 1 / 64 / 256 streams without a prefix and with 200-frame prefixes from 8 voices (the prefix
# cache on); then 1 and 256 streams with conv_fold multi-row.
source bench/device_env.sh
log="$OUT/log.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
echo "=== layer times" | tee -a "$log"
timeout 100 python3 bench/layer_times.py bfloat16 16x25,1x1 2>&1 | grep -v Warning | tee "$OUT/layer_times.txt" | grep -E "^(===|by kind|sum)" | tee -a "$log"
echo "=== graph replay per shape: conv_fold dilated, multi-row" | tee -a "$log"
timeout 200 python3 bench/profile_step.py bfloat16 channels_last,channels_last-fold=multi-row 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
echo "=== a cache hit's host cost" | tee -a "$log"
timeout 60 python3 bench/restore_cost.py 2>&1 | tee -a "$log"
echo "=== sustained, defaults (prefix cache on)" | tee -a "$log"
timeout 170 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --prefix 0,200 --voices 8 --seconds 3 \
  --set prefix_cache_bytes=1000000000 --out "$OUT/inprocess" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/inprocess.txt" | grep -A8 "^mode" | tee -a "$log"
echo "=== sustained, conv_fold multi-row" | tee -a "$log"
timeout 100 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,256 --seconds 3 --set layers.conv_fold=multi-row \
  --out "$OUT/multirow" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/multirow.txt" | grep -A4 "^mode" | tee -a "$log"
