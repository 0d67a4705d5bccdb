#!/usr/bin/env bash
# Session 31 (repo root on the device): the window unit (kernels/unit_window.py, one tile at a
# time) is the default on sm90 (LayerChoices.unit_window_rows=1).
#   bash bench/session31.sh a   the quick GPU checks at the new default (its bf16 stream, and the
#                               Triton units' beside it), then the record alternating the default and
#                               the Triton units (unit_window_rows=0), twice
#   bash bench/session31.sh b   `code2wav serve` from a cold start to its first audio on a fresh
#                               machine, every GPU check (graph == eager at every captured shape, the
#                               window unit in them), then the cold start again (caches warm)
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
case "${1:-}" in
a)
  stamp "the quick GPU checks"
  timeout 180 python3 bench/gpu_check.py --quick 2>&1 | grep -v Warning | tee "$OUT/gpu_check.txt" | grep -E "FAIL|SUMMARY|96-channel" | tee -a "$log"
  for i in 1 2; do
    sustained_levels "default_$i"
    sustained_levels "triton_units_$i" --set layers.unit_window_rows=0
  done
  keep_triton_cache
  ;;
b)
  cold() {
    stamp "serve from a cold start to its first audio: $1"
    COLD_START_UNTIL="first audio" timeout 120 python3 bench/cold_start.py serve --device cuda --dtype bfloat16 --max-streams 256 2>&1 \
      | tee "$OUT/cold_start_$1.txt" | tail -4 | tee -a "$log"
  }
  cold fresh
  stamp "every GPU check"
  timeout 300 python3 bench/gpu_check.py 2>&1 | grep -v Warning | tee "$OUT/gpu_check.txt" | grep -E "FAIL|SUMMARY" | tee -a "$log"
  cold restart
  ;;
*)
  echo "usage: bash bench/session31.sh a|b" >&2; exit 2 ;;
esac
