#!/usr/bin/env bash
# Everything the H200 run does, in one call: checks, offline and streaming benchmarks.
# Usage (device machine, repo root): bash bench/gpu.sh [quick]
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-bench-out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then  # qwen-tts-compat (the official decoder) travels as a wheel
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
export CODE2WAV_CACHE=/tmp/code2wav-cache
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
git log -1 --format='commit %H %cd' 2>/dev/null || true
[ "${1:-}" = stream ] || python3 bench/gpu_check.py 2>&1 | tee "$OUT/gpu_check.txt"
[ "${1:-}" = profile ] && { python3 bench/profile_step.py bfloat16 2>&1 | tee "$OUT/profile.txt"; exit 0; }
if [ "${1:-}" = stream ]; then  # streaming bench, then the bf16 offline comparison
  python3 -m code2wav.bench --levels 1,4,16,64,256 --frames 101 --out "$OUT" 2>&1 | tee "$OUT/bench.txt"
  python3 bench/offline.py --device cuda --dtypes bfloat16 --batches 1,16,64 --frames 125 --repeat 2 2>&1 | tee "$OUT/offline.txt"
  tail -n 30 "$OUT/bench.txt"; tail -n 4 "$OUT/offline.txt"; exit 0
fi
if [ "${1:-}" = quick ]; then
  python3 -m code2wav.bench --levels 1,16,64 --modes exact-graph,exact-eager,windowed --frames 51 --out "$OUT" 2>&1 | tee "$OUT/bench.txt"
else
  python3 bench/profile_step.py bfloat16 2>&1 | tee "$OUT/profile.txt"
  python3 bench/offline.py --device cuda --dtypes float32,bfloat16 --batches 1,16,64 --frames 125 --json "$OUT/offline.json" 2>&1 | tee "$OUT/offline.txt"
  python3 -m code2wav.bench --levels 1,4,16,64,256 --frames 101 --prefix 0,72 --out "$OUT" 2>&1 | tee "$OUT/bench.txt"
fi
echo "=== summary ==="
grep -E "^(PASS|FAIL|SUMMARY|INFO)" "$OUT/gpu_check.txt"
[ -f "$OUT/offline.txt" ] && tail -n 7 "$OUT/offline.txt"
grep -A9 "eager ms" "$OUT/profile.txt" 2>/dev/null | head -9
tail -n 45 "$OUT/bench.txt"
