# Sourced by bench/gpu.sh and the session scripts (bench/sessions/), on the device, from the repo root: the
# environment every GPU run shares (unbuffered output, the repo on the path, $OUT, the wheels
# carried in .whl installed aside, one cache for the embedded weights).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-bench-out}"; mkdir -p "$OUT"; OUT="$(cd "$OUT" && pwd)"  # absolute: a run may change directory (sessions/session38.sh)
if ls .whl/*.whl >/dev/null 2>&1; then  # qwen-tts-compat, the serve stack and py-spy travel as wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
export CODE2WAV_CACHE=/tmp/code2wav-cache
# Triton's compiled kernels from an earlier call, carried as .tcache/triton.tgz (an earlier call's
# $OUT/triton.tgz): a new machine then skips compiling them. `keep_triton_cache` at a script's
# end writes this call's cache back as $OUT/triton.tgz.
export TRITON_CACHE_DIR=/tmp/triton-cache; mkdir -p "$TRITON_CACHE_DIR"
[ -f .tcache/triton.tgz ] && tar -xzf .tcache/triton.tgz -C "$TRITON_CACHE_DIR"
keep_triton_cache() { tar -czf "$OUT/triton.tgz" -C "$TRITON_CACHE_DIR" . && ls -la "$OUT/triton.tgz"; }
log="$OUT/log.txt"; T0=$SECONDS
stamp() { echo "=== [$((SECONDS - T0)) s] $*" | tee -a "$log"; }  # a section of a call's log, with its start
# Sustained load at 1 / 64 / 256 streams, the issue-19 record: $1 the run's name, then
# code2wav.bench's extra arguments (gpu.sh's own `sustained` takes the levels as arguments).
sustained_levels() {
  local name=$1; shift
  stamp "sustained 1 / 64 / 256: $name"
  timeout 110 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --seconds 3 "$@" --out "$OUT/$name" 2>&1 \
    | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/$name.txt" | grep -A4 "^mode" | tee -a "$log"
  rm -f "$OUT/$name/plot.png"
}
# The service from a cold start, then at load from 4 client processes once ready: 1 x 1, 4 x 16,
# 4 x 64 WebSocket streams on kept connections, 4 x 64 with a connection per stream ($1: seconds
# the whole run may take).
service_at_load() {
  stamp "the service: cold start, then load"
  local loads='for spec in "1 1 --reuse-connections" "4 16 --reuse-connections" "4 64 --reuse-connections" "4 64"; do
    set -- $spec; n=$1; w=$2; shift 2; echo "=== service: $n procs x $w streams, prefix 0 $*";
    timeout 40 python3 bench/service_load.py http://127.0.0.1:8091 $n $w 8 --prefix 0 "$@" | tee -a '"$OUT"'/service_load.jsonl | cut -c1-240; done'
  timeout "$1" python3 bench/cold_start.py serve --then "$loads" --device cuda --dtype bfloat16 --max-streams 256 2>&1 \
    | tee "$OUT/fullload.txt" | grep -v '^{"' | tee -a "$log"
}
# A cached voice against none: sustained load at levels $2, 200-frame prefixes from 8 voices
# (every one warmed first), the prefix cache on ($1: the run's name; then code2wav.bench's extra
# arguments, e.g. --set restores_in_step=true).
prefix_levels() {
  local name=$1 levels=$2; shift 2
  stamp "sustained $levels: no prefix, a cached 200-frame prefix ($name $*)"
  timeout 200 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels "$levels" --prefix 0,200 --voices 8 --seconds 3 \
    --set prefix_cache_bytes=1000000000 "$@" --out "$OUT/$name" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/$name.txt" | grep -A5 "^mode" | tee -a "$log"
  rm -f "$OUT/$name/plot.png"
}
# The legs of a first packet at 512 streams ramped, prefixes none / cached / cached / none, one
# process (bench/ttfp_parts.py; $1 the run's name, $2 the seconds it may take, then
# code2wav.bench's extra arguments, e.g. --set gc_freeze=false; $SWITCH_MS, where set: the GIL's
# switch interval for the run, ttfp_parts.py's --switch-interval).
legs512() {
  local name=$1 limit=$2; shift 2
  stamp "512 streams ramped, prefixes 0,200,200,0, legs of the first packet ($name: $* ${SWITCH_MS:+switch interval $SWITCH_MS ms})"
  timeout "$limit" python3 bench/ttfp_parts.py ${SWITCH_MS:+--switch-interval "$SWITCH_MS"} -- --modes exact-graph --frames 101 --levels 512 \
    --chunks 1,4,8,16,25 --prefix 0,200,200,0 --voices 8 --seconds 3 --set prefix_cache_bytes=1000000000 "$@" --out "$OUT/$name" 2>&1 \
    | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/$name.txt" | grep -A6 "^mode" | cut -c1-400 | tee -a "$log"
  rm -f "$OUT/$name/plot.png"
}
# At most 8 files come back from $OUT: at a script's end, everything but the log and Triton's
# cache goes into one $OUT/results.tgz.
pack_out() {
  (cd "$OUT" && tar -czf /tmp/results.tgz --exclude=log.txt --exclude=triton.tgz . && find . -mindepth 1 \
    ! -name log.txt ! -name triton.tgz -delete && mv /tmp/results.tgz . && ls -la)
}
