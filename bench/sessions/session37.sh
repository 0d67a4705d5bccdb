#!/usr/bin/env bash
# Session 37 (repo root on the device): a cached voice's first packet at one stream.
#   bash bench/sessions/session37.sh a   the restore's launch (kernels/slot_copy.py called by its compiled launcher
#                               directly, through Triton's, the foreach copy: bench/restore_cost.py); a
#                               cached voice's first push beside a fresh stream's and one restored ahead,
#                               timed and laid out in time (bench/prefix_first_packet.py, its trace kept);
#                               the record's prefix form at one stream (twice), the cold start to first
#                               audio at the default, the prefix form at 64 / 256 streams
#   bash bench/sessions/session37.sh b   a's first two runs, shorter
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
first_push() {  # $1: restore_cost.py's calls, $2: prefix_first_packet.py's pairs
  stamp "the restore's cost (bench/restore_cost.py)"
  timeout 100 python3 bench/restore_cost.py bfloat16 "$1" 2>&1 | grep -v Warning | tee "$OUT/restore_cost.txt" | tee -a "$log"
  stamp "a cached voice's first packet (bench/prefix_first_packet.py)"
  timeout 150 python3 bench/prefix_first_packet.py cuda "$2" "$OUT/prefix_first_packet.trace.json" 2>&1 | grep -v Warning \
    | tee "$OUT/prefix_first_packet.txt" | grep -E "push|cache|restore|timeline|runtime calls" | tee -a "$log"
  gzip -f "$OUT/prefix_first_packet.trace.json"
}
case "${1:-}" in
a)
  first_push 2000 60
  prefix_levels prefix_1 1
  prefix_levels prefix_1_again 1
  stamp "cold start to first audio (bench/cold_start.py serve)"
  COLD_START_UNTIL="first audio" timeout 120 python3 bench/cold_start.py serve --device cuda --dtype bfloat16 2>&1 \
    | tee "$OUT/cold_start.txt" | tail -5 | tee -a "$log"
  prefix_levels prefix_64_256 64,256
  keep_triton_cache
  ;;
b)  # the first two runs only, shorter (what device time is left)
  first_push 1000 20
  ;;
*)
  echo "usage: bash bench/sessions/session37.sh a|b" >&2; exit 2 ;;
esac
