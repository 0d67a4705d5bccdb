#!/usr/bin/env bash
# Session 14, GPU call 1 (repo root on the device): where a 16 x 25 and a 1 x 1 step's time goes
# layer by layer (cuDNN's default search and the full one), the residual-unit tail's tile sweep at
# every block's width (the tail now fuses the 384- and 768-channel units too), the output conv's
# sweep, the dilated convs' two forms, and graph replay per step shape at this commit.
source bench/device_env.sh
log="$OUT/log.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
echo "=== layer times (default search)" | tee -a "$log"
timeout 120 python3 bench/layer_times.py bfloat16 16x25,1x1 2>&1 | grep -v Warning | tee "$OUT/layer_times.txt" | tee -a "$log"
echo "=== layer times (cuDNN benchmark_limit 0: every algorithm)" | tee -a "$log"
timeout 120 python3 bench/layer_times.py bfloat16 16x25 0 2>&1 | grep -v Warning | tee "$OUT/layer_times_all.txt" | tee -a "$log"
echo "=== unit tail sweep" | tee -a "$log"
for i in 0 1 2 3 4 5 6 7; do timeout 150 python3 bench/unit_tail.py 16x25 bfloat16 --compile-only $i/8 >"/tmp/compile$i.txt" 2>&1 & done; wait
cat /tmp/compile*.txt | tail -n 8 | tee -a "$log"
timeout 150 python3 bench/unit_tail.py 16x25 bfloat16 2>&1 | tee "$OUT/unit_tail.txt" | tee -a "$log"
echo "=== output conv sweep" | tee -a "$log"
timeout 60 python3 bench/mono_conv.py 16x25 bfloat16 2>&1 | tee "$OUT/mono_conv.txt" | tee -a "$log"
echo "=== dilated conv forms" | tee -a "$log"
timeout 100 python3 bench/conv_forms.py 16x25 bfloat16 2>&1 | tee "$OUT/conv_forms.txt" | tee -a "$log"
echo "=== graph replay per shape" | tee -a "$log"
timeout 150 python3 bench/profile_step.py bfloat16 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
