"""Host tuning, an operator's opt-in (docs/operations.md): what the node can do to the host it
runs on to shorten a request's round trip, off by default. A broker does not change the whole
host's power settings, or bind its threads, unless its operator asks.

1. The CPU wake-up latency request (`cpuIdleLatencyUs`, `CpuLatencyRequest`).
2. Keeping the front's threads on one CPU at light load (`frontPinBelowCpu`, `ProcessPinner`).

## 1. Quick wake-ups while the node serves: a PM QoS CPU latency request (`cpuIdleLatencyUs`).

Why: every request crosses threads that sleep between requests: the client's loop and its
ZeroMQ I/O thread, the front's I/O thread and its loop, and back. An idle CPU halts, and
waking a thread on a halted CPU costs an interrupt and, on a virtual machine, an exit to the
host. On the project's virtual machines (the cpuidle-haltpoll driver, booted with `haltpoll.guest_halt_poll_ns=0`:
no polling before the halt) that is tens of µs a wake-up and several a request. With a latency
limit of 0 the idle CPUs poll (the kernel's POLL idle state) instead of halting, so a
wake-up is a flag the other CPU sees at once. Measured (docs/performance.md): the ZeroMQ echo
floor 121-187 → 56-81 µs, the ack latency p50 at 5k sends/s 326-480 → 192-267 µs in 10 of 10
alternating pairs, and every throughput figure higher too.

The kernel's interface: while a process holds `/dev/cpu_dma_latency` open, having written a
limit in µs (a native s32), no CPU enters an idle state slower to leave than that; closing the
file drops the request, so a killed process leaves nothing behind. Reading the file gives the
limit in force (2,000,000,000 µs when nobody asks). Writing it needs root (CAP_SYS_ADMIN is
not asked: the device's mode decides); where the file is missing or not writable, the node
runs as before and the statistics say why.

The cost: a polling idle CPU is busy as far as the host is concerned (power, and CPU time a
host shares among guests). So the front holds the request only while it serves: from a turn
that took a request until HOLD_S after the last one. An idle node asks for nothing, and the
first request after a quiet spell pays the slow wake-up once. -1 makes no request at all.

`LatencyHold` is the pure policy, fed the turns with a clock; `CpuLatencyRequest` does the
file's I/O.

## 2. Keeping the front's process on one CPU while its load is light (`frontPinBelowCpu`).

Why: at light load each request is its own turn, and a lone send crosses the front's loop and
its ZeroMQ I/O thread twice (request in, reply out), each time a wake-up. When the thread woken
last ran on the other CPU, which has gone idle meanwhile, the wake-up is an interrupt to a
halted virtual CPU, and on a virtual machine that costs tens of µs. With every thread of the front on one
CPU those wake-ups stay local. Measured at 5k single sends a second (docs/performance.md),
14 alternating pairs of fresh nodes: ack latency p50 lower pinned in 13 (median ~396 → ~327
µs). When the front's own load needs more than the one CPU, the pin is lifted.

With `cpuIdleLatencyUs` set the front also keeps idle CPUs from halting while it serves
(`cpuIdleLatencyUs`, actors.cpu_latency), which removes most of that cost everywhere. Pinning on
top of it still gave lower p50 on fresh nodes in 4 of 4 pairs (267 / 272 / 236 / 339 → 221 / 238
/ 203 / 221 µs), most likely because the front's threads then share warm caches.

`PinPolicy` is pure, fed one `Reading` a second. `ProcessPinner` takes them from /proc and
applies the decisions with sched_setaffinity to every thread of the process (threads started
later inherit the mask of the thread that starts them):
- pin, to the CPU the loop's thread is on, when the process used less than `pin_below` of one
  CPU over the last second;
- unpin when, over the last second, it used more than UNPIN_ABOVE of the one CPU (nearly full),
  or its loop's thread was runnable (running or waiting to run) more than MAX_LOOP_BUSY of the
  time (it wants the whole CPU and gets only a share: another process busy on that CPU takes
  the rest; at 5k sends/s pinned it was 0.78-0.85, so the limit sits well above), or waited to
  run more than MAX_LOOP_WAIT of the time (something else pinned there, another node say). Some waiting is the price of sharing: at 5k sends/s, pinned, the
  process used 0.55-0.61 of the CPU and the loop waited 26-34% of the time, behind its own I/O
  thread and the clients, and still answered sooner. Judged over 100 ms instead, the waits of
  single bursts unpinned it in the middle of such a run;
- after an unpin, not again for HOLD_OFF_S: a load that comes and goes does not move the
  threads back and forth, and a CPU another process keeps busy is not taken again at once.
A burst of load shorter than a second runs pinned.

Off by default (`frontPinBelowCpu = 0`), for what it cost elsewhere: under a batch-produce load
the front stayed pinned (it used only 0.41-0.58 of its CPU), the dispatcher's lag doubled (max
~10 → ~17.5 MiB) and four consumer processes pulled 7-18% slower (`scripts/bench-consume`,
two pairs). And in `scripts/bench-produce`, whose latency figure comes after 400k sends, the
gain did not show (three pairs, p50 inside the noise); on a fresh node it showed in 13 of 14.
Unpinned tasks are not stuck: the scheduler moves them off a busy pinned CPU. Best effort: where
sched_setaffinity or /proc is missing, or only one CPU is allowed, nothing is pinned and the
statistics say so.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from dataclasses import dataclass

from shm.invariant import invariant

# -- 1. the CPU wake-up latency request ------------------------------------------------------------

DEVICE = "/dev/cpu_dma_latency"
HOLD_S = 2.0  # the request outlives the last request served by this long
NO_REQUEST = -1
_LIMIT = struct.Struct("=i")


class LatencyHold:
    """Whether the request should be held, turn by turn."""

    def __init__(self, hold_s: float = HOLD_S):
        invariant(hold_s > 0, hold_s)
        self.hold_s = hold_s
        self.last_served = float("-inf")

    def wanted(self, now: float, served: bool) -> bool:
        """After a turn ending at `now` that took a request (`served`) or not."""
        if served:
            self.last_served = now
        return now - self.last_served <= self.hold_s


class CpuLatencyRequest:
    """Holds the PM QoS request while `check` says the front serves. Call `check` each turn:
    between changes it is two comparisons; a change is an open and a write, or a close."""

    def __init__(self, limit_us: int, *, device: str = DEVICE, hold_s: float = HOLD_S):
        invariant(limit_us >= 0, limit_us)
        self.limit_us = limit_us
        self.device = device
        self.policy = LatencyHold(hold_s)
        self.fd: int | None = None
        self.unavailable: str | None = None  # why no request could be made; then none is tried again
        self.holds = 0
        self.held_s = 0.0
        self.held_since = 0.0

    def check(self, now: float, served: bool) -> None:
        wanted = self.policy.wanted(now, served)
        if wanted:
            self.acquire(now)
        else:
            self.release(now)

    def release(self, now: float) -> None:
        """Drop the request (when the turns say so, and at stop)."""
        if self.fd is None:
            return
        os.close(self.fd)
        self.fd = None
        self.held_s += now - self.held_since

    def acquire(self, now: float) -> None:
        """Make the request now (the turns do, through `check`; a one-off measurement may)."""
        if self.fd is not None or self.unavailable is not None:
            return
        fd = None
        try:
            fd = os.open(self.device, os.O_WRONLY | os.O_CLOEXEC)
            written = os.write(fd, _LIMIT.pack(self.limit_us))
            invariant(written == _LIMIT.size, written)
        except OSError as e:
            if fd is not None:
                os.close(fd)
            self.unavailable = f"{self.device}: {e.strerror or e}"
            return
        self.fd = fd
        self.holds += 1
        self.held_since = now

    def statistics(self, now: float) -> dict:
        held = self.fd is not None
        return {"limitUs": self.limit_us, "held": held, "holds": self.holds,
                "heldSeconds": round(self.held_s + (now - self.held_since if held else 0.0), 1),
                "unavailable": self.unavailable}


def limit_in_force(device: str = DEVICE) -> int | None:
    """The CPU wake-up limit the kernel applies now, in µs, or None where it cannot be read."""
    try:
        with open(device, "rb") as f:
            raw = f.read(_LIMIT.size)
    except OSError:
        return None
    return _LIMIT.unpack(raw)[0] if len(raw) == _LIMIT.size else None


# -- 2. the front on one CPU ----------------------------------------------------------------------

UNPIN_ABOVE = 0.85  # of one CPU, the process's use over a reading
MAX_LOOP_BUSY = 0.95  # of a reading's wall time, the loop thread's time running or waiting to run
MAX_LOOP_WAIT = 0.6  # of a reading's wall time, the loop thread's wait to run
HOLD_OFF_S = 10.0
READING_S = 1.0


@dataclass(frozen=True)
class Reading:
    """A second (about) of the process, as `ProcessPinner` measures it."""

    now: float  # monotonic seconds, at its end
    process_cpu: float  # CPU time of every thread of the process / wall time
    loop_busy: float  # the loop thread's time running or waiting to run / wall time
    loop_wait: float  # the waiting part alone
    cpu: int  # the CPU the loop's thread is on


class PinPolicy:
    """Decides from the readings which CPU the process should be pinned to (None: any)."""

    def __init__(self, pin_below: float):
        invariant(0 < pin_below < UNPIN_ABOVE, pin_below)
        self.pin_below = pin_below
        self.pinned: int | None = None
        self.hold_until = 0.0
        self.pins = self.unpins = 0

    def decide(self, reading: Reading) -> int | None:
        """The CPU to be pinned to after this reading, or None for any CPU."""
        if self.pinned is not None:
            if (reading.process_cpu > UNPIN_ABOVE or reading.loop_busy > MAX_LOOP_BUSY
                    or reading.loop_wait > MAX_LOOP_WAIT):
                self.pinned = None
                self.unpins += 1
                self.hold_until = reading.now + HOLD_OFF_S
        elif reading.process_cpu < self.pin_below and reading.now >= self.hold_until:
            self.pinned = reading.cpu
            self.pins += 1
        return self.pinned


class ProcessPinner:
    """Reads the process and its loop thread (the thread that made it) and applies
    `PinPolicy`'s decisions. Call `check()` from the loop each turn; between readings it only
    looks at the clock."""

    def __init__(self, pin_below: float):
        self.policy = PinPolicy(pin_below)
        self.tid = threading.get_native_id()
        try:
            self.allowed = os.sched_getaffinity(0)
        except (AttributeError, OSError):
            self.allowed = set()
        first = self._read() if len(self.allowed) > 1 else None
        self.enabled = first is not None
        self.failures = 0
        self.last: Reading | None = None
        self.began = first  # where the current reading began
        self.next_check = time.monotonic() + READING_S

    def check(self) -> None:
        """Once a READING_S, a reading of the stretch since the last, and the policy's decision."""
        now = time.monotonic()
        if not self.enabled or now < self.next_check:
            return
        self.next_check = now + READING_S
        current = self._read()
        if current is None:
            return
        self.last, self.began = _between(self.began, current), current
        was = self.policy.pinned
        pinned = self.policy.decide(self.last)
        if pinned != was:
            self._apply(self.allowed if pinned is None else {pinned})

    def release(self) -> None:
        """Any CPU again (at stop, so a drain is not confined)."""
        if self.enabled and self.policy.pinned is not None:
            self.policy.pinned = None
            self._apply(self.allowed)

    def _read(self) -> tuple[float, float, int, int, int] | None:
        """(monotonic s, the process's CPU s, the loop thread's run ns and run-queue wait ns,
        the CPU it is on), or None where /proc does not tell."""
        try:
            times = os.times()
            with open(f"/proc/self/task/{self.tid}/schedstat") as f:
                run_ns, wait_ns = (int(v) for v in f.read().split()[:2])
            with open(f"/proc/self/task/{self.tid}/stat") as f:
                cpu = int(f.read().rsplit(")", 1)[1].split()[36])  # field 39, "processor"
        except (OSError, ValueError, IndexError):
            return None
        return time.monotonic(), times.user + times.system, run_ns, wait_ns, cpu

    def _apply(self, cpus: set[int]) -> None:
        try:
            tasks = [int(t) for t in os.listdir("/proc/self/task")]
        except OSError:
            self.failures += 1
            return
        for tid in tasks:
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:  # a thread that ended meanwhile, or a CPU no longer allowed
                self.failures += 1

    def statistics(self) -> dict:
        policy, last = self.policy, self.last  # the last reading, None before the first
        return {"enabled": self.enabled, "pinnedCpu": policy.pinned, "pins": policy.pins,
                "unpins": policy.unpins, "failures": self.failures, "allowedCpus": len(self.allowed),
                "processCpu": round(last.process_cpu, 3) if last else None,
                "loopBusy": round(last.loop_busy, 3) if last else None,
                "loopWait": round(last.loop_wait, 3) if last else None}


def _between(began: tuple, ended: tuple) -> Reading:
    """The `Reading` of the stretch between two `ProcessPinner._read` results."""
    (wall0, cpu0, run0, wait0, _), (wall1, cpu1, run1, wait1, on_cpu) = began, ended
    elapsed = max(wall1 - wall0, 1e-6)
    wait = (wait1 - wait0) / 1e9 / elapsed
    return Reading(wall1, (cpu1 - cpu0) / elapsed, (run1 - run0) / 1e9 / elapsed + wait, wait, on_cpu)
