#!/usr/bin/env bash
# Session 30 (repo root on the device): the window unit (kernels/unit_window.py) passed its checks
# in session28.sh a; here where it wins and the record with it.
#   bash bench/sessions/session30.sh   its timings at many-row shapes, an interleaved graph-replay A/B over
#                             the shapes a 256-stream step takes and many-row ones, then the record
#                             alternating with the window unit (unit_window_rows=1) and without, twice
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
stamp "the window unit at many-row shapes"
timeout 120 python3 bench/unit_window.py "16x25,64x8,128x4,256x2" 2>&1 | tee "$OUT/unit_window.txt" | tail -9 | tee -a "$log"
stamp "graph replay, interleaved: default vs the window unit"
timeout 150 python3 bench/replay_ab.py channels_last,channels_last-unitwindow=1 16x25,20x25,12x25,64x8,32x8,64x4 5 20 2>&1 \
  | grep -v Warning | tee "$OUT/replay_ab.txt" | tee -a "$log"
for i in 1 2; do
  sustained_levels "window_$i" --set layers.unit_window_rows=1
  sustained_levels "default_$i"
done
