#!/usr/bin/env bash
# Session 36 (repo root on the device): a cached voice's first packet.
#   bash bench/sessions/session36.sh a   (call 1, H100, at 406ea23) the record's prefix form (8 voices, every one
#                               warmed before the timed window) at one stream; a cached voice's first and
#                               second push against a fresh stream's, timed and profiled
#                               (bench/prefix_first_packet.py); the prefix form at 64 / 256 streams
#   bash bench/sessions/session36.sh b   (call 2, H100, at 0923e60) the restore as one launch (kernels/slot_copy.py): its cost and exactness
#                               against the foreach copy (bench/restore_cost.py), then as call 1
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
first_packet() {
  stamp "a cached voice's first packet (bench/prefix_first_packet.py)"
  timeout 150 python3 bench/prefix_first_packet.py cuda 60 2>&1 | grep -v Warning | tee "$OUT/prefix_first_packet.txt" \
    | grep -E "push|cache|restore" | tee -a "$log"
}
case "${1:-}" in
a)
  prefix_levels prefix_1 1
  first_packet
  prefix_levels prefix_64_256 64,256
  ;;
b)
  stamp "the restore's cost (bench/restore_cost.py)"
  timeout 100 python3 bench/restore_cost.py bfloat16 2000 2>&1 | grep -v Warning | tee "$OUT/restore_cost.txt" | tee -a "$log"
  prefix_levels prefix_1 1
  first_packet
  prefix_levels prefix_64_256 64,256
  keep_triton_cache
  ;;
*)
  echo "usage: bash bench/sessions/session36.sh a|b" >&2; exit 2 ;;
esac
