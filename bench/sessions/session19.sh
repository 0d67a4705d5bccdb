#!/usr/bin/env bash
# Session 19 (repo root on the device).
#   bash bench/sessions/session19.sh a   half products through kernels/skinny.py (LayerChoices.skinny_half):
#                               each product shape in float32 / float16 / bfloat16 against cuBLAS and
#                               the gated down projection; graph replay per step shape both ways; the
#                               quick GPU checks (the other setting's SNR among them); sustained 1 / 64 /
#                               256 both ways, one start
#   bash bench/sessions/session19.sh b   a lone stream's first packet leg by leg, after a pause and back to
#                               back; sustained 1 / 64 / 256 (at 54aa27d this call also ran
#                               bench/zeroing_ab.py, the A/B of freed slots zeroed in batches, since
#                               reverted: BENCHMARKS.md)
#   bash bench/sessions/session19.sh c   the one-kernel units' inputs through tensor descriptors (ConvTiles.tma):
#                               the sweep of those tilings beside today's tiles (compiled in 8 shares
#                               first), the winners put in this copy, then graph replay per step shape
#                               and sustained 256 streams with them, and the quick GPU checks
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
left() { echo $(($1 - (SECONDS - T0))); }  # seconds left of a $1-second call
case "${1:-}" in
a)
  for dtype in float32 float16 bfloat16; do
    stamp "few-row products, $dtype: cuBLAS vs kernels/skinny.py"
    timeout 120 python3 bench/skinny.py $dtype 2>&1 | grep -v "^TILE" | tee -a "$OUT/skinny.txt" | tee -a "$log"
  done
  stamp "graph replay per step shape: the default vs skinny_half"
  timeout 150 python3 bench/profile_step.py bfloat16 channels_last,channels_last-skinnyhalf=1 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
  stamp "GPU checks (quick)"
  timeout 150 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt" | grep -E "^(PASS|FAIL|SUMMARY)" | tee -a "$log"
  for run in default: skinnyhalf:"--set layers.skinny_half=true"; do
    stamp "sustained 1 / 64 / 256: ${run%%:*}"
    timeout "$(left 590)" python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --seconds 3 ${run#*:} --out "$OUT/${run%%:*}" 2>&1 \
      | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/${run%%:*}.txt" | grep -A4 "^mode" | tee -a "$log"
    rm -f "$OUT/${run%%:*}/plot.png"
  done
  ;;
b)
  for pause in 2 0; do
    stamp "a lone stream's first packet, leg by leg, pause $pause ms"
    FIRST_PACKET_PAUSE_MS=$pause timeout 90 python3 bench/first_packet.py 300 2>&1 | tee "$OUT/first_packet_pause$pause.txt" | tail -n 13 | tee -a "$log"
  done
  stamp "sustained 1 / 64 / 256, the defaults"
  timeout "$(left 590)" python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --seconds 3 --out "$OUT/default" 2>&1 \
    | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/default.txt" | grep -A4 "^mode" | tee -a "$log"
  rm -f "$OUT/default/plot.png"
  ;;
c)
  export UNIT_CONV_SWEEP=tma
  stamp "compile the sweep's tilings in 8 shares"
  for i in 0 1 2 3 4 5 6 7; do timeout 240 python3 bench/unit_conv.py 96,192 bfloat16 --compile-only $i/8 > "$OUT/compile$i.txt" 2>&1 & done; wait
  grep -h "compiled" "$OUT"/compile*.txt | tee -a "$log"; cat "$OUT"/compile*.txt > "$OUT/compile.txt"; rm -f "$OUT"/compile[0-7].txt
  stamp "the sweep: today's tiles and the tma tilings, us per unit at 16 x 25"
  timeout 200 python3 bench/unit_conv.py 96,192 bfloat16 --tiles-out "$OUT/unit_tiles.json" 2>&1 | tee "$OUT/unit_conv.txt" | tee -a "$log"
  python3 bench/put_tiles.py code2wav/kernels/unit_conv.py ConvTiles "$OUT/unit_tiles.json" | tee -a "$log"
  stamp "graph replay per step shape with the sweep's tiles"
  timeout 150 python3 bench/profile_step.py bfloat16 channels_last 2>&1 | tee "$OUT/profile.txt" | grep -A9 "eager ms" | tee -a "$log"
  stamp "sustained 256 with the sweep's tiles"
  timeout 90 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 256 --seconds 3 --out "$OUT/swept" 2>&1 \
    | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/swept.txt" | grep -A2 "^mode" | tee -a "$log"
  rm -f "$OUT/swept/plot.png"
  stamp "GPU checks (quick) with the sweep's tiles"
  timeout "$(left 590)" python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt" | grep -E "^(PASS|FAIL|SUMMARY)" | tee -a "$log"
  ;;
*) echo "usage: bash bench/sessions/session19.sh a|b|c" >&2; exit 2 ;;
esac
stamp "done"
