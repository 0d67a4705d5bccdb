#!/usr/bin/env bash
# Session 38 (repo root on the device): a cached voice's first packet at one stream, with the
# prefix looked up when the stream opens and restored on the priority stream where there is one.
#   bash bench/sessions/session38.sh a   why the restore's direct launch is (not) in use and what each
#                               launch costs (bench/restore_cost.py); the first push beside a fresh
#                               stream's, synchronously and through the async engine as
#                               code2wav.bench times it (bench/prefix_first_packet.py, its trace
#                               kept); the record's prefix form at one stream alternating with the
#                               tree in _base (the commit before, where present: a04bcd0), twice
#                               each; 64 / 256 streams
#   bash bench/sessions/session38.sh b   the restore's cost, then one stream against _base once (short)
# _base (ignored; carry it): `mkdir _base && git archive a04bcd0 code2wav | tar -x -C _base`.
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
base_levels() {  # prefix_levels, from the tree in _base
  (cd _base && export PYTHONPATH="$PWD:/tmp/site" && prefix_levels "$@")
}
case "${1:-}" in
a)
  stamp "the restore's cost (bench/restore_cost.py)"
  timeout 100 python3 bench/restore_cost.py bfloat16 500 2>&1 | grep -v Warning | tee "$OUT/restore_cost.txt" | tee -a "$log"
  prefix_levels prefix_1_new_1 1
  [ -d _base ] && base_levels prefix_1_base_1 1
  stamp "a cached voice's first packet (bench/prefix_first_packet.py)"
  timeout 200 python3 bench/prefix_first_packet.py cuda 20 "$OUT/prefix_first_packet.trace.json" 2>&1 | grep -v Warning \
    | tee "$OUT/prefix_first_packet.txt" | grep -E "push|cache|restore|timeline|runtime calls|async" | tee -a "$log"
  gzip -f "$OUT/prefix_first_packet.trace.json"
  prefix_levels prefix_1_new_2 1
  [ -d _base ] && base_levels prefix_1_base_2 1
  prefix_levels prefix_64_256 64,256
  keep_triton_cache
  ;;
b)  # what little device time is left: whether the direct launch is in use now, then one stream
  stamp "the restore's cost (bench/restore_cost.py)"
  timeout 60 python3 bench/restore_cost.py bfloat16 300 2>&1 | grep -v Warning | tee "$OUT/restore_cost.txt" | tee -a "$log"
  prefix_levels prefix_1_new_1 1
  [ -d _base ] && base_levels prefix_1_base_1 1
  ;;
*)
  echo "usage: bash bench/sessions/session38.sh a|b" >&2; exit 2 ;;
esac
