#!/usr/bin/env bash
# Session 20 (repo root on the device).
#   bash bench/session20.sh a   Triton kernels launched with programmatic dependent launch
#                               (LayerChoices.pdl, kernels/pdl.py) or plainly: graph replay per step
#                               shape both ways (one process), the quick GPU checks (the other
#                               setting's fp32 stream vs float64 among them), a lone stream's first
#                               packet leg by leg back to back, sustained 1 / 64 / 256 both ways
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
left() { echo $(($1 - (SECONDS - T0))); }  # seconds left of a $1-second call
case "${1:-}" in
a)
  stamp "graph replay per step shape: the default (pdl) vs plain launches"
  timeout 150 python3 bench/profile_step.py bfloat16 channels_last,channels_last-pdl=0 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
  stamp "GPU checks (quick)"
  timeout 170 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt" | grep -E "^(PASS|FAIL|SUMMARY)" | tee -a "$log"
  stamp "a lone stream's first packet, leg by leg, back to back"
  FIRST_PACKET_PAUSE_MS=0 timeout 90 python3 bench/first_packet.py 300 2>&1 | tee "$OUT/first_packet.txt" | tail -n 13 | tee -a "$log"
  for run in default: plain:"--set layers.pdl=false"; do
    stamp "sustained 1 / 64 / 256: ${run%%:*}"
    timeout "$(left 590)" python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --seconds 3 ${run#*:} --out "$OUT/${run%%:*}" 2>&1 \
      | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/${run%%:*}.txt" | grep -A4 "^mode" | tee -a "$log"
    rm -f "$OUT/${run%%:*}/plot.png"
  done
  ;;
*) echo "usage: bash bench/session20.sh a" >&2; exit 2 ;;
esac
stamp "done"
