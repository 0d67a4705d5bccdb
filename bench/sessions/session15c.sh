#!/usr/bin/env bash
# Session 15, GPU call 3 (repo root on the device), at the new default (residual units as one
# kernel): the GPU checks (quick), sustained load at 1 / 64 / 256 streams, then 256 streams with
# the units as two launches (layers.unit_conv_rows=0) on the same machine start.
source bench/device_env.sh
log="$OUT/log.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
echo "=== GPU checks (quick)" | tee -a "$log"
timeout 200 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt" | grep -E "^(PASS|FAIL|SUMMARY)" | tee -a "$log"
echo "=== sustained, defaults" | tee -a "$log"
timeout 130 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --seconds 3 \
  --out "$OUT/sustained" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/sustained.txt" | grep -A5 "^mode" | tee -a "$log"
echo "=== sustained at 256, units as two launches" | tee -a "$log"
timeout 90 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 256 --seconds 3 --set layers.unit_conv_rows=0 \
  --out "$OUT/two_launches" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/two_launches.txt" | grep -A3 "^mode" | tee -a "$log"
