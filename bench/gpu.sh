#!/usr/bin/env bash
# The H200 runs, one mode per `device` call (each fits the 10-minute call limit; timings from
# 2026-11-29 runs in brackets). Run from the repo root on the device machine, carrying .whl:
#   bash bench/gpu.sh [final]  checks (quick), step profile, exact-graph under sustained load
#                              with and without a 72-frame prefix                     [~450 s]
#   bash bench/gpu.sh check    every GPU check, incl. graph == eager for every bucket and a
#                              10-minute offline decode; graph memory by budget; prefix 72 [~550 s]
#   bash bench/gpu.sh stream   all four modes side by side (prefix 0 and 72), bf16 offline
#                              ours vs official
#   bash bench/gpu.sh perf     quick checks, step profile, exact-graph at budgets 128 and 512,
#                              prefix 72 at c=16/256                              [~500 s]
#   bash bench/gpu.sh service  the service (bench --server, load test) vs in-process   [~160 s]
#   bash bench/gpu.sh service-quick  the service at c=1/64, prefix 0 and 72             [~120 s]
#   bash bench/gpu.sh next     host-side ceiling; bf16 step with every cuDNN algorithm timed;
#                              fp16 under sustained load (capture alone takes ~90 s)  [~450 s]
#   bash bench/gpu.sh session4 quick checks; sustained load (budget 256, prefix 0/72; budget 512
#                              with expandable segments); the burst workload            [~500 s]
#   bash bench/gpu.sh group    sustained load with --no-group-by-size and with it (default) [~280 s]
#   bash bench/gpu.sh capacity 256 / 1024 / 2048 talkers at 2x real time: decoder-added stalls
#                              (the pool of 2048 slots is ~5 GiB)                       [~140 s]
#   bash bench/gpu.sh session5 quick checks; the fused residual-unit tail per block (time, tile
#                              sweep, bf16 SNR); step profile with and without it; sustained load
#   bash bench/gpu.sh budget   sustained load at budgets 512 and 640 (graph pool vs 1 GiB)  [~400 s]
#   bash bench/gpu.sh split    sustained load with and without --split-lone-group (c=4..256)  [~350 s]
#   bash bench/gpu.sh convs [BxT,...]  the k=7 convs dilated and folded to undilated (7, 1) convs,
#                              cuDNN's default and full algorithm search (no graphs)   [~20 s a shape]
#   bash bench/gpu.sh session6 quick checks; step profile with the dilated convs folded (default)
#                              and none (run 4 of session 6 also timed all: fold=all);
#                              sustained load at the defaults, prefix 0 and 72           [~320 s]
#   bash bench/gpu.sh lowrate  quick checks (bf16 SNR with the low-rate stages in float32); sustained
#                              load at c=1/64/256                                       [~180 s]
#   bash bench/gpu.sh session7 quick checks; a lone stream's first packet leg by leg; sustained load
#                              at c=1/16/64/256                                        [~330 s]
#   bash bench/gpu.sh targets  every GPU-engine target: quick checks, the first packet leg by leg,
#                              exact-graph vs windowed under sustained load, prefix 0/72  [~290 s at
#                              a45a5df; the windowed levels now run twice (warm-eager)]
#   bash bench/gpu.sh convt    A/B of the ConvTranspose layers as GEMMs: checks, step profiles,
#                              sustained load at c=1/256 with and without (not yet run; ~500 s estimated)
#   bash bench/gpu.sh session9 the first packet leg by leg; step-shape A/B of small convs as GEMMs and
#                              of unit tails filling the SMs; quick checks
#   bash bench/gpu.sh session9b the few-row float32 kernel (bench/skinny.py), quick checks, the first packet,
#                              sustained load prefix 0/72, windowed at c=16, step A/B of the kernel  [~500 s]
#   bash bench/gpu.sh offline64  fp32 batch-64 offline, ours vs official, cuDNN heuristics [~60 s]
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-bench-out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then  # qwen-tts-compat and the serve stack travel as wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
export CODE2WAV_CACHE=/tmp/code2wav-cache
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'

get() { python3 -c "import sys, httpx; r = httpx.get('http://127.0.0.1:8091' + sys.argv[1]); r.raise_for_status(); print(r.text)" "$1"; }
start_server() {  # bf16, graphs, 64 streams, the defaults otherwise
  python3 -m code2wav serve --device cuda --dtype bfloat16 --max-streams 64 --log-level warning >"$OUT/serve.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 300); do get /health >/dev/null 2>&1 && break; sleep 1; done
}
service_bench() { timeout 60 python3 -m code2wav bench --server http://127.0.0.1:8091 --levels 1,64 --frames 101 --out "$OUT/service" 2>&1 | tee "$OUT/service.txt"; }
checks_summary() { grep -E "^(PASS|FAIL|SUMMARY|INFO)" "$OUT/gpu_check.txt"; }

case "${1:-final}" in
final)
  timeout 200 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt"
  timeout 80 python3 bench/profile_step.py bfloat16 2>&1 | tee "$OUT/profile.txt"
  timeout 220 python3 -m code2wav.bench --modes exact-graph --levels 1,16,64,256 --prefix 0,72 --seconds 3 --out /tmp/bench 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/sustained.txt"
  echo "=== summary ==="; checks_summary; grep -B1 -A9 "eager ms" "$OUT/profile.txt"; grep -- "^---" "$OUT/profile.txt"
  grep -A10 "^mode" "$OUT/sustained.txt"
  ;;
check)
  timeout 280 python3 bench/gpu_check.py 2>&1 | tee "$OUT/gpu_check.txt"
  timeout 200 python3 bench/graph_memory.py 2>&1 | tee "$OUT/graph_memory.txt"
  timeout 90 python3 -m code2wav.bench --modes exact-graph --levels 16,256 --frames 101 --prefix 72 --out "$OUT/prefix" 2>&1 | tee "$OUT/bench_prefix.txt"
  echo "=== summary ==="; checks_summary; cat "$OUT/graph_memory.txt"; tail -n 3 "$OUT/bench_prefix.txt"
  ;;
stream)
  timeout 400 python3 -m code2wav.bench --levels 1,4,16,64,256 --frames 101 --prefix 0,72 --out "$OUT" 2>&1 | tee "$OUT/bench.txt"
  timeout 150 python3 bench/offline.py --device cuda --dtypes bfloat16 --batches 1,16,64 --frames 125 --repeat 2 2>&1 | tee "$OUT/offline.txt"
  echo "=== summary ==="; tail -n 42 "$OUT/bench.txt"; tail -n 4 "$OUT/offline.txt"
  ;;
perf)
  timeout 200 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt"
  timeout 150 python3 bench/profile_step.py bfloat16 2>&1 | tee "$OUT/profile.txt"
  for budget in 128 512; do
    timeout 110 python3 -m code2wav.bench --modes exact-graph --levels 1,16,64,256 --frames 101 --max-batch-frames $budget --out "$OUT/budget$budget" 2>&1 | tee "$OUT/bench$budget.txt"
  done
  timeout 90 python3 -m code2wav.bench --modes exact-graph --levels 16,256 --frames 101 --prefix 72 --out "$OUT/prefix" 2>&1 | tee "$OUT/bench_prefix.txt"
  echo "=== summary ==="; checks_summary; grep -B1 -A8 "eager ms" "$OUT/profile.txt"; grep -E -- "^(---|A/B)" "$OUT/profile.txt"
  tail -n 5 "$OUT"/bench*.txt
  ;;
service)
  start_server; get /health; service_bench
  python3 -m code2wav loadtest --server http://127.0.0.1:8091 --streams 64 --seconds 10 2>&1 | tee "$OUT/loadtest.txt"
  get /metrics | grep -E "^code2wav_(graph|steps|errors|pool)" | tee "$OUT/metrics.txt"
  kill "$SERVER"; wait "$SERVER" 2>/dev/null
  python3 -m code2wav bench --modes exact-graph --levels 1,64 --frames 101 --out "$OUT/inprocess" 2>&1 | tee "$OUT/inprocess.txt"
  echo "=== service ==="; tail -n 3 "$OUT/service.txt"; tail -n 3 "$OUT/loadtest.txt"; echo "=== in-process ==="; tail -n 4 "$OUT/inprocess.txt"
  ;;
service-quick)
  start_server
  timeout 60 python3 -m code2wav bench --server http://127.0.0.1:8091 --levels 1,64 --frames 101 --prefix 0,72 --out "$OUT/service" 2>&1 | tee "$OUT/service.txt"
  kill "$SERVER"; echo "=== service ==="; tail -n 6 "$OUT/service.txt"
  ;;
next)  # left unmeasured in session 4: fp16 under sustained load at c=1/256 with continuous steps, every cuDNN algorithm
  timeout 30 python3 bench/host_overhead.py cuda 1,16,64,256 2 2>&1 | tee "$OUT/host.txt"
  timeout 220 python3 bench/profile_step.py bfloat16 channels_last 0 2>&1 | tee "$OUT/profile_limit0.txt"
  timeout 200 python3 -m code2wav.bench --modes exact-graph --levels 1,64,256 --seconds 3 --dtype float16 --out /tmp/fp16 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/sustained_fp16.txt"
  echo "=== summary ==="; cat "$OUT/host.txt"; grep -A9 "eager ms" "$OUT/profile_limit0.txt"; grep -A8 "^mode" "$OUT/sustained_fp16.txt"
  ;;
capacity)  # real-time streams one GPU holds: talkers at 2x real time, listeners playing; stalls the decoder adds
  timeout 300 python3 -m code2wav.bench --modes exact-graph --levels 256,1024,2048 --pace 2 --seconds 12 --stagger-ms 1 --out /tmp/cap 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/capacity.txt"
  echo "=== summary ==="; grep -A6 "^mode" "$OUT/capacity.txt"
  ;;
group)  # A/B of StreamEngine(group_by_size=True): same sustained workload, one process each
  for g in "" "--group-by-size"; do
    timeout 200 python3 -m code2wav.bench --modes exact-graph --levels 1,16,64,256 --prefix 0,72 --seconds 3 $g --out /tmp/g 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee -a "$OUT/group_ab.txt"
  done
  echo "=== summary ==="; grep -A10 "^mode" "$OUT/group_ab.txt"
  ;;
session4)  # continuous steps: checks, sustained load at budgets 256 and 512, the burst for comparison
  timeout 200 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt"
  timeout 200 python3 -m code2wav.bench --modes exact-graph --levels 1,16,64,256 --prefix 0,72 --seconds 3 --out /tmp/sustained 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/sustained.txt"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 160 python3 -m code2wav.bench --modes exact-graph --levels 64,256 --seconds 3 --max-batch-frames 512 --out /tmp/sustained_512 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/sustained_512.txt"
  timeout 130 python3 -m code2wav.bench --modes exact-graph --levels 1,16,64,256 --frames 101 --out /tmp/burst 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/burst.txt"
  echo "=== summary ==="; checks_summary
  for f in sustained sustained_512 burst; do echo "-- $f"; grep -A10 "^mode" "$OUT/$f.txt"; done
  ;;
session5)
  timeout 200 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt"
  timeout 100 python3 bench/unit_tail.py 16x25 2>&1 | tee "$OUT/unit_tail.txt"
  timeout 170 python3 bench/profile_step.py bfloat16 channels_last,channels_last-unfused 2>&1 | tee "$OUT/profile.txt"
  timeout 200 python3 -m code2wav.bench --modes exact-graph --levels 1,16,64,256 --prefix 0,72 --seconds 3 --out /tmp/bench 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/sustained.txt"
  echo "=== summary ==="; checks_summary; cat "$OUT/unit_tail.txt"; grep -B1 -A9 "eager ms" "$OUT/profile.txt"; grep -- "^---" "$OUT/profile.txt"
  grep -A10 "^mode" "$OUT/sustained.txt"
  ;;
budget)  # left unmeasured in session 5: do bigger forwards still fit the 1 GiB graph pool target?
  for b in 512 640; do
    timeout 190 python3 -m code2wav.bench --modes exact-graph --levels 64,256 --prefix 0,72 --seconds 3 --max-batch-frames $b --out /tmp/b$b 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/budget$b.txt"
  done
  echo "=== summary ==="; for b in 512 640; do grep -A5 "^mode" "$OUT/budget$b.txt"; done
  ;;
split)  # A/B of StreamEngine(split_lone_group=True): at budget 480, c=16 ran 12 % below budget 256 (one group, GPU idle between)
  for g in "" "--split-lone-group"; do
    timeout 170 python3 -m code2wav.bench --modes exact-graph --levels 4,16,64,256 --seconds 3 $g --out /tmp/s 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee -a "$OUT/split_ab.txt"
  done
  echo "=== summary ==="; grep -A6 "^mode" "$OUT/split_ab.txt"
  ;;
convs)  # is an undilated form of the dilated convs, or cuDNN's full search, faster? (bench/conv_forms.py)
  for shape in $(echo "${2:-16x25}" | tr , " "); do  # rows x frames, comma-separated
    timeout 250 python3 bench/conv_forms.py "$shape" 2>&1 | tee -a "$OUT/conv_forms.txt"
  done
  ;;
session6)  # the folded convs: checks, step A/B (folded vs dilated), sustained load at the defaults
  timeout 200 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt"
  timeout 260 python3 bench/profile_step.py bfloat16 channels_last,channels_last-fold=none 2>&1 | tee "$OUT/profile.txt"
  timeout 220 python3 -m code2wav.bench --modes exact-graph --levels 1,16,64,256 --prefix 0,72 --seconds 3 --out /tmp/bench 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/sustained.txt"
  echo "=== summary ==="; checks_summary; grep -B1 -A9 "eager ms" "$OUT/profile.txt"; grep -- "^---" "$OUT/profile.txt"
  grep -A10 "^mode" "$OUT/sustained.txt"
  ;;
lowrate)  # the low-rate stages in float32 (TF32) under bf16: checks (SNR), sustained load
  timeout 200 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt"
  timeout 150 python3 -m code2wav.bench --modes exact-graph --levels 1,64,256 --seconds 3 --out /tmp/bench 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/sustained.txt"
  echo "=== summary ==="; checks_summary; grep -A6 "^mode" "$OUT/sustained.txt"
  ;;
session7)  # the default (float32 low-rate stages) after one-copy graph inputs and divisor channel tiles
  timeout 200 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt"
  timeout 90 python3 bench/first_packet.py 300 2>&1 | tee "$OUT/first_packet.txt"
  timeout 200 python3 -m code2wav.bench --modes exact-graph --levels 1,16,64,256 --seconds 3 --out /tmp/bench 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/sustained.txt"
  echo "=== summary ==="; checks_summary; tail -n 8 "$OUT/first_packet.txt"; grep -A6 "^mode" "$OUT/sustained.txt"
  ;;
targets)  # every issue-4 target in one call: checks (SNR, exactness), first packet leg by leg,
  #          exact-graph and windowed side by side under sustained load, prefix 0 and 72
  timeout 200 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt"
  timeout 90 python3 bench/first_packet.py 300 2>&1 | tee "$OUT/first_packet.txt"
  timeout 380 python3 -m code2wav.bench --modes exact-graph,windowed --levels 1,16,64,256 --prefix 0,72 --seconds 3 --out "$OUT/bench" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/sustained.txt"
  echo "=== summary ==="; checks_summary; tail -n 8 "$OUT/first_packet.txt"; grep -A18 "^mode" "$OUT/sustained.txt"
  ;;
convt)  # A/B of CausalConvTranspose1d.as_gemm: graph replay per step shape and eager profiles,
  #        sustained load with and without it (one machine start), the checks (3c covers it)
  timeout 200 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt"
  timeout 170 python3 bench/profile_step.py bfloat16 channels_last-convt=cudnn,channels_last 2>&1 | tee "$OUT/profile.txt"
  for g in cudnn gemm; do
    echo "--convt $g" | tee -a "$OUT/sustained_ab.txt"
    timeout 130 python3 -m code2wav.bench --modes exact-graph --levels 1,256 --seconds 5 --convt $g --out /tmp/convt 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee -a "$OUT/sustained_ab.txt"
  done
  echo "=== summary ==="; checks_summary; grep -B1 -A9 "eager ms" "$OUT/profile.txt"; grep -A4 "^mode" "$OUT/sustained_ab.txt"
  ;;
session8)  # ConvTranspose as GEMMs (now the default), one host staging per group; first chunks gathering (A/B of the wait)
  timeout 200 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt"
  timeout 90 python3 bench/first_packet.py 300 2>&1 | tee "$OUT/first_packet.txt"
  timeout 300 python3 -m code2wav.bench --modes exact-graph --levels 1,16,64,256 --seconds 3 --first-chunk-wait-ms 0,5,10 --out "$OUT/bench" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/sustained.txt"
  echo "=== summary ==="; checks_summary; tail -n 8 "$OUT/first_packet.txt"; grep -A14 "^mode" "$OUT/sustained.txt"
  ;;
final8)  # session 8's shipped defaults (GEMM ConvTranspose, first chunks gather only while saturated, 5 ms):
  #       checks, first packet leg by leg, the wait A/B with and without a prefix, the windowed baseline at c=16
  timeout 200 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt"
  timeout 60 python3 bench/first_packet.py 300 2>&1 | tee "$OUT/first_packet.txt"
  timeout 330 python3 -m code2wav.bench --modes exact-graph --levels 1,16,64,256 --prefix 0,72 --seconds 3 --first-chunk-wait-ms 0,5,10 --out "$OUT/bench" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/sustained.txt"
  timeout 60 python3 -m code2wav.bench --modes windowed --levels 16 --seconds 3 --out "$OUT/windowed" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/windowed.txt"
  echo "=== summary ==="; checks_summary; tail -n 8 "$OUT/first_packet.txt"; grep -A26 "^mode" "$OUT/sustained.txt"; grep -A3 "^mode" "$OUT/windowed.txt"
  ;;
last8)  # session 8's last call: the host path (staging reused, events reused, codes checked in numpy, the saturation
  #      scan bounded) leg by leg, the wait A/B at c=1/64/256 with and without a prefix, then the checks
  timeout 60 python3 bench/first_packet.py 300 2>&1 | tee "$OUT/first_packet.txt"
  timeout 240 python3 -m code2wav.bench --modes exact-graph --levels 1,64,256 --prefix 0,72 --seconds 3 --first-chunk-wait-ms 0,5 --out "$OUT/bench" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/sustained.txt"
  echo "=== summary ==="; tail -n 13 "$OUT/first_packet.txt"; grep -A14 "^mode" "$OUT/sustained.txt"
  timeout 200 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt"
  checks_summary
  ;;
session9)  # session 9, run 1: the first packet leg by leg (worker woken directly; small convs as GEMMs; unit tails
  #          filling the SMs), the step-shape A/B of the last two, then the checks
  timeout 60 python3 bench/first_packet.py 300 2>&1 | tee "$OUT/first_packet.txt"
  timeout 260 python3 bench/profile_step.py bfloat16 channels_last,channels_last-unitfill=0-gemmrows=0,channels_last-gemmrows=256 2>&1 | tee "$OUT/profile.txt"
  echo "=== summary ==="; tail -n 13 "$OUT/first_packet.txt"; grep -B1 -A9 "eager ms" "$OUT/profile.txt"; grep -- "^---" "$OUT/profile.txt"
  timeout 200 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt"
  checks_summary
  ;;
session9b)  # session 9, run 2 (the last ~9 minutes of device time): the few-row float32 kernel checked and timed
  #           (off for the rest if it fails or loses), the checks, the first packet leg by leg, sustained load with
  #           and without a prefix, the windowed baseline at c=16, then the step-shape A/B with and without it
  if ! timeout 70 python3 bench/skinny.py 2>&1 | tee "$OUT/skinny.txt" || ! grep -q "^PASS skinny" "$OUT/skinny.txt"; then
    export CODE2WAV_SKINNY=0; echo "skinny products OFF for the rest of this run"
  fi
  timeout 150 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt"
  timeout 50 python3 bench/first_packet.py 300 2>&1 | tee "$OUT/first_packet.txt"
  timeout 200 python3 -m code2wav.bench --modes exact-graph --levels 1,16,64,256 --prefix 0,72 --seconds 3 --out "$OUT/bench" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/sustained.txt"
  timeout 45 python3 -m code2wav.bench --modes windowed --levels 16 --seconds 3 --out "$OUT/windowed" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/windowed.txt"
  echo "=== summary ==="; grep -E "^(PASS|FAIL|sum|skinny)" "$OUT/skinny.txt"; checks_summary; tail -n 13 "$OUT/first_packet.txt"
  grep -A14 "^mode" "$OUT/sustained.txt"; grep -A3 "^mode" "$OUT/windowed.txt"
  timeout 100 python3 bench/profile_step.py bfloat16 channels_last,channels_last-skinny=0 2>&1 | tee "$OUT/profile.txt"
  grep -B1 -A9 "eager ms" "$OUT/profile.txt"; grep -- "^---" "$OUT/profile.txt"
  ;;
offline64)
  python3 bench/offline.py --device cuda --dtypes float32 --batches 64 --frames 125 --repeat 2 --no-autotune 2>&1 | tee "$OUT/offline_fp32_b64.txt"
  ;;
*)
  echo "unknown mode ${1}; see the header of $0" >&2; exit 2
  ;;
esac
