#!/usr/bin/env bash
# Session 23 (repo root on the device).
#   bash bench/sessions/session23.sh a   a few-row step's transformer layers as one persistent kernel each
#                               (kernels/layer.py, LayerChoices.layer_kernel_rows): both ways' outputs
#                               and the front pass's replay per shape (bench/layer_kernel.py), graph
#                               replay per step shape default vs layer_kernel_rows=0, sustained 1 / 64
#                               / 256 both ways (ran at 3cb714e; the kernel and bench/layer_kernel.py were
#                               reverted since, they are at 28d6792)
#   bash bench/sessions/session23.sh b   this session's host-path changes: a lone stream's first packet back to
#                               back, before (ab_old/, 210e2a6) and after, alternating; sustained 1 / 64
#                               / 256 both ways; the quick GPU checks in what time is left
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
case "${1:-}" in
a)
  stamp "the layer kernel against separate launches: outputs, pools, the front pass replayed"
  timeout 150 python3 bench/layer_kernel.py bfloat16 1x1,16x1,1x25,32x1 2>&1 | tee "$OUT/layer_kernel.txt" | tail -9 | tee -a "$log"
  timeout 60 python3 bench/layer_kernel.py float32 1x1,4x4 2>&1 | tee "$OUT/layer_kernel_fp32.txt" | tail -5 | tee -a "$log"
  stamp "graph replay per step shape: default (layer kernel) vs layer_kernel_rows=0"
  timeout 150 python3 bench/profile_step.py bfloat16 channels_last,channels_last-layer=0 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
  sustained_levels default
  sustained_levels layer0 --set layers.layer_kernel_rows=0
  ;;
b)
  # ab_old/: the tree before this session's host-path changes (git archive 210e2a6), carried
  # untracked for this call; each pair runs on the same machine start, alternating.
  for i in 1 2 3; do
    stamp "a lone stream's first packet, back to back: host path before (210e2a6), run $i"
    (cd ab_old && PYTHONPATH=$PWD:/tmp/site FIRST_PACKET_PAUSE_MS=0 timeout 90 python3 bench/first_packet.py 300 2>&1 | tee "$OUT/first_packet_old$i.txt" | tail -13 | tee -a "$log")
    stamp "the same, this tree, run $i"
    FIRST_PACKET_PAUSE_MS=0 timeout 90 python3 bench/first_packet.py 300 2>&1 | tee "$OUT/first_packet_new$i.txt" | tail -13 | tee -a "$log"
  done
  sustained_levels default
  stamp "sustained 1 / 64 / 256: before (210e2a6)"
  (cd ab_old && PYTHONPATH=$PWD:/tmp/site timeout 110 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --seconds 3 --out "$OUT/old" 2>&1 \
    | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/old.txt" | grep -A4 "^mode" | tee -a "$log")
  rm -f "$OUT/old/plot.png"
  stamp "quick GPU checks"
  timeout $((560 - (SECONDS - T0))) python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt" | grep -E "PASS|FAIL|dB|ok" | tee -a "$log"
  ;;
*) echo "usage: bash bench/sessions/session23.sh a|b"; exit 2 ;;
esac
stamp done
