#!/usr/bin/env bash
# Session 42, for the next call (repo root on the device; carry _base): call 3 (session42.sh) put
# a cached voice's extra first-packet time at 512 streams ramped in the worker's host time between
# a group being formed and its step being queued (grouped -> launched: 0.40 / 0.45 ms none, 0.89 /
# 1.07 ms cached), where restores past a step's 8 pairs went by a launch each, and on this
# project's CPU machine a restore that only lets go of the GIL (bench/service_host.py
# --restore-launches) costs the worker a long wait for it. Since then a step carries a restore
# pair a row: no restore launches on the worker. Here the legs (bench/ttfp_parts.py), none /
# cached / cached / none, one process each, alternating this tree and the one before the change:
#   _base (ignored; carry it): `mkdir _base && git archive 8283cbc code2wav | tar -x -C _base`.
# First bench/restore_cost.py (the pairs kernel bit for bit on the GPU, three cached streams in one
# step). `short`: then this tree, then _base (about 5 minutes); the default adds one more of each.
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
legs() {  # $1 name, $2 seconds it may take, $3 the tree whose code2wav runs (. or _base)
  local name=$1 limit=$2 tree=$3
  stamp "512 streams ramped, prefixes 0,200,200,0, legs of the first packet ($name, code2wav from $tree)"
  PYTHONPATH="$(cd "$tree" && pwd):/tmp/site" timeout "$limit" python3 bench/ttfp_parts.py -- --modes exact-graph --frames 101 --levels 512 \
    --chunks 1,4,8,16,25 --prefix 0,200,200,0 --voices 8 --seconds 3 --set prefix_cache_bytes=1000000000 --out "$OUT/$name" 2>&1 \
    | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/$name.txt" | grep -A6 "^mode\|^{" | cut -c1-400 | tee -a "$log"
  rm -f "$OUT/$name/plot.png"
}
[ -d _base/code2wav ] || { echo "no _base/code2wav: carry it" | tee -a "$log"; exit 1; }
stamp "the restore's cost; restored streams' audio bit for bit, three in one step's pairs among them (bench/restore_cost.py)"
timeout 90 python3 bench/restore_cost.py bfloat16 300 2>&1 | tee -a "$log"
legs new_1 240 .  # the first process on a machine also makes the embedded weights and compiles Triton's kernels
legs base_1 110 _base
if [ "${1:-}" != short ]; then
  legs new_2 110 .
  legs base_2 110 _base
fi
pack_out
