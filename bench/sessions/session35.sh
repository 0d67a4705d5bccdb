#!/usr/bin/env bash
# Session 35 (repo root on the device): the 192-channel units as one CUDA C++ kernel with streamed
# weights (kernels/unit_streamed.py, layers.unit_streamed_rows).
#   bash bench/sessions/session35.sh a   the kernel alone against the concat + Triton unit (bench/unit_streamed.py:
#                               checks, both stagings, timings), then the record at 1 and 256
#                               streams alternating the default and unit_streamed_rows=1
#   bash bench/sessions/session35.sh c   call 2: the kernel's checks and timings (the pool rows loaded in batches,
#                               the Triton unit with channels-last weights as the decoder's), the
#                               record alternating the new default (unit_streamed_rows=16384) and 0,
#                               then the quick GPU checks
#   bash bench/sessions/session35.sh d   (not run in session 35: no device time left) a cached voice's first
#                               packet against a fresh stream's, timed and profiled
#                               (bench/prefix_first_packet.py), then the record's prefix form at one stream
#   bash bench/sessions/session35.sh b   every GPU check (bench/gpu_check.py, 400 s), then the record at the default
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
short() { stamp "sustained 1 / 256: $1"; local name=$1; shift
  timeout 170 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,256 --seconds 3 "$@" --out "$OUT/$name" 2>&1 \
    | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/$name.txt" | grep -A3 "^mode" | tee -a "$log"; rm -f "$OUT/$name/plot.png"; }
case "${1:-}" in
a)
  stamp "the 192-channel streamed unit (bench/unit_streamed.py)"
  timeout 150 python3 bench/unit_streamed.py "${SHAPES:-1x1,16x1,1x25,16x25}" 5 2>&1 | grep -v Warning | tee "$OUT/unit_streamed.txt" | tee -a "$log"
  grep -q "^PASS" "$OUT/unit_streamed.txt" || exit 1
  short default_1
  short streamed_1 --set layers.unit_streamed_rows=1
  short default_2
  short streamed_2 --set layers.unit_streamed_rows=1
  keep_triton_cache
  ;;
c)
  stamp "the 192-channel streamed unit (bench/unit_streamed.py)"
  timeout 120 python3 bench/unit_streamed.py 1x1,16x1,1x25,4x25,16x25 5 2>&1 | grep -v Warning | tee "$OUT/unit_streamed.txt" | tee -a "$log"
  grep -q "^PASS" "$OUT/unit_streamed.txt" || exit 1
  short default_1
  short triton_1 --set layers.unit_streamed_rows=0
  short default_2
  stamp "the quick GPU checks"
  timeout 170 python3 bench/gpu_check.py --quick 2>&1 | grep -v Warning | tee "$OUT/gpu_check.txt" | grep -E "FAIL|SUMMARY|unit_streamed|bf16 stream" | tee -a "$log"
  keep_triton_cache
  ;;
d)
  stamp "a cached voice's first packet (bench/prefix_first_packet.py)"
  timeout 240 python3 bench/prefix_first_packet.py cuda 100 2>&1 | grep -v Warning | tee "$OUT/prefix_first_packet.txt" | grep "first push" | tee -a "$log"
  stamp "sustained 1: no prefix, a cached 200-frame prefix"
  timeout 170 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1 --prefix 0,200 --voices 8 --seconds 3 \
    --set prefix_cache_bytes=1000000000 --out "$OUT/prefix" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/prefix.txt" | grep -A3 "^mode" | tee -a "$log"
  rm -f "$OUT/prefix/plot.png"
  ;;
b)
  stamp "every GPU check"
  timeout 400 python3 bench/gpu_check.py 2>&1 | grep -v Warning | tee "$OUT/gpu_check.txt" | grep -E "FAIL|SUMMARY" | tee -a "$log"
  sustained_levels default_1
  ;;
*)
  echo "usage: bash bench/sessions/session35.sh a|b|c|d" >&2; exit 2 ;;
esac
