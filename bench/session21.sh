#!/usr/bin/env bash
# Session 21 (repo root on the device).
#   bash bench/session21.sh a   the residual units of a 16 x 25 step under Nsight Compute (speed of
#                               light, memory and L2, warp stalls, occupancy): 96 / 192 channels'
#                               one-kernel units and a 384-channel unit's cuDNN conv (bench/unit_ncu.py)
#   bash bench/session21.sh b   the one-kernel units with the weights (and windows) through tensor
#                               descriptors and the K loop warp-specialized (UNIT_CONV_SWEEP=tmaw):
#                               the sweep (8 compile shares first), the best tiles put in this copy,
#                               the units under ncu with their stall reasons, graph replay per step
#                               shape, sustained 256, the quick GPU checks
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
case "${1:-}" in
a)
  stamp "ncu: the units at 16 x 25, dilation 9"
  python3 bench/unit_ncu.py 96,192,384 >/dev/null 2>&1  # compile and autotune outside the profiler
  timeout 400 ncu --clock-control none -k regex:'_unit_conv|sm90|xmma|implicit|conv' --launch-skip 0 --launch-count 12 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Chart --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
    python3 bench/unit_ncu.py 96,192,384 2>&1 | tee "$OUT/unit_ncu.txt" | grep -E "^  [a-zA-Z_].*\(|Duration|Throughput|Busy|Hit Rate|Registers|Achieved Occ|Shared Memory Config|Stall|Warp Cycles Per Issued|Issue Slots|L2 Cache Throughput|DRAM Through|Memory Throughput" | tee -a "$log"
  ;;
b)
  export UNIT_CONV_SWEEP=tmaw
  stamp "compile the sweep's tilings in 8 shares"
  for i in 0 1 2 3 4 5 6 7; do timeout 200 python3 bench/unit_conv.py 96,192 bfloat16 --compile-only $i/8 > "$OUT/compile$i.txt" 2>&1 & done; wait
  grep -h "compiled" "$OUT"/compile*.txt | tee -a "$log"; cat "$OUT"/compile*.txt > "$OUT/compile.txt"; rm -f "$OUT"/compile[0-7].txt
  stamp "the sweep: today's tiles and the descriptor tilings, us per unit at 16 x 25"
  timeout 150 python3 bench/unit_conv.py 96,192 bfloat16 --tiles-out "$OUT/unit_tiles.json" 2>&1 | tee "$OUT/unit_conv.txt" | tee -a "$log"
  python3 bench/put_tiles.py code2wav/kernels/unit_conv.py ConvTiles "$OUT/unit_tiles.json" | tee -a "$log"
  stamp "ncu: the units with the sweep's tiles, stall reasons"
  stalls=$(for s in barrier long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle lg_throttle no_instruction dispatch_stall membar sleeping selected not_selected branch_resolving drain misc tex_throttle; do printf "smsp__average_warps_issue_stalled_%s_per_issue_active.ratio," $s; done)
  timeout 100 ncu --clock-control none -k regex:'_unit_conv' --launch-count 4 --section SpeedOfLight --section Occupancy --section LaunchStats \
    --metrics "${stalls}sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum,l1tex__t_bytes.sum" \
    python3 bench/unit_ncu.py 96,192 2>&1 | tee "$OUT/unit_ncu.txt" | grep -E "^  _unit|Duration|Registers Per|Achieved Occ|gmma|issue_stalled|bytes.sum" | tee -a "$log"
  stamp "graph replay per step shape with the sweep's tiles"
  timeout 150 python3 bench/profile_step.py bfloat16 channels_last 2>&1 | tee "$OUT/profile.txt" | grep -A9 "eager ms" | tee -a "$log"
  stamp "sustained 256 with the sweep's tiles"
  timeout 90 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 256 --seconds 3 --out "$OUT/swept" 2>&1 \
    | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/swept.txt" | grep -A2 "^mode" | tee -a "$log"
  rm -f "$OUT/swept/plot.png"
  ;;
c)
  stamp "the Hopper unit vs the Triton unit, per dilation and shape"
  timeout 150 python3 bench/unit_wgmma.py 96 2>&1 | tee "$OUT/unit_wgmma.txt" | tee -a "$log"
  stamp "graph replay per step shape: default vs unit_wgmma"
  timeout 120 python3 bench/profile_step.py bfloat16 channels_last,channels_last-unitwgmma=1 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
  for run in default: wgmma:"--set layers.unit_wgmma=true"; do
    stamp "sustained 1 / 64 / 256: ${run%%:*}"
    timeout 110 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --seconds 3 ${run#*:} --out "$OUT/${run%%:*}" 2>&1 \
      | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/${run%%:*}.txt" | grep -A4 "^mode" | tee -a "$log"
    rm -f "$OUT/${run%%:*}/plot.png"
  done
  ;;
d)
  for sweep in tmaw-only ws-only; do
    export UNIT_CONV_SWEEP=$sweep
    stamp "192 channels, $sweep: compile the sweep's tilings in 8 shares"
    for i in 0 1 2 3 4 5 6 7; do timeout 200 python3 bench/unit_conv.py 192 bfloat16 --compile-only $i/8 > "$OUT/compile$i.txt" 2>&1 & done; wait
    grep -h "compiled" "$OUT"/compile*.txt | tee -a "$log"; rm -f "$OUT"/compile[0-7].txt
    stamp "192 channels, $sweep: the sweep"
    timeout 150 python3 bench/unit_conv.py 192 bfloat16 > "$OUT/unit_conv_$sweep.txt" 2>&1; echo "exit status $?" >> "$OUT/unit_conv_$sweep.txt"
    tail -n 25 "$OUT/unit_conv_$sweep.txt" | tee -a "$log"
  done
  ;;
e)
  stamp "the Hopper unit (A rows in 16-byte loads, moved into the operand layout within each warp) vs the Triton unit"
  timeout 150 python3 bench/unit_wgmma.py 96 2>&1 | tee "$OUT/unit_wgmma.txt" | tee -a "$log"
  stamp "graph replay per step shape: default vs the Hopper unit from 100k samples"
  timeout 120 python3 bench/profile_step.py bfloat16 channels_last,channels_last-unitwgmma=100000 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
  for run in default: wgmma:"--set layers.unit_wgmma_rows=100000"; do
    stamp "sustained 1 / 64 / 256: ${run%%:*}"
    timeout 110 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --seconds 3 ${run#*:} --out "$OUT/${run%%:*}" 2>&1 \
      | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/${run%%:*}.txt" | grep -A4 "^mode" | tee -a "$log"
    rm -f "$OUT/${run%%:*}/plot.png"
  done
  ;;
f)
  stamp "the Hopper unit, one step's MMAs in flight while the next step's are issued, vs the Triton unit"
  timeout 60 python3 bench/unit_wgmma.py 96 2>&1 | tee "$OUT/unit_wgmma.txt" | tee -a "$log"
  stamp "graph replay per step shape: default vs the Hopper unit from 100k samples"
  timeout 75 python3 bench/profile_step.py bfloat16 channels_last,channels_last-unitwgmma=100000 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
  ;;
*) echo "usage: bash bench/session21.sh a|b|c|d|e|f" >&2; exit 2 ;;
esac
stamp "done"
