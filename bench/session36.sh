#!/usr/bin/env bash
# Session 36 (repo root on the device): a cached voice at one stream, and the cold start at the
# default since session 35 (the streamed 192-channel unit: one more NVRTC compile).
#   bash bench/session36.sh a   the record's prefix form (8 voices, every one warmed before the timed
#                               window) at one stream; a cached voice's first and second push against a
#                               fresh stream's, timed and profiled (bench/prefix_first_packet.py); the
#                               prefix form at 64 / 256 streams; serve from a cold start to its first audio
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
cold() {
  stamp "serve from a cold start to its first audio: $1"
  COLD_START_UNTIL="first audio" timeout 120 python3 bench/cold_start.py serve --device cuda --dtype bfloat16 --max-streams 256 2>&1 \
    | tee "$OUT/cold_start_$1.txt" | tail -4 | tee -a "$log"
}
prefix_levels() {
  stamp "sustained $2: no prefix, a cached 200-frame prefix ($1)"
  timeout 200 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels "$2" --prefix 0,200 --voices 8 --seconds 3 \
    --set prefix_cache_bytes=1000000000 --out "$OUT/$1" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/$1.txt" | grep -A5 "^mode" | tee -a "$log"
  rm -f "$OUT/$1/plot.png"
}
case "${1:-}" in
a)
  prefix_levels prefix_1 1
  stamp "a cached voice's first packet (bench/prefix_first_packet.py)"
  timeout 150 python3 bench/prefix_first_packet.py cuda 60 2>&1 | grep -v Warning | tee "$OUT/prefix_first_packet.txt" \
    | grep -E "push|cache|restore" | tee -a "$log"
  prefix_levels prefix_64_256 64,256
  cold fresh
  ;;
*)
  echo "usage: bash bench/session36.sh a" >&2; exit 2 ;;
esac
