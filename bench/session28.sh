#!/usr/bin/env bash
# Session 28 (repo root on the device).
#   bash bench/session28.sh a   the 96-channel unit as a CUDA C++ wgmma kernel (kernels/unit_window.py):
#                               exactness against a float32 unit and the Triton unit, then both timed
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
case "${1:-}" in
a)
  stamp "the window unit: checks and timings"
  timeout 300 python3 bench/unit_window.py "${2:-1x1,16x1,1x25,16x25,20x25}" 2>&1 | tee "$OUT/unit_window.txt" | tee -a "$log"
  ;;
*)
  echo "usage: bash bench/session28.sh a" >&2; exit 2 ;;
esac
