#!/usr/bin/env bash
# Session 43 (repo root on the device): call 1 (session42b.sh) found bench/restore_cost.py's
# three-cached-streams check [True, False, False] against one restored alone: the pairs kernel
# wrong past its first pair on the GPU, or rows 2 and 3 of a bfloat16 step not bit for bit row 1's?
# restore_cost.py now also checks the kernel by itself (three pairs, eager and replayed from a CUDA
# graph) and the three cached streams against the same three prefilled in the same rows. Then the
# legs at 512 streams ramped on this tree, two processes (`long`: three; `quick`: the check alone).
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
legs() {  # $1 name, $2 seconds it may take
  local name=$1 limit=$2
  stamp "512 streams ramped, prefixes 0,200,200,0, legs of the first packet ($name)"
  timeout "$limit" python3 bench/ttfp_parts.py -- --modes exact-graph --frames 101 --levels 512 \
    --chunks 1,4,8,16,25 --prefix 0,200,200,0 --voices 8 --seconds 3 --set prefix_cache_bytes=1000000000 --out "$OUT/$name" 2>&1 \
    | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/$name.txt" | grep -A6 "^mode" | cut -c1-400 | tee -a "$log"
  rm -f "$OUT/$name/plot.png"
}
stamp "restore_cost.py: the pairs kernel alone; three cached streams in one step against three prefilled"
timeout 150 python3 bench/restore_cost.py bfloat16 300 2>&1 | tee -a "$log"
[ "${1:-}" = quick ] && { pack_out; exit 0; }  # the check alone
legs new_1 240
legs new_2 110
[ "${1:-}" = long ] && legs new_3 110
pack_out
