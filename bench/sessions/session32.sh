#!/usr/bin/env bash
# Session 32 (repo root on the device): the window unit and the output conv read their own
# history (LayerChoices.read_history, on by default): the pool rows and SnakeBeta of the
# layer's input go straight into the window unit's shared-memory window or the output conv's
# product, the new history back to the pool; no history concat before those four layers.
#   bash bench/sessions/session32.sh a   the window unit against the history concat and a float32 unit
#                               (bench/unit_window.py), the record alternating the default and
#                               read_history=false twice, wide_tail=true (the 384/768-channel
#                               units' 1x1 conv and residual as one GEMM) once; the quick GPU
#                               checks; the output conv against the history concat (bench/mono_conv.py)
#   bash bench/sessions/session32.sh b   every GPU check, a 16 x 25 and a 20 x 25 step layer by layer,
#                               the wide tail's tiles (bench/wide_tail.py), the record again
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
case "${1:-}" in
a)
  stamp "the window unit reading its history (bench/unit_window.py)"
  timeout 150 python3 bench/unit_window.py "${2:-1x1,16x1,1x25,16x25,20x25,64x8}" 2>&1 | grep -v Warning | tee "$OUT/unit_window.txt" | tee -a "$log"
  grep -q "^PASS" "$OUT/unit_window.txt" || exit 1
  sustained_levels default_1
  sustained_levels concat_1 --set layers.read_history=false
  sustained_levels wide_1 --set layers.wide_tail=true
  sustained_levels default_2
  sustained_levels concat_2 --set layers.read_history=false
  stamp "the quick GPU checks"
  timeout 180 python3 bench/gpu_check.py --quick 2>&1 | grep -v Warning | tee "$OUT/gpu_check.txt" | grep -E "FAIL|SUMMARY|96-channel" | tee -a "$log"
  stamp "the output conv reading its history (bench/mono_conv.py)"
  timeout 90 python3 bench/mono_conv.py 16x25 2>&1 | grep -v Warning | tee "$OUT/mono_conv.txt" | tail -4 | tee -a "$log"
  keep_triton_cache
  ;;
b)
  stamp "every GPU check"
  timeout 300 python3 bench/gpu_check.py 2>&1 | grep -v Warning | tee "$OUT/gpu_check.txt" | grep -E "FAIL|SUMMARY" | tee -a "$log"
  stamp "a 16 x 25 and a 20 x 25 step, layer by layer"
  timeout 120 python3 bench/layer_times.py bfloat16 16x25,20x25 2>&1 | grep -v Warning | tee "$OUT/layer_times.txt" | tail -n 60
  stamp "the 384/768-channel tail after SnakeBeta, a sweep of its tiles"
  timeout 150 python3 bench/wide_tail.py 16x25 2>&1 | grep -v Warning | tee "$OUT/wide_tail.txt" | tee -a "$log"
  sustained_levels default_3
  ;;
*)
  echo "usage: bash bench/sessions/session32.sh a|b" >&2; exit 2 ;;
esac
