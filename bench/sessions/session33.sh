#!/usr/bin/env bash
# Session 33 (repo root on the device): where the 96-channel window unit's time goes.
#   bash bench/sessions/session33.sh a   the window unit under ncu at 16 x 25, d = 1 and 9 (bench/window_ncu.py):
#                               throughput, stall reasons, shared-memory wavefronts and bank
#                               conflicts, the tensor pipe, and stall samples per SASS line;
#                               then every GPU check (bench/gpu_check.py)
#   bash bench/sessions/session33.sh b   the window unit with the next window's fill between the conv's taps,
#                               its warpgroups a half tile apart (ping-pong) or in step: checks and
#                               timings (bench/unit_window.py), ncu at d=9, the record for both
#   bash bench/sessions/session33.sh c   the same for a warp-specialized window unit (a third warpgroup fills
#                               the windows) against the one filling them between the taps
#   bash bench/sessions/session33.sh d   every GPU check (400 s; call 4 ran it under 280 s, too few on a fresh
#                               machine), then the record at the default (the warp-specialized unit alone)
#   bash bench/sessions/session33.sh e   (not yet run) one or two warpgroups filling the window unit's windows
#                               (layers.window_producers): checks, timings, the record alternating
#   (b and c ran A/B forms selected by environment variables that were dropped with the losers:
#   BENCHMARKS.md, session 33)
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
stalls=$(for s in barrier long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle lg_throttle no_instruction dispatch_stall membar sleeping selected not_selected branch_resolving drain misc tex_throttle; do printf "smsp__average_warps_issue_stalled_%s_per_issue_active.ratio," $s; done)
window_ncu() {  # $1: dilation
  timeout 150 ncu --clock-control none -k regex:unit_window --launch-skip 1 --launch-count 1 --set full --import-source yes \
    --metrics "${stalls}sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed_pipe_xu.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg" \
    -o "$OUT/window_d$1" python3 bench/window_ncu.py "$1" 2>&1 | tail -3 | tee -a "$log"
  ncu --import "$OUT/window_d$1.ncu-rep" --print-details all > "$OUT/window_d$1.txt" 2>&1
  grep -E "Duration|Throughput|Busy|Registers Per|Achieved Occ|gmma|issue_stalled|bank_conflicts|wavefronts|pipe_xu|inst_executed.sum|cycles_elapsed|Warp Cycles Per Issued|Issue Slots|No Eligible" "$OUT/window_d$1.txt" | tee -a "$log"
  ncu --import "$OUT/window_d$1.ncu-rep" --page source --csv --print-source sass > "$OUT/window_d$1_sass.csv" 2>&1
  wc -c "$OUT/window_d$1_sass.csv" | tee -a "$log"
}
# The window unit's checks and timings, ncu at d=9, then the record: the form on ($1), with the
# environment variable $3 at 0 (the form off, $2), on again.
window_ab() {
  stamp "the window unit, $1 against $2 (bench/unit_window.py)"
  timeout 150 python3 bench/unit_window.py 1x1,16x1,1x25,16x25,20x25 2>&1 | grep -v Warning | tee "$OUT/unit_window.txt" | tee -a "$log"
  grep -q "^PASS" "$OUT/unit_window.txt" || exit 1
  stamp "the window unit ($1) under ncu, d=9"
  window_ncu 9
  sustained_levels "$1_1"
  export "$3=0"; sustained_levels "$2_1"; unset "$3"
  sustained_levels "$1_2"
}
case "${1:-}" in
a)
  stamp "the window unit under ncu, d=9"
  window_ncu 9
  stamp "the window unit under ncu, d=1"
  window_ncu 1
  stamp "every GPU check"
  timeout 300 python3 bench/gpu_check.py 2>&1 | grep -v Warning | tee "$OUT/gpu_check.txt" | grep -E "FAIL|SUMMARY" | tee -a "$log"
  ;;
b) window_ab pingpong instep CODE2WAV_WINDOW_PINGPONG ;;
c) window_ab ws taps CODE2WAV_WINDOW_WS ;;
e)
  stamp "the window unit, one or two warpgroups filling its windows (bench/unit_window.py)"
  timeout 150 python3 bench/unit_window.py 1x1,16x1,1x25,16x25,20x25 2>&1 | grep -v Warning | tee "$OUT/unit_window.txt" | tee -a "$log"
  grep -q "^PASS" "$OUT/unit_window.txt" || exit 1
  sustained_levels one_1
  sustained_levels two_1 --set layers.window_producers=2
  sustained_levels one_2
  sustained_levels two_2 --set layers.window_producers=2
  ;;
d)
  stamp "every GPU check"
  timeout 400 python3 bench/gpu_check.py 2>&1 | grep -v Warning | tee "$OUT/gpu_check.txt" | grep -E "FAIL|SUMMARY" | tee -a "$log"
  sustained_levels default_1
  ;;
*)
  echo "usage: bash bench/sessions/session33.sh a|b|c|d|e" >&2; exit 2 ;;
esac
