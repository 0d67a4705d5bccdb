#!/usr/bin/env bash
# Session 16, GPU call 2 (repo root on the device; carry .peers, .tcache): the peers head to head at
# this commit. With CUDA graphs at 1 / 16 / 64 / 256 streams (float64 exactness first), then eager at
# 1 / 16 / 64. .peers is ../shared/peers with the harness changes in .peers/HARNESS_CHANGES.diff.
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
cp .peers/HARNESS_CHANGES.diff "$OUT/"
stamp "peers with graphs, 1 / 16 / 64 / 256"
timeout 370 python3 .peers/peer_bench.py --code2wav-root . --peers code2wav-graph,vllm-omni-graph,sglang-omni-graph \
  --levels 1,16,64,256 --max-minutes 5.2 --out "$OUT/graphs.json" 2>&1 | tee "$OUT/graphs.txt" | grep -v "^ *N=" | tail -n 25 | tee -a "$log"
stamp "peers eager, 1 / 16 / 64"
timeout 195 python3 .peers/peer_bench.py --code2wav-root . --peers code2wav-eager,vllm-omni-eager,sglang-omni-eager,official-windowed,faster-qwen3-tts \
  --no-exact --levels 1,16,64 --repeats 2 --max-minutes 2.6 --out "$OUT/eager.json" 2>&1 | tee "$OUT/eager.txt" | tail -n 20 | tee -a "$log"
stamp "done"
