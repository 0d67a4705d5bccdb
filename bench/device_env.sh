# Sourced by bench/gpu.sh and the session scripts, on the device, from the repo root: the
# environment every GPU run shares (unbuffered output, the repo on the path, $OUT, the wheels
# carried in .whl installed aside, one cache for the embedded weights).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-bench-out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then  # qwen-tts-compat, the serve stack and py-spy travel as wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
export CODE2WAV_CACHE=/tmp/code2wav-cache
