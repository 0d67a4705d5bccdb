#!/usr/bin/env bash
# Session 15, GPU call 1 (repo root on the device): a residual unit as one kernel
# (kernels/unit_conv.py). Its tiles swept per width (compiled in 8 parallel shares first), the
# best tiles written to $OUT/unit_conv_tiles.json and put in this copy's TILES; graph replay per
# step shape with the units as one kernel in every step vs the default; the GPU checks' SNR
# (quick); sustained load at 1 / 256 streams both ways.
source bench/device_env.sh
log="$OUT/log.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
echo "=== compile the sweep (8 shares)" | tee -a "$log"
for i in 0 1 2 3 4 5 6 7; do timeout 240 python3 bench/unit_conv.py 96,192,384 bfloat16 --compile-only $i/8 >"$OUT/compile$i.txt" 2>&1 & done; wait
cat "$OUT"/compile*.txt | grep -v Warning | tail -n 12 | tee -a "$log"; rm -f "$OUT"/compile*.txt
echo "=== the sweep and the unit both ways" | tee -a "$log"
timeout 200 python3 bench/unit_conv.py 96,192,384 bfloat16 --tiles-out "$OUT/unit_conv_tiles.json" 2>&1 | grep -v Warning | tee "$OUT/unit_conv.txt" | tee -a "$log"
python3 - "$OUT/unit_conv_tiles.json" <<'PY' | tee -a "$log"
import json, re, sys
tiles = json.load(open(sys.argv[1]))
src = open("code2wav/kernels/unit_conv.py").read()
line = "TILES: dict[int, ConvTiles] = {" + ", ".join(f"{c}: ConvTiles({', '.join(map(repr, t))})" for c, t in tiles.items()) + "}"
open("code2wav/kernels/unit_conv.py", "w").write(re.sub(r"^TILES: dict\[int, ConvTiles\] = .*$", line, src, flags=re.M))
print("this copy's", line)
PY
echo "=== graph replay per shape: default, units as one kernel" | tee -a "$log"
timeout 200 python3 bench/profile_step.py bfloat16 channels_last,channels_last-unitconv=1 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
echo "=== GPU checks (quick)" | tee -a "$log"
timeout 120 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt" | grep -E "^(PASS|FAIL|SUMMARY)" | tee -a "$log"
echo "=== sustained: default, then units as one kernel from 4096 samples" | tee -a "$log"
for set in layers.unit_conv_rows=0 layers.unit_conv_rows=4096; do
  timeout 100 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,256 --seconds 3 --set $set \
    --out "$OUT/sus_${set#*=}" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/sus_${set#*=}.txt" | grep -A4 "^mode" | tee -a "$log"
done
