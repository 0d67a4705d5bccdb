#!/usr/bin/env bash
# Session 44, call 2 (repo root on the device). Call 1 (session44.sh): the pairs kernel by itself
# bit for bit on the GPU, yet three prefilled streams in one step did not match one prefilled alone
# (their prefill was one batch of three). restore_cost.py now runs the same three cached streams
# restored by the step's pairs and by launches of their own, same rows and slots, and says which
# rows of each run equal its first (identical inputs). Then the legs at 512 streams ramped on the
# defaults (gc_freeze on), with the loop's lateness and the threads' CPU shares
# per phase: two processes (`long`: three; `one`: one; `quick`: the check alone).
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
stamp "restore_cost.py: three cached streams in one step, by the step's pairs and by their own launches"
timeout 150 python3 bench/restore_cost.py bfloat16 300 2>&1 | tee -a "$log"
[ "${1:-}" = quick ] && { pack_out; exit 0; }
legs512 def_1 230
[ "${1:-}" = one ] && { pack_out; exit 0; }  # the check and one process
legs512 def_2 110
[ "${1:-}" = long ] && legs512 def_3 110
pack_out
