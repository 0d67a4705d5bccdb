#!/usr/bin/env bash
# Session 18 (repo root on the device; carry .whl: the serve stack).
#   bash bench/sessions/session18.sh a   what session 17 left unmeasured at HEAD, on a fresh machine: serve
#                               from a cold start to the first audio (fresh, restart), the low-rate
#                               probe's cost, the quick GPU checks, sustained 1 / 64 / 256 (the
#                               overflow check's sums in every step), a lone stream's first packet
#                               leg by leg, and the 16 x 25 and 1 x 1 steps layer by layer
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
left() { echo $(($1 - (SECONDS - T0))); }  # seconds left of a $1-second call
case "${1:-}" in
a)
  for name in fresh restart; do
    stamp "serve from a cold start to the first audio ($name)"
    COLD_START_UNTIL="first audio" timeout 100 python3 bench/cold_start.py serve --device cuda --dtype bfloat16 --max-streams 256 2>&1 \
      | grep -v '^{"' | tail -n 6 | tee -a "$log"
  done
  stamp "the low-rate probe's cost in a fresh process"
  timeout 60 python3 bench/probe_cost.py 2>&1 | tail -n 8 | tee -a "$log"
  stamp "GPU checks (quick)"
  timeout 200 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt" | grep -E "^(PASS|FAIL|SUMMARY)" | tee -a "$log"
  stamp "sustained 1 / 64 / 256, the defaults"
  timeout 160 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --seconds 3 --out "$OUT/default" 2>&1 \
    | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/default.txt" | grep -A4 "^mode" | tee -a "$log"
  rm -f "$OUT"/default/plot.png
  stamp "a lone stream's first packet, leg by leg"
  timeout 90 python3 bench/first_packet.py 300 2>&1 | tee "$OUT/first_packet.txt" | tail -n 16 | tee -a "$log"
  stamp "layer by layer, 16 x 25 and 1 x 1"
  timeout "$(left 590)" python3 bench/layer_times.py bfloat16 16x25,1x1 2>&1 | grep -v Warning | tee "$OUT/layer_times.txt" | grep -E "^(===|by kind|sum)" | tee -a "$log"
  ;;
*) echo "usage: bash bench/sessions/session18.sh a" >&2; exit 2 ;;
esac
stamp "done"
