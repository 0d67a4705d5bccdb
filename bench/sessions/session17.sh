#!/usr/bin/env bash
# Session 17 (repo root on the device; carry .tcache where there is one). Two calls:
#   bash bench/sessions/session17.sh a   the ConvTransposes' kernel (kernels/convt.py): its tile sweep in 8
#                               compile shares, the best tiles put in this copy, graph replay per step
#                               shape both ways; Triton's cache back as $OUT/triton.tgz
#   bash bench/sessions/session17.sh b   (the tiles committed) the sweep's whole table again, sustained 1 / 256 with the defaults, with the
#                               ConvTransposes as one kernel, and with float16 low-rate stages on top;
#                               then the quick GPU checks
#   bash bench/sessions/session17.sh c   the new defaults (low_rate_dtype auto, the last ConvTranspose as one
#                               kernel): serve from a cold start twice, sustained 1 / 64 / 256 with
#                               them and with float32 low-rate stages, the quick GPU checks (its
#                               cold starts failed: the serve stack's wheels were not carried)
#   bash bench/sessions/session17.sh d   (carry .whl) serve from a cold start to the first audio: the default
#                               on a fresh machine and on a restart, then float32 low-rate stages
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
case "${1:-}" in
a)
  stamp "compile the sweep in 8 shares"
  for i in 0 1 2 3 4 5 6 7; do timeout 170 python3 bench/convt.py bfloat16 --compile-only $i/8 >"$OUT/compile$i.txt" 2>&1 & done; wait
  tail -q -n 2 "$OUT"/compile*.txt | tee -a "$log"; rm -f "$OUT"/compile*.txt  # (8 files: what comes back is counted)
  stamp "sweep"
  timeout 200 python3 bench/convt.py bfloat16 --tiles-out "$OUT/convt_tiles.json" 2>&1 | tee "$OUT/convt.txt" | tail -n 40 | tee -a "$log"
  python3 bench/put_tiles.py code2wav/kernels/convt.py PairTiles "$OUT/convt_tiles.json" | tee -a "$log"
  stamp "graph replay per step shape, default vs ConvTransposes as one kernel"
  timeout $((580 - (SECONDS - T0))) python3 bench/profile_step.py bfloat16 channels_last,channels_last-convtk=1 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
  ;;
b)
  stamp "the sweep again, its whole table (call a's was cut: its files did not come back)"
  for i in 0 1 2 3 4 5 6 7; do timeout 170 python3 bench/convt.py bfloat16 --compile-only $i/8 >"$OUT/compile$i.txt" 2>&1 & done; wait
  rm -f "$OUT"/compile*.txt
  timeout 200 python3 bench/convt.py bfloat16 --tiles-out "$OUT/convt_tiles.json" 2>&1 | tee "$OUT/convt.txt" | grep -E "^(===|best)" | tee -a "$log"
  for run in default:"" convtk:"--set layers.convt_kernel_rows=1" convtk_fp16:"--set layers.convt_kernel_rows=1 --set low_rate_dtype=float16"; do
    name=${run%%:*}; stamp "sustained 1 / 256, $name"
    # shellcheck disable=SC2086
    timeout 140 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,256 --seconds 3 ${run#*:} \
      --out "$OUT/$name" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/$name.txt" | grep -A3 "^mode" | tee -a "$log"
  done
  stamp "GPU checks (quick)"
  timeout $((585 - (SECONDS - T0))) python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt" | grep -E "^(PASS|FAIL|SUMMARY)" | tee -a "$log"
  ;;
c)
  # the defaults since this call's commit: low_rate_dtype="auto" (float16 on these weights), the
  # last block's ConvTranspose as one kernel. A fresh machine (no Triton cache carried).
  for start in fresh restart; do
    stamp "serve from a cold start to the first audio ($start)"
    COLD_START_UNTIL="first audio" timeout 100 python3 bench/cold_start.py serve --device cuda --dtype bfloat16 --max-streams 256 2>&1 \
      | tee "$OUT/cold_$start.txt" | grep -v '^{"' | tail -n 6 | tee -a "$log"
  done
  for run in default:"" lowrate32:"--low-rate-dtype float32"; do
    name=${run%%:*}; stamp "sustained 1 / 64 / 256, $name"
    # shellcheck disable=SC2086
    timeout 160 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --seconds 3 ${run#*:} \
      --out "$OUT/$name" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/$name.txt" | grep -A4 "^mode" | tee -a "$log"
    python3 -c "import json, sys; m = json.load(open(sys.argv[1]))['meta']; print('low-rate', m['low_rate_dtype'], 'peak', m['low_rate_peak'])" \
      "$OUT/$name/results.json" 2>&1 | tee -a "$log"
  done
  stamp "GPU checks (quick)"
  timeout $((585 - (SECONDS - T0))) python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt" | grep -E "^(PASS|FAIL|SUMMARY)" | tee -a "$log"
  ;;
d)
  stamp "the low-rate probe's cost in a fresh process"
  timeout 120 python3 bench/probe_cost.py 2>&1 | tee "$OUT/probe_cost.txt" | tail -n 8 | tee -a "$log"
  # (carry .whl: the serve stack) serve from a cold start to the first audio: the default (auto,
  # float16 on these weights) on a fresh machine and on a restart, then float32 low-rate stages
  for spec in fresh: restart: float32:"--low-rate-dtype float32"; do
    name=${spec%%:*}; stamp "serve from a cold start to the first audio ($name)"
    # shellcheck disable=SC2086
    COLD_START_UNTIL="first audio" timeout 100 python3 bench/cold_start.py serve --device cuda --dtype bfloat16 --max-streams 256 ${spec#*:} 2>&1 \
      | tee "$OUT/cold_$name.txt" | grep -v '^{"' | tail -n 6 | tee -a "$log"
  done
  ;;
*) echo "usage: bash bench/sessions/session17.sh a|b|c|d" >&2; exit 2 ;;
esac
stamp "done"
if [ "$1" = c ] || [ "$1" = d ]; then rm -f "$OUT"/*/plot.png; else keep_triton_cache | tee -a "$log"; fi  # c: what comes back is counted
