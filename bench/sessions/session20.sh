#!/usr/bin/env bash
# Session 20 (repo root on the device).
#   bash bench/sessions/session20.sh a   Triton kernels launched with programmatic dependent launch
#                               (LayerChoices.pdl, kernels/pdl.py) or plainly: graph replay per step
#                               shape both ways (one process), the quick GPU checks (the other
#                               setting's fp32 stream vs float64 among them), a lone stream's first
#                               packet leg by leg back to back, sustained 1 / 64 / 256 both ways
#   bash bench/sessions/session20.sh b   larger steps: sustained 64 / 256 at a 480- (the default), 720- and
#                               960-frame budget (max_batch_frames; the graph pool beside each); the
#                               worker's host work on a lone stream's first packets under cProfile
#   bash bench/sessions/session20.sh c   a step's front and back as two graphs on two CUDA streams, the
#                               next step's front beside this step's back (bench/overlap.py)
#   bash bench/sessions/session20.sh d   the one-kernel units reading their taps themselves (no concat:
#                               LayerChoices.unit_conv_reads) vs the default: graph replay per shape
#                               and the same steps' audio both ways (bench/unit_reads.py; at f02966b:
#                               the knob and the script were reverted after it, BENCHMARKS.md)
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
left() { echo $(($1 - (SECONDS - T0))); }  # seconds left of a $1-second call
case "${1:-}" in
a)
  stamp "graph replay per step shape: the default (pdl) vs plain launches"
  timeout 150 python3 bench/profile_step.py bfloat16 channels_last,channels_last-pdl=0 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
  stamp "GPU checks (quick)"
  timeout 170 python3 bench/gpu_check.py --quick 2>&1 | tee "$OUT/gpu_check.txt" | grep -E "^(PASS|FAIL|SUMMARY)" | tee -a "$log"
  stamp "a lone stream's first packet, leg by leg, back to back"
  FIRST_PACKET_PAUSE_MS=0 timeout 90 python3 bench/first_packet.py 300 2>&1 | tee "$OUT/first_packet.txt" | tail -n 13 | tee -a "$log"
  for run in default: plain:"--set layers.pdl=false"; do
    stamp "sustained 1 / 64 / 256: ${run%%:*}"
    timeout "$(left 590)" python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --seconds 3 ${run#*:} --out "$OUT/${run%%:*}" 2>&1 \
      | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/${run%%:*}.txt" | grep -A4 "^mode" | tee -a "$log"
    rm -f "$OUT/${run%%:*}/plot.png"
  done
  ;;
b)
  stamp "the worker's host work per first packet, back to back, cProfile by cumulative time"
  FIRST_PACKET_PAUSE_MS=0 timeout 90 python3 bench/first_packet.py 300 bfloat16 profile cumtime 2>&1 | tail -n 75 | tee "$OUT/first_packet_profile.txt" | head -n 40 | tee -a "$log"
  for frames in 480 720 960; do
    stamp "sustained 64 / 256 at a $frames-frame budget"
    timeout "$(left 590)" python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 64,256 --seconds 3 --max-batch-frames $frames --out "$OUT/budget$frames" 2>&1 \
      | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/budget$frames.txt" | grep -A3 "^mode" | tee -a "$log"
    rm -f "$OUT/budget$frames/plot.png"
  done
  ;;
c)
  stamp "front and back graphs on two streams: serial vs pipelined"
  timeout "$(left 290)" python3 bench/overlap.py 10x25,16x25,20x25 50 2>&1 | tee "$OUT/overlap.txt" | tail -n 6 | tee -a "$log"
  ;;
d)
  stamp "units reading their taps vs after the concat: replay and audio"
  timeout "$(left 175)" python3 bench/unit_reads.py bfloat16 50 2>&1 | tee "$OUT/unit_reads.txt" | tail -n 12 | tee -a "$log"
  ;;
*) echo "usage: bash bench/sessions/session20.sh a|b|c|d" >&2; exit 2 ;;
esac
stamp "done"
