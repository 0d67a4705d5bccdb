#!/usr/bin/env bash
# Session 21 (repo root on the device).
#   bash bench/sessions/session21.sh a   the residual units of a 16 x 25 step under Nsight Compute (speed of
#                               light, memory and L2, warp stalls, occupancy): 96 / 192 channels'
#                               one-kernel units and a 384-channel unit's cuDNN conv (bench/unit_ncu.py)
#   bash bench/sessions/session21.sh b   the one-kernel units with the weights (and windows) through tensor
#                               descriptors and the K loop warp-specialized (UNIT_CONV_SWEEP=tmaw):
#                               the sweep (8 compile shares first), the best tiles put in this copy,
#                               the units under ncu with their stall reasons, graph replay per step
#                               shape, sustained 256
#   bash bench/sessions/session21.sh c   (at 4cf9007) the 96-channel unit as a Hopper kernel in Gluon
#                               (kernels/unit_wgmma.py: weights held in shared memory, each tap's rows
#                               loaded into the MMAs' register operand) against the Triton unit
#                               (bench/unit_wgmma.py: per dilation and shape, time, the outputs'
#                               difference, SNR vs float32); graph replay per step shape and sustained
#                               1 / 64 / 256, default vs layers.unit_wgmma=true
#   bash bench/sessions/session21.sh d   the 192-channel sweep call b could not finish, in two processes (the
#                               descriptor tilings, then the warp-specialized ones); not run: no
#                               machine was lent when it was asked for
#   bash bench/sessions/session21.sh e   (at 6685d63) c again, the rows loaded 16 bytes a thread and moved into
#                               the operand layout within each warp, the kernel from 100k samples
#   bash bench/sessions/session21.sh f   (at 63b6659) e with one step's MMAs in flight; no sustained load
# The Hopper kernel, its knob and bench/unit_wgmma.py were reverted after f (BENCHMARKS.md).
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
hopper_unit() {  # c, e, f: $1 profile_step's suffix for the Hopper unit, $2 its --set for sustained load ("": none)
  stamp "the Hopper unit vs the Triton unit, per dilation and shape"
  timeout 150 python3 bench/unit_wgmma.py 96 2>&1 | tee "$OUT/unit_wgmma.txt" | tee -a "$log"
  stamp "graph replay per step shape: default vs $1"
  timeout 120 python3 bench/profile_step.py bfloat16 channels_last,channels_last-$1 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
  [ -n "$2" ] || return 0
  for run in default: wgmma:"--set $2"; do
    stamp "sustained 1 / 64 / 256: ${run%%:*}"
    timeout 110 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --seconds 3 ${run#*:} --out "$OUT/${run%%:*}" 2>&1 \
      | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/${run%%:*}.txt" | grep -A4 "^mode" | tee -a "$log"
    rm -f "$OUT/${run%%:*}/plot.png"
  done
}
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
c) hopper_unit unitwgmma=1 layers.unit_wgmma=true ;;
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
e) hopper_unit unitwgmma=100000 layers.unit_wgmma_rows=100000 ;;
f) hopper_unit unitwgmma=100000 "" ;;
*) echo "usage: bash bench/sessions/session21.sh a|b|c|d|e|f" >&2; exit 2 ;;
esac
stamp "done"
