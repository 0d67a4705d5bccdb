"""What a thread hand-off costs on this host: the two hops on a lone stream's first packet (the
event loop waking the worker, the worker waking the loop), each after the receiver sat idle as
long as a one-frame step runs, blocked (the default) or spinning; then a lone stream's whole
cycle (``cycle``) with the worker spinning, or the loop spinning under a 20 us GIL switch
interval; on 4+ CPUs the cycle with the two threads pinned to CPUs 2 and 3, without and with a
SCHED_IDLE spinner process on each (those CPUs never go idle). No GPU needed.

argv: [rounds, default 300] [idle us, default 700]. Prints each case's median and p90 in us, the
CPU's idle driver and states, and then the first cases again with /dev/cpu_dma_latency held at 0
where the process may write it (a PM QoS request: idle CPUs then stay out of deep idle states)."""

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


def gil_free(seconds: float) -> None:
    """Wait as a CUDA event's synchronize does: spinning in C with the GIL released, taking it
    back once at the end (numpy releases it inside large ufuncs; each call here ~10-30 us)."""
    import numpy as np

    a = np.ones(20_000)
    end = now() + seconds
    while now() < end:
        np.multiply(a, 1.0, out=a)


def cycle(rounds: int, idle: float, worker_spin: bool, loop_spin: bool) -> tuple[list[float], list[float], list[float]]:
    """A lone stream's first packets, host only: the loop submits (Event.set), the worker wakes,
    does 100 us of Python (admission, staging, launch), waits ``idle`` without the GIL (the GPU
    step), 10 us of Python, hands over (``call_soon_threadsafe``), 30 us more, then waits for the
    next submit; the loop resolves and submits the next. ``worker_spin``: the worker polls for
    the next submit instead of blocking; ``loop_spin``: the loop polls while a push is out.
    Returns the loop -> worker hops, the worker -> loop hops and the whole rounds."""
    hop1, hop2, whole = [], [], []
    wake = threading.Event()
    box = {"sent": 0.0, "stop": False}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        out = [False]

        def poll() -> None:
            if out[0]:
                loop.call_soon(poll)

        def submit() -> None:
            if len(whole) == rounds:
                box["stop"] = True
                wake.set()
                done.set()
                return
            box["sent"] = now()
            out[0] = True
            if loop_spin:
                loop.call_soon(poll)
            wake.set()

        def resolved(handed: float) -> None:
            t = now()
            out[0] = False
            hop2.append(t - handed)
            whole.append(t - box["sent"])
            busy(0.00003)  # the caller's coroutine: finish, open, the next submit
            submit()

        def worker() -> None:
            while True:
                if worker_spin:
                    while not wake.is_set():
                        time.sleep(0)
                wake.wait()
                hop1.append(now() - box["sent"])
                wake.clear()
                if box["stop"]:
                    return
                busy(0.0001)
                gil_free(idle)
                busy(0.00001)
                loop.call_soon_threadsafe(resolved, now())
                busy(0.00003)

        t = threading.Thread(target=worker)
        t.start()
        submit()
        await done.wait()
        await loop.run_in_executor(None, t.join)

    asyncio.run(main())
    return hop1, hop2, whole


def report(name: str, lat: list[float]) -> None:
    us = sorted(x * 1e6 for x in lat[10:])
    print(f"{name:>34}  p50 {statistics.median(us):7.1f}  p90 {us[int(0.9 * len(us))]:7.1f} us")


def cases(rounds: int, idle: float) -> None:
    report("loop -> worker (Event, blocked)", event_hop(rounds, idle, False))
    report("loop -> worker (Event, spinning)", event_hop(rounds, idle, True))
    report("worker -> loop (idle loop)", loop_hop(rounds, idle, False))
    report("worker -> loop (spinning loop)", loop_hop(rounds, idle, True))
    default = sys.getswitchinterval()
    for worker_spin, loop_spin, switch in ((False, False, default), (True, False, default), (False, True, 2e-5)):
        sys.setswitchinterval(switch)
        hop1, hop2, whole = cycle(rounds, idle, worker_spin, loop_spin)
        sys.setswitchinterval(default)
        name = f"worker {'spins' if worker_spin else 'blocks'}, loop {'spins' if loop_spin else 'idles'}, GIL {switch * 1e6:g} us"
        report(f"{name}: hop in", hop1)
        report(f"{name}: hop back", hop2)
        report(f"{name}: round", whole)


def spinners(cpus: list[int]) -> list:
    """One process per CPU, pinned there at SCHED_IDLE, spinning: the CPU never idles (a VM's
    vCPU never halts), yet any thread woken on it preempts the spinner at once."""
    import subprocess

    code = "import os; os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True: pass"
    return [subprocess.Popen(["taskset", "-c", str(c), sys.executable, "-c", code]) for c in cpus]


def pinned_cases(rounds: int, idle: float) -> None:
    """The cycle with the loop's thread on CPU 2 and the worker's on CPU 3, then the same with a
    spinner on each."""
    os.sched_setaffinity(0, {2})  # this thread (the loop's); the worker pins itself
    real = threading.Thread.run

    def run(self):
        os.sched_setaffinity(0, {3})
        real(self)

    threading.Thread.run = run
    try:
        for label, procs in (("pinned", []), ("pinned + spinners", spinners([2, 3]))):
            time.sleep(0.5)
            hop1, hop2, whole = cycle(rounds, idle, False, False)
            for p in procs:
                p.kill()
            report(f"{label}: hop in", hop1)
            report(f"{label}: hop back", hop2)
            report(f"{label}: round", whole)
    finally:
        threading.Thread.run = real
        os.sched_setaffinity(0, range(os.cpu_count()))


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
    if os.cpu_count() >= 4:
        pinned_cases(rounds, idle)
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
