#!/usr/bin/env bash
# Session 41 (repo root on the device): where a cached voice's later first packet at 512 streams
# on a ramped schedule comes from (session 40: +5.7 to +10 % there, with the restore's own launch
# and inside the step alike; throughput 98.5-100.4 %). Each run alternates none / cached /
# cached / none in one process (code2wav.bench --prefix 0,P,P,0), 512 streams, chunks
# 1, 4, 8, 16, 25: the 200-frame case again (this start's baseline); a cached 1-frame prefix
# (the same whole-state restore, almost none of a long prefix's host work, one frame of
# history); the 200-frame case with first chunks not gathering (--first-chunk-wait-ms 0). The
# table's `CPU us` column: the process's host time per stream, none against cached. First, the
# GPU side alone: a first chunk's step over fresh rows against rows with a 200-frame history
# (bench/history_step.py).
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
stamp "a step over fresh rows against rows with history (bench/history_step.py)"
timeout 90 python3 bench/history_step.py bfloat16 200 2>&1 | grep -v Warning | tee "$OUT/history_step.txt" | tee -a "$log"
# Then an A/A (no prefix in all four phases: does the phases' order alone move the first packet?)
# and the 200-frame case with at most 8 first chunks gathered (every restore fits its step's 8
# pairs: none by its own launch).
for spec in "0,200,200,0 5 prefix_512_ramp_200" "0,1,1,0 5 prefix_512_ramp_1" "0,200,200,0 0 prefix_512_ramp_200_nowait" \
            "0,0,0,0 5 prefix_512_ramp_aa" "0,200,200,0 5 prefix_512_ramp_200_rows8 --set schedule.first_chunk_rows=8"; do
  set -- $spec; prefixes=$1 wait=$2 name=$3; shift 3
  stamp "512 streams ramped, prefixes $prefixes, first-chunk wait $wait ms ($name $*)"
  timeout 100 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 512 --chunks 1,4,8,16,25 --prefix "$prefixes" \
    --voices 8 --seconds 3 --first-chunk-wait-ms "$wait" --set prefix_cache_bytes=1000000000 "$@" --out "$OUT/$name" 2>&1 | tr "\r" "\n" \
    | grep -v "it/s]" | tee "$OUT/$name.txt" | grep -A6 "^mode" | tee -a "$log"
  rm -f "$OUT/$name/plot.png"
done
pack_out
