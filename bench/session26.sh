#!/usr/bin/env bash
# Session 26 (repo root on the device).
#   bash bench/session26.sh a   steps on two CUDA streams (bench/two_streams.py): a large step beside a
#                               small one, two large ones alternating; the default step's kernels
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
case "${1:-}" in
a)
  stamp "steps on two streams"
  timeout 240 python3 bench/two_streams.py 19x25,16x25 16x1,8x1,2x1 40 2>&1 | tee "$OUT/two_streams.txt" | tee -a "$log"
  stamp "graph replay per step shape and the 16 x 25 step's kernels (default)"
  timeout 150 python3 bench/profile_step.py bfloat16 channels_last 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
  ;;
*) echo "usage: bash bench/session26.sh a" >&2; exit 2 ;;
esac
stamp "done"
