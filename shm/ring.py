"""A ring: one process hands batches of bytes to one other through a shared mapped file.

Between the processes of a node the write path's hand-offs (front -> writer or ingress,
ingress -> writer, writer -> flush, writer / flush / ingress -> front) and the read side's
(front -> pull workers, pop and transaction services -> front) go through rings, not ZeroMQ:
a ZeroMQ hop wakes the sender's I/O thread and the receiver's before the receiver itself, and
copies the bytes four times; a ring hop is one copy in, one copy out and one
doorbell (a FIFO byte, `actors.base.Doorbell`) that wakes only the receiver. The model is
Aeron's log buffer and the LMAX Disruptor, reduced to one producer and one consumer, so each
counter has exactly one writer and no atomic read-modify-write is needed.

File: `<name>.ring` in the node's ring directory in memory (actors.links.ring_dir), made by the launcher before the services start (a restarted
service opens the one it had). Little-endian, 8-byte aligned:

| offset | width | field     | single writer | meaning                                       |
|--------|-------|-----------|---------------|-----------------------------------------------|
| 0      | 8     | magic     | launcher      | RING_MAGIC                                    |
| 8      | 8     | capacity  | launcher      | bytes of the data area, a power of two        |
| 64     | 8     | tail      | producer      | bytes ever published (its own cache line)     |
| 128    | 8     | head      | consumer      | bytes ever consumed (its own cache line)      |
| 192    | 8     | sleeping  | consumer      | 1 while it may sleep on its doorbell          |
| 4096   | cap   | data      | producer      | messages, each u32 length + payload, padded to 8 |

A message never wraps: when it does not fit before the end, the producer writes the length
WRAP there (if 4 bytes are left) and the message begins at the start of the area; the bytes
skipped count as published.

Order (claim, write, commit): the producer checks the free space against `head`, writes the
message, then stores `tail`; the consumer reads `tail`, copies the messages out, then stores
`head`. Aligned 8-byte stores through `memoryview.cast('q')` are single instructions on
x86-64 (shm.control_block), so a counter is never seen torn, and x86 keeps stores in order, so
a published message is whole. The doorbell is rung after `tail` and drained before `tail` is
read: the FIFO's kernel lock orders the two, so a wake-up is never lost.

Waking costs a system call on each side, and on a virtual machine an interrupt between CPUs,
so the producer rings only a consumer that may be asleep (the Disruptor's blocking wait
strategy): the consumer stores `sleeping = 1` and then looks at `tail` once more before it
sleeps; the producer stores `tail` and then looks at `sleeping`. A full fence between the store
and the load on both sides (`shm._atomic.fence`; x86-64 lets a load pass an earlier store)
means at least one of them sees the other's store: the consumer does not sleep, or the
producer rings. Without the C fence the producer always rings.

Crash policy: nothing here is durable or needs recovery. A producer killed before it stored
`tail` leaves a message nobody sees, overwritten by its restart; a consumer killed after it
stored `head` loses the messages it took (their senders time out, as with a process killed
holding ZeroMQ frames). Counters only grow; `tail - head` never exceeds the capacity (asserted
by both sides).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import stat
import struct
from pathlib import Path

from shm.invariant import invariant
from shm.mapped_file import StoreError

try:
    from shm._atomic import fence
except ImportError:  # pragma: no cover - built wherever gcc and the Python headers are
    fence = None
FENCED = fence is not None and os.environ.get("MQNODE_NATIVE", "1") != "0"

RING_MAGIC = 0x676E69726E716D01  # "mqnring" v1
HEADER_SIZE = 4096
TAIL_SLOT, HEAD_SLOT, SLEEPING_SLOT = 8, 16, 24  # int64 slots: byte offsets 64, 128 and 192
WRAP = 0xFFFFFFFF
_LENGTH = struct.Struct("<I")
ALIGN = 8


def _padded(size: int) -> int:
    return (size + ALIGN - 1) & ~(ALIGN - 1)


class RingFull(Exception):
    """The consumer is behind by the whole capacity: the message was not published."""


def create(path: Path, capacity: int) -> None:
    """Make a fresh ring file (the launcher, before any service opens it)."""
    invariant(capacity >= 4096 and capacity & (capacity - 1) == 0, f"ring capacity {capacity} is not a power of two")
    path = Path(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, HEADER_SIZE + capacity)
        os.pwrite(fd, struct.pack("<QQ", RING_MAGIC, capacity), 0)
    finally:
        os.close(fd)


class Ring:
    """One end of a ring file: `offer` for its producer, `take` for its consumer."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_RDWR)
        try:
            magic, capacity = struct.unpack("<QQ", os.pread(self.fd, 16, 0))
            invariant(magic == RING_MAGIC, f"{self.path} is not a ring")
            self.map = mmap.mmap(self.fd, HEADER_SIZE + capacity)
        except BaseException:
            os.close(self.fd)
            raise
        self.capacity = capacity
        self.slots = memoryview(self.map).cast("q")
        self.data = memoryview(self.map)[HEADER_SIZE:]
        self.offered = self.taken = self.full = 0

    # -- the producer ----------------------------------------------------------------------------

    def offer(self, parts) -> None:
        """Publish one message made of `parts` (bytes-like, joined). RingFull when it does not fit."""
        size = sum(len(part) for part in parts)
        total = _padded(4 + size)
        invariant(total <= self.capacity // 2, f"a message of {size} bytes is too large for {self.path}")
        tail, head = self.slots[TAIL_SLOT], self.slots[HEAD_SLOT]
        invariant(0 <= tail - head <= self.capacity, (tail, head, self.capacity))
        at = tail % self.capacity
        skip = self.capacity - at if at + total > self.capacity else 0
        if tail + skip + total - head > self.capacity:
            self.full += 1
            raise RingFull(f"{self.path.name}: the consumer is {tail - head} bytes behind")
        if skip:
            if skip >= 4:
                _LENGTH.pack_into(self.data, at, WRAP)
            at = 0
        _LENGTH.pack_into(self.data, at, size)
        at += 4
        for part in parts:
            self.data[at: at + len(part)] = part
            at += len(part)
        self.slots[TAIL_SLOT] = tail + skip + total  # commit: after the bytes it publishes
        self.offered += 1

    @property
    def max_message(self) -> int:
        """The most bytes one message may carry (a length and padding make it at most half the ring)."""
        return self.capacity // 2 - 4 - ALIGN

    def consumer_may_sleep(self) -> bool:
        """After `offer`: whether the consumer may be asleep and needs its doorbell rung."""
        if not FENCED:
            return True
        fence()  # the tail's store before the load below (module docstring)
        return self.slots[SLEEPING_SLOT] != 0

    # -- the consumer ----------------------------------------------------------------------------

    def take(self, limit: int = 1 << 30) -> list[bytes]:
        """The messages published and not yet taken, copied out, up to about `limit` bytes (at
        least one); their space is free again when this returns."""
        self.slots[SLEEPING_SLOT] = 0  # awake: producers need not ring (a stale 1 costs a ring, no more)
        head, tail = self.slots[HEAD_SLOT], self.slots[TAIL_SLOT]
        invariant(0 <= tail - head <= self.capacity, (tail, head, self.capacity))
        out, taken = [], 0
        while head < tail and taken < limit:
            at = head % self.capacity
            size = _LENGTH.unpack_from(self.data, at)[0] if self.capacity - at >= 4 else WRAP
            if size == WRAP:
                head += self.capacity - at
                continue
            invariant(_padded(4 + size) <= tail - head, f"{self.path.name}: a message runs past the tail")
            out.append(bytes(self.data[at + 4: at + 4 + size]))
            head += _padded(4 + size)
            taken += size
        self.slots[HEAD_SLOT] = head  # after the copies: the producer may reuse the space now
        self.taken += len(out)
        return out

    def about_to_sleep(self) -> bool:
        """The consumer, before it waits on its doorbell: True when a message came meanwhile
        (then it must not sleep). `take` clears the flag."""
        self.slots[SLEEPING_SLOT] = 1
        if FENCED:
            fence()  # the flag's store before the tail's load (module docstring)
        return self.slots[TAIL_SLOT] != self.slots[HEAD_SLOT]

    def pending_bytes(self) -> int:
        return self.slots[TAIL_SLOT] - self.slots[HEAD_SLOT]

    def statistics(self) -> dict:
        return {"offered": self.offered, "taken": self.taken, "full": self.full, "pendingBytes": self.pending_bytes()}

    def close(self) -> None:
        self.slots.release()
        self.data.release()
        self.map.close()
        os.close(self.fd)


# -- the node's rings: which exist, and where (the launcher makes them; actors.links opens them) --

SMALL_RING = 8 * 1024 * 1024  # replies and held sends: headers only
READ_RING = 2 * 1024 * 1024  # reads, pops, ends and their replies (a few hundred KiB a message:
# actors.links.ReplyOutbox, which sends a reply larger than 1 MiB over a socket)


def data_ring_capacity(settings) -> int:
    """A ring that carries bodies holds at least four of the largest request."""
    need = 4 * (settings.maxMessageSize + 256 * 1024)
    capacity = 16 * 1024 * 1024
    while capacity < need:
        capacity *= 2
    return capacity


def rings(settings) -> dict[str, int]:
    """Every link between two processes of the node: name -> capacity in bytes. The write
    path's exist under split only (compact's front hosts it); the read path's lead to each pull
    worker (split); the pop and transaction services (each its own process in both topologies)
    take their requests and answer on rings too."""
    out = {"front-to-pop": READ_RING, "pop-to-front": READ_RING,
           "front-to-transaction": READ_RING, "transaction-to-front": READ_RING}
    for i in range(settings.pull_processes):
        out |= {f"front-to-pull-{i}": READ_RING, f"pull-{i}-to-front": READ_RING}
    if settings.topology != "split":
        return out
    data = data_ring_capacity(settings)
    out |= {"writer-to-front": SMALL_RING, "writer-to-flush": SMALL_RING, "flush-to-front": SMALL_RING}
    if settings.ingressWorkers == 0:
        out["front-to-writer"] = data
    for i in range(settings.ingressWorkers):
        out |= {f"front-to-ingress-{i}": data, f"ingress-{i}-to-writer": data, f"ingress-{i}-to-front": SMALL_RING}
    return out


SHARED_MEMORY = Path("/dev/shm")


def ring_dir(settings) -> Path:
    """Where the rings live: in memory (tmpfs), never on a disk, where the kernel would write
    every page the producers dirty back for nothing. Under /dev/shm, one private directory per
    run directory; where there is no /dev/shm, the run directory itself (often tmpfs too:
    $XDG_RUNTIME_DIR)."""
    if not SHARED_MEMORY.is_dir() or not os.access(SHARED_MEMORY, os.W_OK):
        return Path(settings.run_dir)
    digest = hashlib.sha1(str(Path(settings.run_dir).resolve()).encode()).hexdigest()[:16]
    return SHARED_MEMORY / f"mqnode-{os.getuid()}-{digest}"


def prepare_ring_dir(settings) -> Path:
    """The launcher, before the services start: the ring directory made private (0700) and
    emptied, or refused when another user owns it or others may enter it."""
    path = ring_dir(settings)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        info = path.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise PermissionError(f"{path} must be a directory of this user with mode 0700: remove it")
    for stale in path.glob("*.ring"):
        stale.unlink()
    return path


def make_rings(settings) -> Path:
    """The launcher, before the services start: every ring of `rings(settings)` made fresh in the
    ring directory, which it returns. Refused (StoreError) when the directory's file
    system has no room for them all: a tmpfs that fills up later would kill the process that
    touches the page past its end (SIGBUS), so a small /dev/shm (a container's 64 MiB) is
    named at start instead."""
    wanted = rings(settings)
    path = prepare_ring_dir(settings)
    need = sum(HEADER_SIZE + capacity for capacity in wanted.values())
    info = os.statvfs(path)
    free = info.f_bavail * info.f_frsize
    if free < need:
        raise StoreError(f"the node's rings need {need >> 20} MiB in {path}, which has {free >> 20} MiB free: "
                         f"give /dev/shm more room (a container: --shm-size=256m) or run fewer "
                         f"pullWorkers / ingressWorkers")
    for name, capacity in wanted.items():
        create(path / f"{name}.ring", capacity)
    return path


def inbound(settings, consumer: str) -> list[str]:
    """The links `consumer` (a process label) reads."""
    return [name for name in rings(settings) if name.endswith(f"-to-{consumer}")]


def wake_path(settings, consumer: str) -> Path:
    return Path(settings.run_dir) / f"wake-{consumer}.fifo"
