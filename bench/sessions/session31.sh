#!/usr/bin/env bash
# Session 31 (repo root on the device): the window unit (kernels/unit_window.py, one tile at a
# time) is the default on sm90 (LayerChoices.unit_window_rows=1).
#   bash bench/sessions/session31.sh a   the quick GPU checks at the new default (its bf16 stream, and the
#                               Triton units' beside it), then the record alternating the default and
#                               the Triton units (unit_window_rows=0), twice
#   bash bench/sessions/session31.sh b   `code2wav serve` from a cold start to its first audio on a fresh
#                               machine, every GPU check (graph == eager at every captured shape, the
#                               window unit in them), then the cold start again (caches warm)
#   bash bench/sessions/session31.sh c   the service from a cold start, then at load from 4 client processes (1 x 1,
#                               4 x 16, 4 x 64 on kept connections, 4 x 64 a connection each), in-process
#                               1 / 64 / 256 on the same start, and a large step's layers (bench/layer_times.py)
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
c)
  service_at_load 220
  sustained_levels inprocess
  stamp "a 16 x 25 and a 20 x 25 step, layer by layer"
  timeout 150 python3 bench/layer_times.py bfloat16 16x25,20x25 2>&1 | grep -v Warning | tee "$OUT/layer_times.txt" | tail -n 60
  ;;
*)
  echo "usage: bash bench/sessions/session31.sh a|b|c" >&2; exit 2 ;;
esac
