#!/usr/bin/env bash
# Session 44 (repo root on the device). First: bench/restore_cost.py's pairs-kernel check and the
# three cached streams in one step against three prefilled (session 43's open question). Then the
# garbage collector: one full pass with and without the heap frozen at build (bench/gc_pause.py),
# and the legs of the first packet at 512 streams ramped with gc_freeze on (the default in
# `code2wav bench` since this session) and off, one process each (`quick`: the check alone).
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
stamp "restore_cost.py: the pairs kernel alone; three cached streams in one step against three prefilled"
timeout 150 python3 bench/restore_cost.py bfloat16 300 2>&1 | tee -a "$log"
[ "${1:-}" = quick ] && { pack_out; exit 0; }
stamp "gc_pause.py: one full collector pass, heap frozen at build or not"
timeout 60 python3 bench/gc_pause.py --device cuda --streams 512 2>&1 | grep '^{' | tee -a "$log"
legs freeze_1 230
legs nofreeze_1 110 --set gc_freeze=false
pack_out
