"""What a thread hand-off costs on this host: the two hops on a lone stream's first packet (the
event loop waking the worker, the worker waking the loop), each after the receiver sat idle as
long as a one-frame step runs, blocked (the default) or spinning. No GPU needed.

argv: [rounds, default 300] [idle us, default 700]. Prints each case's median and p90 in us, the
CPU's idle driver and states, and then the same with /dev/cpu_dma_latency held at 0 where the
process may write it (a PM QoS request: idle CPUs then stay out of deep idle states)."""

from __future__ import annotations

import asyncio
import glob
import os
import statistics
import struct
import sys
import threading
import time

now = time.perf_counter


def busy(seconds: float) -> None:
    """Wait without sleeping and without holding the GIL for long (as a CUDA event's spin)."""
    end = now() + seconds
    while now() < end:
        os.sched_yield()


def event_hop(rounds: int, idle: float, spin: bool) -> list[float]:
    """Main sets an Event the worker waits on; the worker stamps its wake-up."""
    ev, seen, lat = threading.Event(), threading.Event(), []
    sent = [0.0]

    def worker() -> None:
        for _ in range(rounds):
            if spin:
                while not ev.is_set():
                    time.sleep(0)  # releases the GIL; the thread never blocks
            else:
                ev.wait()
            lat.append(now() - sent[0])
            ev.clear()
            seen.set()

    t = threading.Thread(target=worker)
    t.start()
    for _ in range(rounds):
        busy(idle)
        sent[0] = now()
        ev.set()
        seen.wait()
        seen.clear()
    t.join()
    return lat


def loop_hop(rounds: int, idle: float, spin: bool) -> list[float]:
    """A thread wakes an idle asyncio loop with ``call_soon_threadsafe`` (the worker's hand-over)."""
    lat: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        spinning = [spin]

        def land(sent: float) -> None:
            lat.append(now() - sent)
            if len(lat) == rounds:
                spinning[0] = False
                done.set()

        def poll() -> None:  # keeps the loop's select at timeout 0
            if spinning[0]:
                loop.call_soon(poll)

        def sender() -> None:
            for _ in range(rounds):
                busy(idle)
                loop.call_soon_threadsafe(land, now())
                busy(0.0002)  # the worker's bookkeeping after a hand-over

        if spin:
            loop.call_soon(poll)
        t = threading.Thread(target=sender)
        t.start()
        await done.wait()
        t.join()

    asyncio.run(main())
    return lat


def report(name: str, lat: list[float]) -> None:
    us = sorted(x * 1e6 for x in lat[10:])
    print(f"{name:>34}  p50 {statistics.median(us):7.1f}  p90 {us[int(0.9 * len(us))]:7.1f} us")


def cases(rounds: int, idle: float) -> None:
    report("loop -> worker (Event, blocked)", event_hop(rounds, idle, False))
    report("loop -> worker (Event, spinning)", event_hop(rounds, idle, True))
    report("worker -> loop (idle loop)", loop_hop(rounds, idle, False))
    report("worker -> loop (spinning loop)", loop_hop(rounds, idle, True))


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    idle = (int(sys.argv[2]) if len(sys.argv) > 2 else 700) / 1e6
    base = "/sys/devices/system/cpu/cpuidle"
    for f in ("current_driver", "current_governor_ro", "current_governor"):
        if os.path.exists(f"{base}/{f}"):
            print(f"cpuidle {f}: {open(f'{base}/{f}').read().strip()}")
    for d in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cpuidle/state*")):
        name, latency = (open(f"{d}/{k}").read().strip() for k in ("name", "latency"))
        print(f"cpu0 {os.path.basename(d)}: {name}, exit latency {latency} us")
    print(f"os.cpu_count() {os.cpu_count()}, {rounds} rounds, {idle * 1e6:.0f} us idle before each")
    cases(rounds, idle)
    try:
        qos = open("/dev/cpu_dma_latency", "wb", buffering=0)
        qos.write(struct.pack("i", 0))
    except OSError as e:
        print(f"/dev/cpu_dma_latency: {e}")
        return 0
    print("with /dev/cpu_dma_latency held at 0:")
    cases(rounds, idle)
    qos.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
