#!/usr/bin/env bash
# Session 34 (repo root on the device): the 384-channel units' tail as one CUDA C++ kernel
# (kernels/tail_wide.py, layers.tail_wide_rows), and one or two warpgroups filling the window
# unit's windows (layers.window_producers).
#   bash bench/session34.sh a   the tail kernel alone against its three passes (bench/tail_wide.py:
#                               checks and timings), the window unit's checks and timings with one
#                               and two filling warpgroups (bench/unit_window.py), then the record
#                               alternating the default, tail_wide_rows=1 and window_producers=2
#   bash bench/session34.sh b   every GPU check (bench/gpu_check.py, 400 s), then the record at the default
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
case "${1:-}" in
a)
  stamp "the 384-channel tail kernel (bench/tail_wide.py)"
  timeout 120 python3 bench/tail_wide.py 2>&1 | grep -v Warning | tee "$OUT/tail_wide.txt" | tee -a "$log"
  stamp "the window unit, one or two filling warpgroups (bench/unit_window.py)"
  timeout 150 python3 bench/unit_window.py 1x1,16x25,20x25 2>&1 | grep -v Warning | tee "$OUT/unit_window.txt" | tail -8 | tee -a "$log"
  sustained_levels default_1
  grep -q "^PASS" "$OUT/tail_wide.txt" && sustained_levels tail_1 --set layers.tail_wide_rows=1
  grep -q "^PASS" "$OUT/unit_window.txt" && sustained_levels two_1 --set layers.window_producers=2
  sustained_levels default_2
  grep -q "^PASS" "$OUT/tail_wide.txt" && sustained_levels tail_2 --set layers.tail_wide_rows=1
  ;;
b)
  stamp "every GPU check"
  timeout 400 python3 bench/gpu_check.py 2>&1 | grep -v Warning | tee "$OUT/gpu_check.txt" | grep -E "FAIL|SUMMARY" | tee -a "$log"
  sustained_levels default_1
  ;;
*)
  echo "usage: bash bench/session34.sh a|b" >&2; exit 2 ;;
esac
