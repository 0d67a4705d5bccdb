#!/usr/bin/env bash
# Session 42, call 2 (repo root on the device): call 1 (session41b.sh) put 15 % (16 restore pairs a
# step) or 48 % (8) of a cached voice's restores on a launch of their own at 512 streams ramped,
# with the first packet's gap +5.1 / +1.7 % and +2.7 %: the launches are not it. Here the same
# none / cached / cached / none run, three processes, through bench/ttfp_parts.py: each first
# chunk's way (push, taken by the worker, grouped, launched, handed over, landed) timed leg by leg,
# and the device time of the first chunks' steps (call 3: the first process is given 150 s: call 2's was cut off at 110 s).
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
runs="1 2 3"; [ "${1:-}" = short ] && runs="1 2"  # short: two processes (about 160 s)
for i in $runs; do
  stamp "512 streams ramped, prefixes 0,200,200,0, legs of the first packet (parts_$i)"
  timeout 150 python3 bench/ttfp_parts.py -- --modes exact-graph --frames 101 --levels 512 --chunks 1,4,8,16,25 --prefix 0,200,200,0 \
    --voices 8 --seconds 3 --set prefix_cache_bytes=1000000000 --out "$OUT/parts_$i" 2>&1 | tr "\r" "\n" | grep -v "it/s]" \
    | tee "$OUT/parts_$i.txt" | grep -A6 "^mode\|^{" | tee -a "$log"
  rm -f "$OUT/parts_$i/plot.png"
done
pack_out
