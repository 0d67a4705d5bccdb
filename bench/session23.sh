#!/usr/bin/env bash
# Session 23 (repo root on the device).
#   bash bench/session23.sh a   a few-row step's transformer layers as one persistent kernel each
#                               (kernels/layer.py, LayerChoices.layer_kernel_rows): both ways' outputs
#                               and the front pass's replay per shape (bench/layer_kernel.py), graph
#                               replay per step shape default vs layer_kernel_rows=0, sustained 1 / 64
#                               / 256 both ways
#   bash bench/session23.sh b   the quick GPU checks, a lone stream's first packet back to back
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
sustained() {  # $1 the run's name, then code2wav.bench's extra arguments
  local name=$1; shift
  stamp "sustained 1 / 64 / 256: $name"
  timeout 110 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --seconds 3 "$@" --out "$OUT/$name" 2>&1 \
    | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/$name.txt" | grep -A4 "^mode" | tee -a "$log"
  rm -f "$OUT/$name/plot.png"
}
case "${1:-}" in
a)
  stamp "the layer kernel against separate launches: outputs, pools, the front pass replayed"
  timeout 150 python3 bench/layer_kernel.py bfloat16 1x1,16x1,1x25,32x1 2>&1 | tee "$OUT/layer_kernel.txt" | tail -9 | tee -a "$log"
  timeout 60 python3 bench/layer_kernel.py float32 1x1,4x4 2>&1 | tee "$OUT/layer_kernel_fp32.txt" | tail -5 | tee -a "$log"
  stamp "graph replay per step shape: default (layer kernel) vs layer_kernel_rows=0"
  timeout 150 python3 bench/profile_step.py bfloat16 channels_last,channels_last-layer=0 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
  sustained default
  sustained layer0 --set layers.layer_kernel_rows=0
  ;;
b)
  stamp "a lone stream's first packet, back to back"
  FIRST_PACKET_PAUSE_MS=0 timeout 120 python3 bench/first_packet.py 300 2>&1 | tee "$OUT/first_packet.txt" | tail -14 | tee -a "$log"
  stamp "quick GPU checks"
  timeout 420 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt" | grep -E "PASS|FAIL|dB|ok" | tee -a "$log"
  ;;
*) echo "usage: bash bench/session23.sh a|b"; exit 2 ;;
esac
stamp done
