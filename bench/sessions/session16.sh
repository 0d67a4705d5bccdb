#!/usr/bin/env bash
# Session 16, GPU call 1 (repo root on the device): the quick GPU checks at the default with room to
# finish (session 15 cut them at 200 s, before the float16 and cuDNN-ConvTranspose checks), then
# sustained load at 1 / 256 streams with the defaults and with float16 low-rate stages
# (low_rate_dtype=float16) on the same start. Triton's cache goes back as $OUT/triton.tgz so a later
# call can carry it (.tcache/triton.tgz; device_env.sh unpacks it).
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
stamp "GPU checks (quick)"
timeout 290 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt" | grep -E "^(PASS|FAIL|SUMMARY)" | tee -a "$log"
for run in default:"" fp16:"--set low_rate_dtype=float16"; do
  name=${run%%:*}; stamp "sustained 1 / 256, $name"
  # shellcheck disable=SC2086
  timeout 140 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,256 --seconds 3 ${run#*:} \
    --out "$OUT/$name" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/$name.txt" | grep -A3 "^mode" | tee -a "$log"
done
stamp "done"
keep_triton_cache | tee -a "$log"
