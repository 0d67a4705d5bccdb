#!/usr/bin/env bash
# Session 22 (repo root on the device).
#   bash bench/sessions/session22.sh a   a step's attention as one kernel a layer (kernels/attention.py,
#                               LayerChoices.attention_frames): the quick GPU checks, graph replay per
#                               step shape and the eager steps' kernels (default vs attention_frames=0),
#                               the 1 x 1 step layer by layer, a lone stream's first packet back to back,
#                               sustained 1 / 64 / 256 both ways (call 1 at 4777390; call 2 at the next
#                               commit: the history written back from registers, 8 warps; Triton's
#                               cache kept for call 3: it came back too large, 18 MB)
#   bash bench/sessions/session22.sh b   (call 3) the RoPE angles computed in the attention kernel (no tables):
#                               the quick GPU checks, graph replay default vs attention_frames=0, the
#                               1 x 1 step layer by layer, a lone stream's first packet back to back,
#                               sustained 1 / 64 / 256 at the default
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
case "${1:-}" in
a)
  stamp "quick GPU checks"
  timeout 200 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt" | grep -E "PASS|FAIL|dB|ok" | tee -a "$log"
  stamp "graph replay per step shape: default (attention kernel) vs attention_frames=0"
  timeout 150 python3 bench/profile_step.py bfloat16 channels_last,channels_last-attn=0 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
  stamp "the 1 x 1 and 16 x 25 steps layer by layer"
  timeout 120 python3 bench/layer_times.py bfloat16 1x1,16x25 2>&1 | tee "$OUT/layer_times.txt" | grep -E "^===|^pre_transformer|^by kind|^sum" | tee -a "$log"
  stamp "a lone stream's first packet, back to back"
  FIRST_PACKET_PAUSE_MS=0 timeout 120 python3 bench/first_packet.py 300 2>&1 | tee "$OUT/first_packet.txt" | tail -14 | tee -a "$log"
  sustained_levels default
  sustained_levels attn0 --set layers.attention_frames=0
  keep_triton_cache
  ;;
b)
  stamp "quick GPU checks"
  timeout 200 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt" | grep -E "PASS|FAIL|dB|ok" | tee -a "$log"
  stamp "graph replay per step shape: default (attention kernel) vs attention_frames=0"
  timeout 150 python3 bench/profile_step.py bfloat16 channels_last,channels_last-attn=0 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
  stamp "the 1 x 1 step layer by layer"
  timeout 120 python3 bench/layer_times.py bfloat16 1x1 2>&1 | tee "$OUT/layer_times.txt" | grep -E "^===|^pre_transformer|^by kind|^sum" | tee -a "$log"
  stamp "a lone stream's first packet, back to back"
  FIRST_PACKET_PAUSE_MS=0 timeout 120 python3 bench/first_packet.py 300 2>&1 | tee "$OUT/first_packet.txt" | tail -14 | tee -a "$log"
  sustained_levels default
  ;;
*) echo "usage: bash bench/sessions/session22.sh a|b"; exit 2 ;;
esac
stamp done
