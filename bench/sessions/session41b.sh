#!/usr/bin/env bash
# Session 41, call 2 (repo root on the device): call 1 found a cached voice's first packet at 512
# streams ramped inside 5 % with at most 8 first chunks gathered (schedule.first_chunk_rows=8:
# every restore fits its step's 8 pairs), with first chunks not gathering, and with a 1-frame
# prefix, but +5.2 % at the default (16 gathered: past 8, restores by their own launch). Here, one
# process each, in the order 8 / 16 / 16 / 8: the default against the step carrying 16 restore
# pairs (stream/pool.py RESTORES, set before the engine is built). The table's `alone%` (since
# b3a1dbb): the share of the run's restores that went by a launch of their own.
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
bench512() {  # $1 name, $2 RESTORES, $3 prefixes, then code2wav.bench's extra arguments
  local name=$1 restores=$2 prefixes=$3; shift 3
  stamp "512 streams ramped, prefixes $prefixes, RESTORES=$restores ($name $*)"
  timeout 100 python3 -c 'import sys, code2wav.stream.pool as p; p.RESTORES = int(sys.argv[1]); from code2wav.cli import main; sys.exit(main(["bench", *sys.argv[2:]]))' \
    "$restores" --modes exact-graph --frames 101 --levels 512 --chunks 1,4,8,16,25 --prefix "$prefixes" --voices 8 --seconds 3 \
    --set prefix_cache_bytes=1000000000 "$@" --out "$OUT/$name" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/$name.txt" | grep -A6 "^mode" | tee -a "$log"
  rm -f "$OUT/$name/plot.png"
}
if [ "${1:-}" = short ]; then  # three processes, 16 / 8 / 16 (about 200 s)
  bench512 r16_a 16 0,200,200,0
  bench512 r8_a 8 0,200,200,0
  bench512 r16_b 16 0,200,200,0
else
  bench512 r8_a 8 0,200,200,0
  bench512 r16_a 16 0,200,200,0
  bench512 r16_b 16 0,200,200,0
  bench512 r8_b 8 0,200,200,0
fi
pack_out
