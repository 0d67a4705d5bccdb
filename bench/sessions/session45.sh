#!/usr/bin/env bash
# For session 45's first call (repo root on the device). Session 44 got one call: the pairs kernel
# bit for bit on the GPU by itself; the cached voice's first packet at 512 streams ramped +5.1 %
# with gc_freeze, its extra time after the step and mostly in the first cached phase. Here:
# restore_cost.py (three cached streams in one step, restored by the step's pairs against by their
# own launches, row by row: the open exactness question), then the legs at 512 streams ramped in the
# usual order (none / cached / cached / none) and reversed (cached / none / none / cached), to tell
# a cached phase from the first phase after a switch; each with the loop's lateness and the threads'
# CPU shares; then the usual order with the GIL's switch interval at 0.5 ms (CPython's 5 ms lets the
# worker hold the GIL that long while the loop waits to land a result). `quick`: the check alone;
# `long`: one more process of each order; `again` (session 45's second call, on the warm machine):
# no check, one more process of each order and of the usual order once more; `start2` (another
# start, another host): one process of each order.
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
if [ "${1:-}" = start2 ]; then
  legs512 usual_4 230
  legs512 reversed_4 110 --prefix 200,0,0,200
  python3 bench/ttfp_parts.py --table "$OUT"/*_[0-9].txt | tee -a "$log"
  pack_out; exit 0
fi
if [ "${1:-}" = again ]; then
  legs512 usual_2 110
  legs512 reversed_2 110 --prefix 200,0,0,200
  SWITCH_MS=0.5 legs512 switch05_2 110
  legs512 usual_3 110
  python3 bench/ttfp_parts.py --table "$OUT"/*_[0-9].txt | tee -a "$log"
  pack_out; exit 0
fi
stamp "restore_cost.py: three cached streams in one step, by the step's pairs and by their own launches"
timeout 150 python3 bench/restore_cost.py bfloat16 300 2>&1 | tee -a "$log"
[ "${1:-}" = quick ] && { pack_out; exit 0; }
legs512 usual_1 230
legs512 reversed_1 110 --prefix 200,0,0,200
SWITCH_MS=0.5 legs512 switch05_1 110
if [ "${1:-}" = long ]; then
  legs512 usual_2 110
  legs512 reversed_2 110 --prefix 200,0,0,200
fi
python3 bench/ttfp_parts.py --table "$OUT"/*_[0-9].txt | tee -a "$log"
pack_out
