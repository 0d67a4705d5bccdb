#!/usr/bin/env bash
# Session 34 (repo root on the device): the 384-channel units' tail as one CUDA C++ kernel
# (kernels/tail_wide.py, layers.tail_wide_rows), and one or two warpgroups filling the window
# unit's windows (layers.window_producers).
#   bash bench/sessions/session34.sh a   the tail kernel alone against its three passes (bench/tail_wide.py:
#                               checks and timings at both tilings; then under ncu), then the record
#                               alternating the default and tail_wide_rows=1 at each tiling
#                               (call 1 ran an earlier form: the tail kernel's check and timings at
#                               128 rows, the window unit with one and two filling warpgroups
#                               (bench/unit_window.py), the record with window_producers=2 and without)
#   bash bench/sessions/session34.sh c   a short form of a (no ncu, 1 and 256 streams) for a call of ~5 minutes
#   bash bench/sessions/session34.sh b   every GPU check (bench/gpu_check.py, 400 s), then the record at the default
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
case "${1:-}" in
a)
  stamp "the 384-channel tail kernel (bench/tail_wide.py)"
  timeout 120 python3 bench/tail_wide.py 2>&1 | grep -v Warning | tee "$OUT/tail_wide.txt" | tee -a "$log"
  stamp "the tail kernel under ncu, 16 x 25, each tiling"
  timeout 120 ncu --clock-control none -k regex:tail_wide --launch-count 2 --set full --import-source yes -o "$OUT/tail_ncu" \
    python3 bench/tail_wide.py 16x25 1 2>&1 | tail -2 | tee -a "$log"
  ncu --import "$OUT/tail_ncu.ncu-rep" --print-details all > "$OUT/tail_ncu.txt" 2>&1
  grep -E "Duration|Throughput|Registers Per|Achieved Occ|Warp Cycles Per Issued|No Eligible|L2 Hit|Block Limit" "$OUT/tail_ncu.txt" | tee -a "$log"
  ncu --import "$OUT/tail_ncu.ncu-rep" --page source --csv --print-source sass > "$OUT/tail_ncu_sass.csv" 2>&1
  sustained_levels warmup
  sustained_levels default_1
  grep -q "^PASS" "$OUT/tail_wide.txt" && sustained_levels tail128_1 --set layers.tail_wide_rows=4096
  grep -q "^PASS" "$OUT/tail_wide.txt" && sustained_levels tail64_1 --set layers.tail_wide_rows=4096 --set layers.tail_wide_tile=64
  sustained_levels default_2
  keep_triton_cache
  ;;
c)
  # the short form of a for the little device time left: the kernel's checks and timings, the
  # faster tiling at 16 x 25 picked from them, the record at 1 and 256 streams alternating
  stamp "the 384-channel tail kernel (bench/tail_wide.py)"
  timeout 90 python3 bench/tail_wide.py 1x1,16x1,16x25 5 2>&1 | grep -v Warning | tee "$OUT/tail_wide.txt" | tee -a "$log"
  grep -q "^PASS" "$OUT/tail_wide.txt" || exit 1
  tile=$(python3 -c "import re, sys; l = [l for l in open(sys.argv[1]) if l.startswith(' 16 x 25 (+ 0)')][0]; t = re.findall(r'/ +([0-9.]+) \(', l); print(128 if float(t[0]) <= float(t[1]) else 64)" "$OUT/tail_wide.txt")
  stamp "tail_wide_tile=$tile"
  short() { stamp "sustained 1 / 256: $1"; local name=$1; shift
    timeout 170 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,256 --seconds 3 "$@" --out "$OUT/$name" 2>&1 \
      | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/$name.txt" | grep -A3 "^mode" | tee -a "$log"; rm -f "$OUT/$name/plot.png"; }
  short default_1
  short tail_1 --set layers.tail_wide_rows=4096 --set layers.tail_wide_tile=$tile
  short default_2
  ;;
b)
  stamp "every GPU check"
  timeout 400 python3 bench/gpu_check.py 2>&1 | grep -v Warning | tee "$OUT/gpu_check.txt" | grep -E "FAIL|SUMMARY" | tee -a "$log"
  sustained_levels default_1
  ;;
*)
  echo "usage: bash bench/sessions/session34.sh a|b" >&2; exit 2 ;;
esac
