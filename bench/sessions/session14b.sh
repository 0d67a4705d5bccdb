#!/usr/bin/env bash
# Session 14, GPU call 2 (repo root on the device): a step's time layer by layer with the GPU
# running it back to back (queued behind a sleep); the residual-unit tail's sweep with the
# early-residual and persistent forms, at 16 x 25 and at 1 x 1; the output conv's sweep after
# its one-reduction rewrite; graph replay per step shape, conv_fold dilated vs all.
source bench/device_env.sh
log="$OUT/log.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
echo "=== layer times" | tee -a "$log"
timeout 120 python3 bench/layer_times.py bfloat16 16x25,1x1 2>&1 | grep -v Warning | tee "$OUT/layer_times.txt" | tee -a "$log"
echo "=== unit tail sweeps" | tee -a "$log"
for shape in 16x25 1x1; do for i in 0 1 2 3 4 5 6 7; do
  timeout 200 python3 bench/unit_tail.py $shape bfloat16 --compile-only $i/8 >"/tmp/compile$shape$i.txt" 2>&1 &
done; done; wait
tail -q -n 1 /tmp/compile*.txt | sort | uniq -c | tee -a "$log"
for shape in 16x25 1x1; do timeout 150 python3 bench/unit_tail.py $shape bfloat16 2>&1 | tee "$OUT/unit_tail_$shape.txt" | tee -a "$log"; done
echo "=== output conv sweep" | tee -a "$log"
timeout 60 python3 bench/mono_conv.py 16x25 bfloat16 2>&1 | tee "$OUT/mono_conv.txt" | tee -a "$log"
echo "=== graph replay per shape: conv_fold dilated, all" | tee -a "$log"
timeout 240 python3 bench/profile_step.py bfloat16 channels_last,channels_last-fold=all 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
