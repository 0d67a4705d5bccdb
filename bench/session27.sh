#!/usr/bin/env bash
# Session 27 (repo root on the device).
#   bash bench/session27.sh a   the priority stream as on main (EngineConfig.priority_step_frames, off by
#                               default): bench/priority_check.py (float32 exactness with it and without,
#                               many streams at once), then the record alternating with and without it, twice
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
case "${1:-}" in
a)
  stamp "the priority stream: exactness and use (float32, many streams at once)"
  timeout 200 python3 bench/priority_check.py 24 2>&1 | tee "$OUT/priority_check.txt" | tee -a "$log"
  for i in 1 2; do
    sustained_levels "priority_$i" --set priority_step_frames=16
    sustained_levels "one_stream_$i"
  done
  keep_triton_cache
  ;;
*) echo "usage: bash bench/session27.sh a" >&2; exit 2 ;;
esac
stamp "done"
