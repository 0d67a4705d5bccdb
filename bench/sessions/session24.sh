#!/usr/bin/env bash
# Session 24 (repo root on the device).
#   bash bench/sessions/session24.sh a   thread hand-offs on this host (bench/wakeups.py), then a lone stream's
#                               first packet and sustained 1 / 64 / 256, each without and with a
#                               PM QoS request holding /dev/cpu_dma_latency at 0 (another process)
#   bash bench/sessions/session24.sh b   the hand-offs again with a lone stream's whole cycle; the worker's spin
#                               (AsyncEngine.spin_s) 0 vs 2 ms: first packet push by push, the bench's
#                               one stream in four processes, sustained 1 / 64 / 256 with it
#   bash bench/sessions/session24.sh c   hand-offs with the threads pinned, with and without a SCHED_IDLE spinner
#                               on each CPU (it never goes idle); the bench's one stream unpinned, on one
#                               CPU, on two with the spinners; the legs; sustained on one CPU
#   bash bench/sessions/session24.sh d   sustained 1 / 64 / 256 unpinned and on one CPU (taskset -c 2), alternating
source bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
qos_on() {  # a process holding the request: the kernel drops it when the file closes
  python3 -c "import struct,time;f=open('/dev/cpu_dma_latency','wb',buffering=0);f.write(struct.pack('i',0));time.sleep(10**6)" &
  QOS=$!; sleep 0.5
}
qos_off() { kill "$QOS"; wait "$QOS" 2>/dev/null; }
case "${1:-}" in
a)
  stamp "thread hand-offs"
  timeout 60 python3 bench/wakeups.py 300 700 2>&1 | tee "$OUT/wakeups.txt" | tee -a "$log"
  stamp "a lone stream's first packet, back to back, bench streams (default engine)"
  FIRST_PACKET_PAUSE_MS=0 FIRST_PACKET_TAIL=4 FIRST_PACKET_ENGINE=default timeout 100 python3 bench/first_packet.py 200 2>&1 | tee "$OUT/fp_plain.txt" | tail -13 | tee -a "$log"
  qos_on
  stamp "the same under the QoS request"
  FIRST_PACKET_PAUSE_MS=0 FIRST_PACKET_TAIL=4 FIRST_PACKET_ENGINE=default timeout 100 python3 bench/first_packet.py 200 2>&1 | tee "$OUT/fp_qos.txt" | tail -13 | tee -a "$log"
  sustained_levels qos
  qos_off
  sustained_levels plain
  ;;
b)
  stamp "thread hand-offs, a lone stream's cycle with the worker and the loop blocking or spinning"
  timeout 90 python3 bench/wakeups.py 300 700 2>&1 | tee "$OUT/wakeups.txt" | tee -a "$log"
  stamp "a lone stream's first packet, the worker's spin 0 / 2 ms alternating push by push"
  FIRST_PACKET_SPIN=0,0.002 FIRST_PACKET_PAUSE_MS=0 FIRST_PACKET_TAIL=4 FIRST_PACKET_ENGINE=default timeout 120 python3 bench/first_packet.py 240 2>&1 \
    | tee "$OUT/fp_spin.txt" | grep -v "^code2wav" | tee -a "$log"
  for i in 1 2; do
    for spin in 0 0.002; do
      stamp "one stream, spin $spin, process $i"
      timeout 80 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1 --seconds 3 --set spin_s=$spin --out "/tmp/one_${spin}_$i" 2>&1 \
        | tr "\r" "\n" | grep -A2 "^mode" | tail -1 | tee -a "$log"
    done
  done
  sustained_levels spin2ms --set spin_s=0.002
  ;;
c)
  stamp "thread hand-offs, pinned, with and without SCHED_IDLE spinners on the two CPUs"
  timeout 120 python3 bench/wakeups.py 300 700 2>&1 | tee "$OUT/wakeups_c.txt" | tee -a "$log"
  spin_on() {  # a SCHED_IDLE spinner on each of CPUs 2 and 3: they never halt
    SPIN=""
    for c in 2 3; do
      taskset -c $c python3 -c "import os; os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
while True: pass" & SPIN="$SPIN $!"
    done
    sleep 0.5
  }
  spin_off() { kill $SPIN; wait $SPIN 2>/dev/null; }
  one() {  # the bench's one stream: $1 its name, then the command's prefix
    local name=$1; shift
    stamp "one stream: $name"
    "$@" timeout 80 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1 --seconds 3 --out /tmp/one 2>&1 \
      | tr "\r" "\n" | grep -A2 "^mode" | tail -1 | tee -a "$log"
  }
  for i in 1 2; do
    one "unpinned, run $i" env
    one "the process on CPU 2 alone, run $i" taskset -c 2
    spin_on; one "the process on CPUs 2-3, a spinner on each, run $i" taskset -c 2,3; spin_off
  done
  stamp "a lone stream's legs: CPU 2 alone, then CPUs 2-3 with the spinners"
  FIRST_PACKET_PAUSE_MS=0 FIRST_PACKET_TAIL=4 taskset -c 2 timeout 80 python3 bench/first_packet.py 200 2>&1 | tee "$OUT/fp_one_cpu.txt" | grep -v "^code2wav" | tee -a "$log"
  spin_on
  FIRST_PACKET_PAUSE_MS=0 FIRST_PACKET_TAIL=4 taskset -c 2,3 timeout 80 python3 bench/first_packet.py 200 2>&1 | tee "$OUT/fp_spinners.txt" | grep -v "^code2wav" | tee -a "$log"
  spin_off
  stamp "sustained 1 / 64 / 256 with the process on CPU 2 alone"
  taskset -c 2 timeout 110 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --seconds 3 --out "$OUT/one_cpu" 2>&1 \
    | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/one_cpu.txt" | grep -A4 "^mode" | tee -a "$log"
  rm -f "$OUT/one_cpu/plot.png"
  ;;
d)
  for i in 1 2; do
    sustained_levels "unpinned_$i"
    stamp "the same, the process on CPU 2 alone (taskset -c 2), run $i"
    taskset -c 2 timeout 110 python3 -m code2wav.bench --modes exact-graph --frames 101 --levels 1,64,256 --seconds 3 --out "$OUT/cpu2_$i" 2>&1 \
      | tr "\r" "\n" | grep -v "it/s]" | tee "$OUT/cpu2_$i.txt" | grep -A4 "^mode" | tee -a "$log"
    rm -f "$OUT/cpu2_$i/plot.png" "$OUT/unpinned_$i.txt" "$OUT/cpu2_$i.txt"
  done
  ;;
*) echo "usage: bash bench/sessions/session24.sh a|b|c|d"; exit 2 ;;
esac
stamp done
