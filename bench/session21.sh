#!/usr/bin/env bash
# Session 21 (repo root on the device).
#   bash bench/session21.sh a   the residual units of a 16 x 25 step under Nsight Compute (speed of
#                               light, memory and L2, warp stalls, occupancy): 96 / 192 channels'
#                               one-kernel units and a 384-channel unit's cuDNN conv (bench/unit_ncu.py)
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
esac
