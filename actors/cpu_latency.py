"""Quick wake-ups while the node serves: a PM QoS CPU latency request (`cpuIdleLatencyUs`).

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
"""

from __future__ import annotations

import os
import struct

from shm.invariant import invariant

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
