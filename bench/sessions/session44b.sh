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
legs() {  # $1 name, $2 seconds it may take, then code2wav.bench's extra arguments
  local name=$1 limit=$2; shift 2
  stamp "512 streams ramped, prefixes 0,200,200,0, legs of the first packet ($name: $*)"
  timeout "$limit" python3 bench/ttfp_parts.py -- --modes exact-graph --frames 101 --levels 512 \
    --chunks 1,4,8,16,25 --prefix 0,200,200,0 --voices 8 --seconds 3 --set prefix_cache_bytes=1000000000 "$@" --out "$OUT/$name" 2>&1 \
    | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/$name.txt" | grep -A6 "^mode" | cut -c1-400 | tee -a "$log"
  rm -f "$OUT/$name/plot.png"
}
stamp "restore_cost.py: three cached streams in one step, by the step's pairs and by their own launches"
timeout 150 python3 bench/restore_cost.py bfloat16 300 2>&1 | tee -a "$log"
[ "${1:-}" = quick ] && { pack_out; exit 0; }
legs def_1 230
[ "${1:-}" = one ] && { pack_out; exit 0; }  # the check and one process
legs def_2 110
[ "${1:-}" = long ] && legs def_3 110
pack_out
