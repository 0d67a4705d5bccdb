#!/usr/bin/env bash
# Everything the H200 run does, in one call: checks, offline and streaming benchmarks.
# Usage (device machine, repo root): bash bench/gpu.sh [quick|stream|profile|perf|final|service|offline64]
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-bench-out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then  # qwen-tts-compat (the official decoder) travels as a wheel
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
export CODE2WAV_CACHE=/tmp/code2wav-cache
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
git log -1 --format='commit %H %cd' 2>/dev/null || true
if [ "${1:-}" = service ]; then  # the service end to end vs in-process, same levels, same budget
  python3 -m code2wav serve --device cuda --dtype bfloat16 --max-streams 64 --log-level warning >"$OUT/serve.log" 2>&1 &
  SERVER=$!
  get() { python3 -c "import sys, httpx; r = httpx.get('http://127.0.0.1:8091' + sys.argv[1]); r.raise_for_status(); print(r.text)" "$1"; }
  for _ in $(seq 300); do get /health >/dev/null 2>&1 && break; sleep 1; done
  get /health
  python3 -m code2wav bench --server http://127.0.0.1:8091 --levels 1,64 --frames 101 --out "$OUT/service" 2>&1 | tee "$OUT/service.txt"
  python3 -m code2wav loadtest --server http://127.0.0.1:8091 --streams 64 --seconds 10 2>&1 | tee "$OUT/loadtest.txt"
  get /metrics | grep -E "^code2wav_(graph|steps|errors|pool)" | tee "$OUT/metrics.txt"
  kill $SERVER; wait $SERVER 2>/dev/null
  python3 -m code2wav bench --modes exact-graph --levels 1,64 --frames 101 --out "$OUT/inprocess" 2>&1 | tee "$OUT/inprocess.txt"
  echo "=== service ==="; tail -n 4 "$OUT/service.txt"; tail -n 3 "$OUT/loadtest.txt"; echo "=== in-process ==="; tail -n 4 "$OUT/inprocess.txt"
  exit 0
fi
if [ "${1:-}" = perf ]; then  # correctness, step profile (both weight layouts), exact-graph at two step budgets
  timeout 200 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt"
  timeout 200 python3 bench/profile_step.py bfloat16 2>&1 | tee "$OUT/profile.txt"
  for budget in 128 512; do
    timeout 150 python3 -m code2wav.bench --modes exact-graph --levels 1,16,64,256 --frames 101 --max-batch-frames $budget --out "$OUT/budget$budget" 2>&1 | tee "$OUT/bench$budget.txt"
  done
  echo "=== summary ==="; grep -E "^(PASS|FAIL|SUMMARY|INFO)" "$OUT/gpu_check.txt"; grep -B1 -A8 "eager ms" "$OUT/profile.txt"; tail -n 5 "$OUT"/bench*.txt
  exit 0
fi
if [ "${1:-}" = final ]; then  # what fits one call: checks, step profile, exact-graph bench (prefix 0/72), the service
  timeout 100 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt"
  timeout 100 python3 bench/profile_step.py bfloat16 2>&1 | tee "$OUT/profile.txt"
  timeout 110 python3 -m code2wav.bench --modes exact-graph --levels 1,16,64,256 --frames 101 --prefix 0,72 --out "$OUT/bench" 2>&1 | tee "$OUT/bench.txt"
  ( python3 -m code2wav serve --device cuda --dtype bfloat16 --max-streams 64 --log-level warning >"$OUT/serve.log" 2>&1 & echo $! >/tmp/server.pid )
  get() { python3 -c "import sys, httpx; r = httpx.get('http://127.0.0.1:8091' + sys.argv[1]); r.raise_for_status(); print(r.text)" "$1"; }
  for _ in $(seq 90); do get /health >/dev/null 2>&1 && break; sleep 1; done
  timeout 40 python3 -m code2wav bench --server http://127.0.0.1:8091 --levels 1,64 --frames 101 --out "$OUT/service" 2>&1 | tee "$OUT/service.txt"
  kill "$(cat /tmp/server.pid)"
  echo "=== summary ==="; grep -E "^(PASS|FAIL|SUMMARY|INFO)" "$OUT/gpu_check.txt"; grep -B1 -A6 "eager ms" "$OUT/profile.txt"
  tail -n 9 "$OUT/bench.txt"; tail -n 3 "$OUT/service.txt"
  exit 0
fi
[ "${1:-}" = offline64 ] && { python3 bench/offline.py --device cuda --dtypes float32 --batches 64 --frames 125 --repeat 2 --no-autotune 2>&1 | tee "$OUT/offline_fp32_b64.txt"; exit 0; }
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
