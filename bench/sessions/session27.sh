#!/usr/bin/env bash
# Session 27 (repo root on the device).
#   bash bench/sessions/session27.sh a   the priority stream as on main (EngineConfig.priority_step_frames, off by
#                               default): bench/priority_check.py (float32 exactness with it and without,
#                               many streams at once), then the record alternating with and without it, twice
#   bash bench/sessions/session27.sh b   the one-kernel units with a K step of a whole or half tap (two power-of-two
#                               products a step): the sweep (UNIT_CONV_SWEEP=ksteps python3 bench/unit_conv.py,
#                               after 8 compile shares), its best tiles put in this copy, the record alternating
#                               with them and with today's tiles, twice
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
case "${1:-}" in
a)
  stamp "the priority stream: exactness and use (float32, many streams at once)"
  timeout 200 python3 bench/priority_check.py 24 2>&1 | tee "$OUT/priority_check.txt" | tee -a "$log"
  for i in 1 2; do
    sustained_levels "priority_$i" --set priority_step_frames=16
    sustained_levels "one_stream_$i"
  done
  keep_triton_cache
  ;;
b)
  stamp "compile the K-step sweep: 8 shares side by side"
  for i in 0 1 2 3 4 5 6 7; do
    UNIT_CONV_SWEEP=ksteps timeout 240 python3 bench/unit_conv.py 96,192 bfloat16 --compile-only "$i/8" > "$OUT/compile_$i.txt" 2>&1 &
  done
  wait
  grep -h "compiled\|Error" "$OUT"/compile_*.txt | tee -a "$log"
  rm -f "$OUT"/compile_*.txt
  stamp "the sweep: today's tiles and K steps of a whole or half tap"
  UNIT_CONV_SWEEP=ksteps timeout 200 python3 bench/unit_conv.py 96,192 bfloat16 --tiles-out "$OUT/unit_tiles.json" 2>&1 \
    | grep -v Warning | tee "$OUT/unit_conv.txt" | tee -a "$log"
  cp code2wav/kernels/unit_conv.py /tmp/unit_conv_today.py
  python3 bench/put_tiles.py code2wav/kernels/unit_conv.py ConvTiles "$OUT/unit_tiles.json" | tee -a "$log"
  cp code2wav/kernels/unit_conv.py /tmp/unit_conv_new.py
  for i in 1 2; do
    cp /tmp/unit_conv_new.py code2wav/kernels/unit_conv.py; sustained_levels "ksteps_$i"
    cp /tmp/unit_conv_today.py code2wav/kernels/unit_conv.py; sustained_levels "today_$i"
  done
  keep_triton_cache
  ;;
*) echo "usage: bash bench/sessions/session27.sh a|b" >&2; exit 2 ;;
esac
stamp "done"
