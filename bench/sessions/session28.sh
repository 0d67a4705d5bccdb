#!/usr/bin/env bash
# Session 28 (repo root on the device).
#   bash bench/sessions/session28.sh a   the 96-channel unit as a CUDA C++ wgmma kernel (kernels/unit_window.py):
#                               exactness against a float32 unit and the Triton unit, both timed (on a failure,
#                               bench/unit_window_diag.py: which inputs the wrong outputs came from); if that
#                               passes, the same kernel in the engine (LayerChoices.unit_window_rows=1): an
#                               interleaved graph-replay A/B, then the quick GPU checks (its bf16 stream among them)
#   bash bench/sessions/session28.sh b   the record alternating with the window unit and without, twice
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
case "${1:-}" in
a)
  stamp "the window unit: checks and timings"
  timeout 240 python3 bench/unit_window.py "${2:-1x1,16x1,1x25,4x25,16x25,20x25}" 2>&1 | tee "$OUT/unit_window.txt" | tee -a "$log"
  if ! grep -q "^PASS" "$OUT/unit_window.txt"; then  # which outputs the conv gets wrong, and from where
    timeout 120 python3 bench/unit_window_diag.py 2>&1 | tee "$OUT/unit_window_diag.txt" | tee -a "$log"; exit 1
  fi
  stamp "graph replay, interleaved: default vs the window unit"
  timeout 150 python3 bench/replay_ab.py channels_last,channels_last-unitwindow=1 1x1,16x1,1x25,16x25,20x25,64x8 5 20 2>&1 \
    | grep -v Warning | tee "$OUT/replay_ab.txt" | tee -a "$log"
  stamp "the quick GPU checks (the window unit's bf16 stream among them)"
  timeout 180 python3 bench/gpu_check.py --quick 2>&1 | grep -v Warning | tee "$OUT/gpu_check.txt" | tee -a "$log"
  ;;
b)
  for i in 1 2; do
    sustained_levels "window_$i" --set layers.unit_window_rows="${2:-1}"
    sustained_levels "default_$i"
  done
  ;;
*)
  echo "usage: bash bench/sessions/session28.sh a|b" >&2; exit 2 ;;
esac
