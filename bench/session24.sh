#!/usr/bin/env bash
# Session 24 (repo root on the device).
#   bash bench/session24.sh a   thread hand-offs on this host (bench/wakeups.py), then a lone stream's
#                               first packet and sustained 1 / 64 / 256, each without and with a
#                               PM QoS request holding /dev/cpu_dma_latency at 0 (another process)
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
*) echo "usage: bash bench/session24.sh a"; exit 2 ;;
esac
stamp done
