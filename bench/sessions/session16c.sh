#!/usr/bin/env bash
# Session 16, GPU call 3 (repo root on the device; carry .peers, .tcache, .whl): the service at this
# commit from its cold start (spawn -> health -> first audio -> ready), then at load from 4 client
# processes: 1 x 1, 4 x 16 and 4 x 64 WebSocket streams on kept connections, 4 x 64 with a
# connection per stream; in-process at 1 / 64 / 256 on the same machine start; then SGLang-Omni's
# CUDA-graph runner with its torch.compile (its served default) at 1 / 16 / 64. (That last step
# failed: with the serve stack's wheels on the path transformers' MimiModel did not import; call 4
# ran it alone, without them: the command in BENCHMARKS.md, "Against the peers".)
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
service_at_load 200
stamp "in-process 1 / 64 / 256"
timeout 130 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --seconds 3 --out "$OUT/inprocess" 2>&1 \
  | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/inprocess.txt" | grep -A4 "^mode" | tee -a "$log"
stamp "SGLang-Omni graphs with torch.compile, 1 / 16 / 64"
timeout $((590 - (SECONDS - T0))) python3 .peers/peer_bench.py --code2wav-root . --peers sglang-omni-graph --sglang-compile --no-exact \
  --levels 1,16,64 --max-minutes 6 --out "$OUT/sglang_compile.json" 2>&1 | tee "$OUT/sglang_compile.txt" | tail -n 8 | tee -a "$log"
stamp "done"
