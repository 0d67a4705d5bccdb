#!/usr/bin/env bash
# The GPU runs: one named run per `device` call, each short enough for one 10-minute call.
# Run from the repo root on the device machine, carrying .whl (the serve stack, qwen-tts-compat):
#   bash bench/gpu.sh check       every GPU check (exactness vs float64, graph == eager for every
#                                 captured shape, bf16/fp16 SNR, the kernels), then exact-graph under
#                                 sustained load at 1/16/64/256 streams: the record after a change
#   bash bench/gpu.sh sustained   exact-graph and windowed under sustained load at 1/16/64/256 streams,
#                                 with and without a 72-frame prefix; a lone stream's first packet leg by leg
#   bash bench/gpu.sh profile     eager vs graph replay per step shape, the top kernels of a large step
#   bash bench/gpu.sh service     the service (bench --server, a load test) against in-process
#   bash bench/gpu.sh fullload    the service from a cold start (spawn -> first audio), then at full load:
#                                 1, 4 x 16 and 4 x 64 WebSocket streams from 4 client processes,
#                                 prefix 0 and 200; then the same workload in-process
#   bash bench/gpu.sh serveprof   py-spy on the server process (bf16, graphs, 256 streams) under 4 x 64 and 8 x 32
#                                 WebSocket streams: each thread's samples and top functions, who holds
#                                 the GIL, one dump of all threads (carry .whl with py-spy's wheel)
#   bash bench/gpu.sh startup     where a start's time goes, phase by phase and graph by graph
#   bash bench/gpu.sh warm        graphs captured while serving: streams decoded meanwhile and after vs eager
#   bash bench/gpu.sh outstanding what session 12 left unmeasured, in one call: the warm-up check with both
#                                 halves (float32, cuDNN heuristics), the default serve (graphs captured
#                                 while serving) from its start to ready and then at full load (a connection
#                                 per stream and kept connections; 200-frame prefixes from 8 voices, the
#                                 server's prefix cache on), and the prefix cache in-process
#   bash bench/gpu.sh integrations  vLLM-Omni's and SGLang-Omni's own stages vs code2wav's, at the
#                                 stage interface (carry .whl with their wheels, qwen-tts-compat, msgspec,
#                                 msgpack, pyzmq)
#   bash bench/gpu.sh capacity    256 / 1024 / 2048 talkers at 2x real time: the stalls the decoder adds
#   bash bench/gpu.sh offline     whole-utterance decodes, ours vs the official decoder
#   bash bench/gpu.sh convtk      the decoder blocks' ConvTransposes as one kernel each (kernels/convt.py):
#                                 its tile sweep (compiled in 8 shares), the best tiles put in this copy,
#                                 graph replay per step shape both ways, sustained 1 / 256 both ways
#   bash bench/gpu.sh ab FIELD=VALUE [...]   A/B of engine knobs (EngineConfig fields, dotted for
#                                 sub-configs: layers.convt_gemm=false, schedule.first_chunk_wait=0):
#                                 sustained load at 1/64/256 streams with the defaults, then with them
# Figures go to BENCHMARKS.md with the command, commit, machine and date.
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'

get() { python3 -c "import sys, httpx; r = httpx.get('http://127.0.0.1:8091' + sys.argv[1]); r.raise_for_status(); print(r.text)" "$1"; }
ready() { get /health 2>/dev/null | python3 -c 'import json, sys; sys.exit(json.load(sys.stdin).get("graphs", {}).get("state", "ready") != "ready")'; }
start_server() {  # bf16, graphs, 64 streams, the defaults otherwise
  python3 -m code2wav serve --device cuda --dtype bfloat16 --max-streams 64 --log-level warning >"$OUT/serve.log" 2>&1 &
  SERVER=$!
  # until it answers with every graph in (it serves while they are captured: /health's graphs)
  for _ in $(seq 300); do ready && break; sleep 1; done
}
service_bench() { timeout 60 python3 -m code2wav bench --server http://127.0.0.1:8091 --levels 1,64 --frames 101 --out "$OUT/service" 2>&1 | tee "$OUT/service.txt"; }
checks_summary() { grep -E "^(PASS|FAIL|SUMMARY|INFO)" "$OUT/gpu_check.txt"; }

sustained() {  # $1: output name, the rest: bench options
  local name=$1; shift
  timeout 300 python3 -m code2wav.bench --modes exact-graph --frames 101 --seconds 3 --out "$OUT/$name" "$@" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/$name.txt"
}

until_streams() {  # until /health counts $1 open streams (at most 60 s)
  timeout 70 python3 - "$1" <<'EOF2'
import sys, time, httpx
for _ in range(600):
    try:
        if httpx.get("http://127.0.0.1:8091/health").json().get("active_streams", 0) >= int(sys.argv[1]):
            break
    except (httpx.HTTPError, ValueError):
        pass
    time.sleep(0.1)
EOF2
}
serveprof() {  # py-spy records each load from 1 s after half its streams are open (the clients import torch first)
  local spy=/tmp/site/bin/py-spy spec name load pids first=1 t0=$SECONDS
  [ -x "$spy" ] || spy=$(command -v py-spy) || { echo "no py-spy: carry .whl with its wheel" >&2; return 2; }
  local rec=(record --threads --rate 200 --duration 6 --format raw --nonblocking)
  # PROF_SERVER replaces the server (a CPU dry run: "python3 bench/service_host.py serve --max-streams 64"), PROF_LOADS
  # the loads (PROCSxSTREAMS ...), PROF_SECONDS their length
  ${PROF_SERVER:-python3 -m code2wav serve --device cuda --dtype bfloat16 --max-streams 256 --log-level warning ${SERVE_ARGS:-}} >"$OUT/serve.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 300); do ready 2>/dev/null && break; kill -0 "$SERVER" 2>/dev/null || break; sleep 1; done
  if ! ready 2>/dev/null; then echo "the server is not ready after $((SECONDS - t0)) s"; tail -n 20 "$OUT/serve.log"; kill "$SERVER"; return 1; fi
  echo "ready after $((SECONDS - t0)) s: $(get /health)"
  for spec in ${PROF_LOADS:-4x64 8x32}; do
    name=prof_$spec
    echo "=== procs x streams ${spec/x/ x }, prefix 0, ${PROF_SECONDS:-10} s: py-spy ${rec[*]}"
    timeout 90 python3 bench/service_load.py http://127.0.0.1:8091 ${spec/x/ } "${PROF_SECONDS:-10}" --prefix 0 >/tmp/serveprof_load.json &
    load=$!
    until_streams $((${spec%x*} * ${spec#*x} / 2)); sleep 1
    timeout 30 "$spy" "${rec[@]}" -p "$SERVER" -o "$OUT/$name.txt" &
    pids=($!)
    if [ -n "$first" ]; then  # the same window with --gil: which thread holds the GIL, and for how much of the wall
      timeout 30 "$spy" "${rec[@]}" --gil -p "$SERVER" -o "$OUT/${name}_gil.txt" >/dev/null &
      pids+=($!)
      sleep 3; timeout 20 "$spy" dump -p "$SERVER" >"$OUT/dump_$spec.txt" 2>&1; echo "all threads mid-load: $OUT/dump_$spec.txt"
    fi
    wait "${pids[@]}"; wait "$load"
    # the summary file: the load's JSON line, the profile's tables and JSON line, then the --gil profile's
    { cat /tmp/serveprof_load.json; timeout 60 python3 bench/server_profile.py "$OUT/$name.txt" --rate 200 --duration 6
      [ -n "$first" ] && echo "=== holding the GIL (--gil)" && timeout 60 python3 bench/server_profile.py "$OUT/${name}_gil.txt" --rate 200 --duration 6 --top 15
    } >"$OUT/${name}_summary.txt" 2>&1
    python3 -c 'import json, sys; d = json.loads(sys.stdin.readline()); d.pop("runs"); print(json.dumps(d))' </tmp/serveprof_load.json || echo "(no load result)"
    grep -v "^{" "$OUT/${name}_summary.txt" | head -n 28
    [ -n "$first" ] && sed -n '/^=== holding the GIL/,/^--- top/{/^--- top/!p}' "$OUT/${name}_summary.txt"
    first=
  done
  get /metrics | grep -E "^code2wav_(steps|errors|pool)"
  kill "$SERVER"; for _ in $(seq 30); do kill -0 "$SERVER" 2>/dev/null || break; sleep 1; done; kill -9 "$SERVER" 2>/dev/null
}

case "${1:-check}" in
check)
  timeout 280 python3 bench/gpu_check.py 2>&1 | tee "$OUT/gpu_check.txt"
  sustained sustained --levels 1,16,64,256
  echo "=== summary ==="; checks_summary; grep -A6 "^mode" "$OUT/sustained.txt"
  ;;
sustained)
  timeout 60 python3 bench/first_packet.py 300 2>&1 | tee "$OUT/first_packet.txt"
  sustained sustained --modes exact-graph,windowed --levels 1,16,64,256 --prefix 0,72
  echo "=== summary ==="; tail -n 13 "$OUT/first_packet.txt"; grep -A18 "^mode" "$OUT/sustained.txt"
  ;;
profile)
  timeout 300 python3 bench/profile_step.py bfloat16 2>&1 | tee "$OUT/profile.txt"
  echo "=== summary ==="; grep -B1 -A9 "eager ms" "$OUT/profile.txt"; grep -- "^---" "$OUT/profile.txt"
  ;;
service)
  start_server; get /health; service_bench
  python3 -m code2wav loadtest --server http://127.0.0.1:8091 --streams 64 --seconds 10 2>&1 | tee "$OUT/loadtest.txt"
  get /metrics | grep -E "^code2wav_(graph|steps|errors|pool)" | tee "$OUT/metrics.txt"
  kill "$SERVER"; wait "$SERVER" 2>/dev/null
  python3 -m code2wav bench --modes exact-graph --levels 1,64 --frames 101 --out "$OUT/inprocess" 2>&1 | tee "$OUT/inprocess.txt"
  echo "=== service ==="; tail -n 3 "$OUT/service.txt"; tail -n 3 "$OUT/loadtest.txt"; echo "=== in-process ==="; tail -n 4 "$OUT/inprocess.txt"
  ;;
fullload)
  loads='for spec in "1 1" "4 16" "4 64"; do for pfx in 0 200; do echo "=== service: procs x streams $spec, prefix $pfx";
    python3 bench/service_load.py http://127.0.0.1:8091 $spec 8 --prefix $pfx | tee -a '"$OUT"'/service_load.jsonl | cut -c1-240; done; done'
  # SERVE_ARGS: more serve options, e.g. SERVE_ARGS="--set graph_capture=background"
  timeout 330 python3 bench/cold_start.py serve --then "$loads" --device cuda --dtype bfloat16 --max-streams 256 ${SERVE_ARGS:-} 2>&1 | tee "$OUT/fullload.txt"
  [ -n "${INPROCESS-1}" ] && sustained inprocess --levels 1,64,256 --prefix 0,200 --seconds 4
  echo "=== summary ==="; grep -v "^{" "$OUT/fullload.txt" | head -8; grep -A8 "^mode" "$OUT/inprocess.txt" 2>/dev/null
  ;;
serveprof)
  serveprof 2>&1 | tee "$OUT/serveprof.txt"
  ;;
startup)
  timeout 300 python3 bench/cold_start.py phases bfloat16 2>&1 | tee "$OUT/startup.txt"
  ;;
warm)
  timeout 150 python3 bench/warm_check.py float32 8 2>&1 | tee "$OUT/warm_check.txt"
  ;;
outstanding)
  CUDNN_BENCHMARK=0 timeout 150 python3 bench/warm_check.py float32 4 2>&1 | tee "$OUT/warm_check.txt" | tail -8
  loads='for spec in "1 1 0" "1 1 0 --reuse-connections" "4 16 0" "4 16 0 --reuse-connections" "4 64 0" "4 64 0 --reuse-connections" "4 64 200 --reuse-connections --voices 8"; do
    set -- $spec; n=$1; w=$2; p=$3; shift 3; echo "=== service: $n procs x $w streams, prefix $p $*";
    timeout 40 python3 bench/service_load.py http://127.0.0.1:8091 $n $w 8 --prefix $p "$@" | tee -a '"$OUT"'/service_load.jsonl | cut -c1-240; done'
  timeout 260 python3 bench/cold_start.py serve --then "$loads" --device cuda --dtype bfloat16 --max-streams 256 --set prefix_cache_bytes=1000000000 2>&1 | tee "$OUT/fullload.txt" | grep -v '^{"'
  timeout 150 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --prefix 0,200 --voices 8 --seconds 3 \
    --set prefix_cache_bytes=1000000000 --out "$OUT/inprocess" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/inprocess.txt" | tail -8
  ;;
integrations)
  timeout 280 python3 bench/integration_vllm.py --out "$OUT/integration_vllm.json" 2>&1 | tee "$OUT/integration_vllm.txt"
  timeout 280 python3 bench/integration_sglang.py --out "$OUT/integration_sglang.json" 2>&1 | tee "$OUT/integration_sglang.txt"
  ;;
capacity)
  timeout 300 python3 -m code2wav.bench --modes exact-graph --levels 256,1024,2048 --pace 2 --seconds 12 --stagger-ms 1 --out "$OUT/capacity" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/capacity.txt"
  echo "=== summary ==="; grep -A6 "^mode" "$OUT/capacity.txt"
  ;;
offline)
  timeout 300 python3 bench/offline.py --device cuda --dtypes bfloat16,float32 --batches 1,16,64 --frames 125 --repeat 2 2>&1 | tee "$OUT/offline.txt"
  ;;
convtk)
  for i in 0 1 2 3 4 5 6 7; do timeout 150 python3 bench/convt.py bfloat16 --compile-only $i/8 >"$OUT/compile$i.txt" 2>&1 & done; wait
  cat "$OUT"/compile*.txt | tail -n 8; rm -f "$OUT"/compile*.txt
  timeout 200 python3 bench/convt.py bfloat16 --tiles-out "$OUT/convt_tiles.json" 2>&1 | tee "$OUT/convt.txt"
  python3 bench/put_tiles.py code2wav/kernels/convt.py PairTiles "$OUT/convt_tiles.json"
  timeout 170 python3 bench/profile_step.py bfloat16 channels_last,channels_last-convtk=1 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms"
  sustained default --levels 1,256
  sustained convtk --levels 1,256 --set layers.convt_kernel_rows=1
  echo "=== summary: defaults, then the ConvTransposes as one kernel ==="; grep -A3 "^mode" "$OUT/default.txt"; grep -A3 "^mode" "$OUT/convtk.txt"
  ;;
ab)
  shift
  [ $# -gt 0 ] || { echo "usage: bash bench/gpu.sh ab FIELD=VALUE [...]" >&2; exit 2; }
  sets=(); for kv in "$@"; do sets+=(--set "$kv"); done
  sustained default --levels 1,64,256
  sustained changed --levels 1,64,256 "${sets[@]}"
  echo "=== summary: defaults, then $* ==="; grep -A4 "^mode" "$OUT/default.txt"; grep -A4 "^mode" "$OUT/changed.txt"
  ;;
*)
  echo "unknown run ${1}; see the header of $0" >&2; exit 2
  ;;
esac
