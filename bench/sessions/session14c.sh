#!/usr/bin/env bash
# Session 14, GPU call 3 (repo root on the device): graph replay per step shape with the wide
# units' fused tails on at every step vs never (layers.unit_wide_rows), the step layer by layer at
# the retuned tiles, and every GPU check (exactness, graph == eager, bf16 SNR) at this commit.
source bench/device_env.sh
log="$OUT/log.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
echo "=== graph replay per shape: wide tails always vs never" | tee -a "$log"
timeout 240 python3 bench/profile_step.py bfloat16 channels_last,channels_last-unitwide=1000000000 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
echo "=== layer times" | tee -a "$log"
timeout 100 python3 bench/layer_times.py bfloat16 16x25,1x1 2>&1 | grep -v Warning | tee "$OUT/layer_times.txt" | grep -E "^(===|by kind|sum)" | tee -a "$log"
echo "=== GPU checks" | tee -a "$log"
timeout 280 python3 bench/gpu_check.py 2>&1 | tee "$OUT/gpu_check.txt" | grep -E "^(PASS|FAIL|SUMMARY|INFO)" | cut -c1-220 | tee -a "$log"
