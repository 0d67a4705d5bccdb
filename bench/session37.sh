#!/usr/bin/env bash
# Session 37 (repo root on the device): a cached voice's first packet at one stream.
#   bash bench/session37.sh a   the restore's launch (kernels/slot_copy.py called by its compiled launcher
#                               directly, through Triton's, the foreach copy: bench/restore_cost.py); a
#                               cached voice's first push beside a fresh stream's and one restored ahead,
#                               timed and laid out in time (bench/prefix_first_packet.py, its trace kept);
#                               the record's prefix form at one stream
#   bash bench/session37.sh b   a's first two runs, shorter
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
prefix_levels() {
  stamp "sustained $2: no prefix, a cached 200-frame prefix ($1)"
  timeout 200 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels "$2" --prefix 0,200 --voices 8 --seconds 3 \
    --set prefix_cache_bytes=1000000000 --out "$OUT/$1" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/$1.txt" | grep -A5 "^mode" | tee -a "$log"
  rm -f "$OUT/$1/plot.png"
}
case "${1:-}" in
a)
  stamp "the restore's cost (bench/restore_cost.py)"
  timeout 100 python3 bench/restore_cost.py bfloat16 2000 2>&1 | grep -v Warning | tee "$OUT/restore_cost.txt" | tee -a "$log"
  stamp "a cached voice's first packet (bench/prefix_first_packet.py)"
  timeout 150 python3 bench/prefix_first_packet.py cuda 25 "$OUT/prefix_first_packet.trace.json" 2>&1 | grep -v Warning \
    | tee "$OUT/prefix_first_packet.txt" | grep -E "push|cache|restore|timeline|runtime calls" | tee -a "$log"
  gzip -f "$OUT/prefix_first_packet.trace.json"
  prefix_levels prefix_1 1
  keep_triton_cache
  ;;
b)  # the same first two runs, short (what device time was left)
  stamp "the restore's cost (bench/restore_cost.py)"
  timeout 60 python3 bench/restore_cost.py bfloat16 1000 2>&1 | grep -v Warning | tee "$OUT/restore_cost.txt" | tee -a "$log"
  stamp "a cached voice's first packet (bench/prefix_first_packet.py)"
  timeout 100 python3 bench/prefix_first_packet.py cuda 20 "$OUT/prefix_first_packet.trace.json" 2>&1 | grep -v Warning \
    | tee "$OUT/prefix_first_packet.txt" | grep -E "push|cache|restore|timeline|runtime calls" | tee -a "$log"
  gzip -f "$OUT/prefix_first_packet.trace.json"
  ;;
*)
  echo "usage: bash bench/session37.sh a|b" >&2; exit 2 ;;
esac
