#!/usr/bin/env bash
# Session 25 (repo root on the device).
#   bash bench/sessions/session25.sh a   small steps' weights prefetched into L2 on a side branch of the graph
#                               (bench/l2_prefetch.py), cuBLAS or the skinny kernel for the half
#                               products; graph replay per shape with the small-step knobs: full convs
#                               as GEMMs up to 160 / 640 samples, the one-kernel unit from 700 samples
#   bash bench/sessions/session25.sh b   what fewer launches would buy small steps (bench/launch_budget.py); the
#                               bench's one stream with skinny_half off and on, alternating, twice
#   bash bench/sessions/session25.sh c   the one-frame step's norms, gate, GELU, layer scale and residual inside its
#                               products (skinny_half, now the default): launch_budget, graph replay per
#                               shape both ways, the quick GPU checks, the record (sustained 1 / 64 / 256)
#   bash bench/sessions/session25.sh d   the tree before that change (ab_old/, carried) and after, alternating
#                               processes: graph replay 1 x 1 and 16 x 25, then sustained 1 / 64 / 256
#   bash bench/sessions/session25.sh e   the record (sustained 1 / 64 / 256) in three processes, one start
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
case "${1:-}" in
a)
  stamp "weights prefetched into L2 ahead of their layers"
  timeout 280 python3 bench/l2_prefetch.py 1x1,16x1,1x25,16x25 1,2,4 200 2>&1 | tee "$OUT/l2_prefetch.txt" | tee -a "$log"
  stamp "graph replay per step shape: small-step knobs"
  timeout 200 python3 bench/profile_step.py bfloat16 channels_last,channels_last-gemmrows=160,channels_last-gemmrows=640,channels_last-unitconv=700 2>&1 \
    | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
  keep_triton_cache
  ;;
b)
  stamp "small steps with groups of short kernels cut"
  timeout 200 python3 bench/launch_budget.py 1x1,16x1,1x25 300 2>&1 | tee "$OUT/launch_budget.txt" | tee -a "$log"
  for i in 1 2; do
    for half in false true; do
      stamp "the bench's one stream, layers.skinny_half=$half ($i)"
      timeout 90 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1 --seconds 3 --set layers.skinny_half=$half \
        --out "$OUT/half_${half}_$i" 2>&1 | tr "\r" "\n" | grep -A2 "^mode" | tee -a "$log"
      rm -f "$OUT/half_${half}_$i/plot.png"
    done
  done
  ;;
c)
  stamp "small steps with groups of short kernels cut (default: the kernels' own epilogues and prologues)"
  timeout 150 python3 bench/launch_budget.py 1x1,16x1,1x25 300 2>&1 | tee "$OUT/launch_budget.txt" | tee -a "$log"
  stamp "graph replay per step shape: the default vs skinny_half off"
  timeout 120 python3 bench/profile_step.py bfloat16 channels_last,channels_last-skinnyhalf=0 2>&1 \
    | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
  stamp "quick GPU checks"
  timeout 240 python3 bench/gpu_check.py --quick > "$OUT/gpu_check.txt" 2>&1
  grep -E "^(PASS|FAIL|SUMMARY)" "$OUT/gpu_check.txt" | tee -a "$log"
  sustained_levels default
  stamp "a lone stream's first packet, back to back, the bench's streams (default engine)"
  FIRST_PACKET_PAUSE_MS=0 FIRST_PACKET_TAIL=4 FIRST_PACKET_ENGINE=default timeout 90 python3 bench/first_packet.py 200 2>&1 \
    | tee "$OUT/first_packet.txt" | tail -14 | tee -a "$log"
  ;;
d)
  # ab_old/: the tree before the change (git archive 0e6ef83 code2wav bench), carried; alternating processes
  for i in 1 2; do
    for tree in old new; do
      stamp "graph replay 1 x 1 and 16 x 25, $tree tree ($i)"
      if [ $tree = old ]; then dir=ab_old; else dir=.; fi
      (cd $dir && PYTHONPATH=$PWD timeout 80 python3 bench/launch_budget.py 1x1,16x25 200) 2>&1 | grep " x " | tee -a "$log"
    done
  done
  for i in 1 2; do
    for tree in old new; do
      if [ $tree = old ]; then dir=ab_old; else dir=.; fi
      stamp "sustained 1 / 64 / 256, $tree tree ($i)"
      (cd $dir && PYTHONPATH=$PWD timeout 110 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --seconds 3 --out "$OUT/${tree}_$i") 2>&1 \
        | tr "\r" "\n" | grep -A4 "^mode" | tee -a "$log"
      rm -f "$OUT/${tree}_$i/plot.png"
    done
  done
  ;;
e)
  for i in 1 2 3; do sustained_levels "record_$i"; done
  ;;
*) echo "usage: bash bench/sessions/session25.sh a|b|c|d|e" >&2; exit 2 ;;
esac
stamp "done"
