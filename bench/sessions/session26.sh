#!/usr/bin/env bash
# Session 26 (repo root on the device).
#   bash bench/sessions/session26.sh a   steps on two CUDA streams (bench/two_streams.py): a large step beside a
#                               small one, two large ones alternating; the default step's kernels
#   (b and c ran at 105ab9f, where LayerChoices.unit_feed exists; it was reverted after them)
#   bash bench/sessions/session26.sh b   a one-kernel unit writing the next unit's concat (LayerChoices.unit_feed):
#                               the quick GPU checks (bit for bit against unit_feed off), graph replay per
#                               shape both ways, the record (sustained 1 / 64 / 256) both ways
#   bash bench/sessions/session26.sh c   the same with the feed at the samples form's width only (192): graph replay
#                               interleaved in one process (bench/replay_ab.py), the record alternating, twice
#   (d and e ran at 6690a75, where EngineConfig.side_step_frames and bench/side_check.py existed, d before its
#    last change; they are back since, as priority_step_frames (off by default) and bench/priority_check.py)
#   bash bench/sessions/session26.sh d   small steps on a second CUDA stream (EngineConfig.side_step_frames): the
#                               multi-stream exactness check (bench/side_check.py), the record with and without
#   bash bench/sessions/session26.sh e   the same at 64 and 256 streams, the stacks dumped if it hangs
#   (g, the priority stream as on main, never ran in this session: it ran as bench/sessions/session27.sh a)
#   bash bench/sessions/session26.sh f [one|two|both]   two graphs replayed at once (bench/shared_workspace.py): captured on
#                               one stream or two
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
case "${1:-}" in
a)
  stamp "steps on two streams"
  timeout 240 python3 bench/two_streams.py 19x25,16x25 16x1,8x1,2x1 40 2>&1 | tee "$OUT/two_streams.txt" | tee -a "$log"
  stamp "graph replay per step shape and the 16 x 25 step's kernels (default)"
  timeout 150 python3 bench/profile_step.py bfloat16 channels_last 2>&1 | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
  ;;
b)
  stamp "quick GPU checks (the unit_feed one third)"
  timeout 150 python3 bench/gpu_check.py --quick > "$OUT/gpu_check.txt" 2>&1
  grep -E "^(PASS|FAIL|SUMMARY)" "$OUT/gpu_check.txt" | tee -a "$log"
  stamp "graph replay per step shape: unit_feed (default) vs off"
  timeout 170 python3 bench/profile_step.py bfloat16 channels_last,channels_last-feed=0 2>&1 \
    | tee "$OUT/profile.txt" | grep -B1 -A9 "eager ms" | tee -a "$log"
  sustained_levels feed
  sustained_levels nofeed --set layers.unit_feed=false
  keep_triton_cache
  ;;
c)
  stamp "graph replay, unit_feed (now the samples form only) vs off, interleaved in one process"
  timeout 200 python3 bench/replay_ab.py channels_last,channels_last-feed=0 1x1,1x25,16x25,20x25,64x8 7 20 2>&1 \
    | tee "$OUT/replay_ab.txt" | tee -a "$log"
  for i in 1 2; do
    sustained_levels "feed_$i"
    sustained_levels "nofeed_$i" --set layers.unit_feed=false
  done
  ;;
d)
  stamp "small steps on the side stream: exactness and use (float32, many streams at once)"
  timeout 200 python3 bench/side_check.py 24 2>&1 | tee "$OUT/side_check.txt" | tee -a "$log"
  sustained_levels side_1
  sustained_levels oneside_1 --set side_step_frames=0
  sustained_levels side_2
  ;;
e)
  stamp "the side stream at 64 and 256 streams, every thread's stack dumped if it hangs (SIGABRT at 150 s)"
  PYTHONFAULTHANDLER=1 timeout -s ABRT 150 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 64,256 --seconds 3 \
    --out "$OUT/side_dbg" 2>&1 | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/side_dbg.txt" | tail -60 | tee -a "$log"
  ;;
f)
  stamp "two graphs at once on two streams, captured on one capture stream or on two"
  timeout 150 python3 bench/shared_workspace.py 6 "${2:-both}" 2>&1 | tee "$OUT/shared_workspace.txt" | tail -5 | tee -a "$log"
  ;;
*) echo "usage: bash bench/sessions/session26.sh a|b|c|d|e|f" >&2; exit 2 ;;
esac
stamp "done"
