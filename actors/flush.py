"""flush: makes the CommitLog durable and answers the sends that wait for it.

Three parts:
- `CommitLogFlusher`: fdatasync up to the published `written`, then publish `flushed` and the
  checkpoint's physicMsgTimestamp (the store time read *before* the flush, so it never claims
  more than is durable). It flushes through its own descriptors: dirty pages of a shared mapping
  belong to the file, whichever process wrote them.
- `Waiting`: the SYNC_FLUSH sends held for the disk, in offset order, each answered PUT_OK once
  `flushed` passes it, or FLUSH_DISK_TIMEOUT after `syncFlushTimeout` (it is stored; only its
  durability is unconfirmed).
- `Flush`, the shell: its own process (split), or a thread of the front's process (compact,
  actors.host: its fdatasync then never stops the router's loop).

SYNC_FLUSH (GroupCommitService): wakes on a wait or every 10 ms; one fdatasync covers every
send waiting at that moment (group commit).
ASYNC_FLUSH (FlushRealTimeService): every `flushIntervalCommitLog` ms, flush when at least
`flushCommitLogLeastPages` pages are dirty, and everything every
`flushCommitLogThoroughInterval` ms.

The shell's links (actors.links: rings between processes, local links within one): in, the
write service's held sends (client, arrival, the offset the send needs flushed, its PUT_OK
reply); out, their replies to the router.

Why a thread of the front's process in compact: a SYNC_FLUSH send otherwise crosses four process
hops (client, front, flush process, front, client), each a cold wake-up on a virtual machine. On
the thread, fdatasync releases the GIL, so the front keeps appending while the disk works, and
the next group commit covers what arrived meanwhile, as RocketMQ's GroupCommitService thread
does beside the CommitLog's writer.
"""

from __future__ import annotations

import errno
import os
import time
from collections import deque

import zmq

from actors.base import Actor, Doorbell, doorbell
from actors.links import inbox, outbox
from actors.wire import pack_replies, waits_from_wire
from actors.sendreply import downgraded
from shm.checkpoint import Checkpoint
from shm.mapped_file import file_name

PAGE = 4096
GROUP_COMMIT_WAKE_MS = 10
CHECKPOINT_FORCE_S = 1.0
MAX_WAITING = 1_000_000  # sends held for the disk; beyond this the oldest are timed out early


class FlushFailed(OSError):
    """A flush of this process failed before: it is never tried again (see CommitLogFlusher)."""


class CommitLogFlusher:
    """fdatasync of the CommitLog up to `written`; publishes `flushed` and the checkpoint.

    Fail-stop: an fdatasync (or the checkpoint's msync) that fails is never retried. After a
    failed writeback Linux may mark the dirty pages clean and drop the error, so a second
    fdatasync "succeeds" over data that never reached the disk, and a SYNC_FLUSH PUT_OK would be
    a lie (PostgreSQL's "fsyncgate"). The first OSError poisons the flusher: it and every later
    call raise, `flushed` stays where it was, and the process dies (its restart is recovery);
    the sends that waited for that flush get no PUT_OK."""

    def __init__(self, settings, control, clock=time.monotonic):
        self.settings = settings
        self.control = control
        self.clock = clock  # seconds; the flush intervals and the checkpoint's cadence (a test's mock)
        self.segment_size = settings.mappedFileSizeCommitLog
        self.directory = settings.commitlog_dir
        self.fds: dict[int, int] = {}
        self.checkpoint = Checkpoint(settings.root / "checkpoint")
        self.flushes = self.flush_ns_total = self.flush_ns_max = 0
        now = clock()
        self.next_flush = now + settings.flushIntervalCommitLog / 1000
        self.next_thorough = now + settings.flushCommitLogThoroughInterval / 1000
        self.next_checkpoint_force = now
        self.failure: OSError | None = None
        self.fdatasyncs = 0
        self.fail_at = _injected_flush_failure()
        self.hang_at = _injected_count("MQNODE_INJECT_FLUSH_HANG")

    def flush_to_written(self) -> int:
        """fdatasync every segment holding unflushed bytes; publish `flushed`. Returns it.
        Raises the OSError of a failed flush, and FlushFailed ever after."""
        if self.failure is not None:
            raise FlushFailed(f"an earlier flush failed ({self.failure}); flushes are never retried")
        try:
            return self._flush_to_written()
        except OSError as e:
            self.failure = e
            raise

    def _flush_to_written(self) -> int:
        store_timestamp = self.control.get("store_timestamp")
        written, flushed = self.control.get("written"), self.control.get("flushed")
        if written <= flushed:
            return flushed
        began = time.monotonic_ns()
        low = max(flushed, self.control.get("min_offset"))  # (an empty slave's log may begin past 0)
        start = low - low % self.segment_size
        for segment_start in range(start, written, self.segment_size):
            self.fdatasyncs += 1
            if self.fdatasyncs == self.hang_at:  # a disk that never returns (tests of hang detection)
                while True:
                    time.sleep(1.0)
            if self.fdatasyncs == self.fail_at:  # the bytes it did not make durable, for the test to check
                with open(self.settings.run_dir / "injected-flush-eio", "a") as log:
                    log.write(f"{flushed} {written}\n")
                raise OSError(errno.EIO, "Input/output error (MQNODE_INJECT_FLUSH_EIO)")
            os.fdatasync(self._fd(segment_start))
        elapsed = time.monotonic_ns() - began
        self.flushes += 1
        self.flush_ns_total += elapsed
        self.flush_ns_max = max(self.flush_ns_max, elapsed)
        self.control.advance("flushed", written)
        self.control.advance("committed", max(written, self.control.get("committed")))
        if store_timestamp > 0:
            # one msync of the checkpoint a second, not one per group commit (RocketMQ forces it
            # from its ConsumeQueue flush, also about once a second)
            now = self.clock()
            force = now >= self.next_checkpoint_force
            if force:
                self.next_checkpoint_force = now + CHECKPOINT_FORCE_S
            self.checkpoint.flush_physic(store_timestamp, force=force)
        # Segments wholly below written's are flushed for good: their descriptors go now, or a
        # segment the clean service deletes would keep its blocks (a slave's catch-up flushes
        # many at once, and a full disk writes nothing more to flush them out later). Written's
        # own stays open, and the clean service never deletes it (not flushed whole).
        self._forget_segments_below(written - written % self.segment_size)
        return written

    def async_turn(self) -> None:
        """ASYNC_FLUSH, called at least every flushIntervalCommitLog ms: flush when due."""
        now = self.clock()
        if now < self.next_flush:
            return
        s = self.settings
        self.next_flush = now + s.flushIntervalCommitLog / 1000
        dirty = self.control.get("written") - self.control.get("flushed")
        if now >= self.next_thorough:
            self.next_thorough = now + s.flushCommitLogThoroughInterval / 1000
            least = 0
        else:
            least = s.flushCommitLogLeastPages * PAGE
        if dirty > least:
            self.flush_to_written()

    def finish(self) -> None:
        """Stop: everything written made durable, the checkpoint forced."""
        self.flush_to_written()
        if self.checkpoint.physic_timestamp:
            self.checkpoint.flush_physic(self.checkpoint.physic_timestamp)

    def _fd(self, segment_start: int) -> int:
        fd = self.fds.get(segment_start)
        if fd is None:
            fd = self.fds[segment_start] = os.open(self.directory / file_name(segment_start), os.O_RDONLY)
        return fd

    def _forget_segments_below(self, start: int) -> None:
        for segment_start in [s for s in self.fds if s < start]:
            os.close(self.fds.pop(segment_start))

    def statistics(self) -> dict:
        return {"mode": self.settings.flushDiskType, "flushes": self.flushes,
                "flushAvgMicros": self.flush_ns_total // max(1, self.flushes) // 1000,
                "flushMaxMicros": self.flush_ns_max // 1000,
                "flushed": self.control.get("flushed") if self.control else 0}

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        self.checkpoint.close()


class Waiting:
    """Sends held until the disk has them (SYNC_FLUSH) and/or a slave has them (SYNC_MASTER):
    (client, arrival ns, offset to be flushed, header, offset to be replicated), in append
    order (one writer appends them in order). 0 for an offset means "no need"."""

    def __init__(self, timeout_ms: int, clock_ns=time.monotonic_ns):
        self.timeout_ns = timeout_ms * 1_000_000
        self.clock_ns = clock_ns  # the arrival times it is given are of this clock
        self.items: deque[tuple] = deque()
        self.answered = self.timeouts = self.slave_timeouts = 0

    def __len__(self) -> int:
        return len(self.items)

    def add(self, waits) -> list[tuple]:
        """Hold `waits`; returns the replies of the oldest, timed out early past MAX_WAITING."""
        self.items.extend(waits)
        overflow = []
        while len(self.items) > MAX_WAITING:
            overflow.append(self._time_out(self.items.popleft(), 0, 0))
        return overflow

    def settle(self, flushed: int, acked: int = 2**63 - 1, *, everyone: bool = False) -> list[tuple]:
        """The replies now due, as (client, arrival ns, header): PUT_OK for each send `flushed`
        and `acked` (a slave's confirmed offset) cover, FLUSH_DISK_TIMEOUT or
        FLUSH_SLAVE_TIMEOUT (the replication's status applied last, as RocketMQ combines them)
        for each that waited `syncFlushTimeout` (or all the rest, `everyone`, at stop)."""
        items, replies = self.items, []
        while items and items[0][2] <= flushed and items[0][4] <= acked:
            client, arrival_ns, _, header, _ = items.popleft()
            replies.append((client, arrival_ns, header))
        self.answered += len(replies)
        if items:
            deadline = self.clock_ns() - self.timeout_ns
            if everyone or any(wait[1] < deadline for wait in items):
                kept = deque()
                for wait in items:
                    if wait[2] <= flushed and wait[4] <= acked:
                        replies.append((wait[0], wait[1], wait[3]))
                    elif everyone or wait[1] < deadline:
                        replies.append(self._time_out(wait, flushed, acked))
                    else:
                        kept.append(wait)
                self.items = kept
        return replies

    def _time_out(self, wait: tuple, flushed: int, acked: int) -> tuple:
        if wait[4] > acked:
            self.slave_timeouts += 1
            return wait[0], wait[1], downgraded(wait[3], "FLUSH_SLAVE_TIMEOUT")
        self.timeouts += 1
        return wait[0], wait[1], downgraded(wait[3], "FLUSH_DISK_TIMEOUT")

    def statistics(self) -> dict:
        return {"waiting": len(self.items), "answered": self.answered, "flushDiskTimeouts": self.timeouts,
                "flushSlaveTimeouts": self.slave_timeouts}


class Flush(Actor):
    """The group commit's shell: held sends in, their replies to the router, the ha-server's
    acks (SYNC_MASTER) on the `acked` doorbell."""

    name = "flush"

    def __init__(self, settings, **kwargs):
        super().__init__(settings, **kwargs)
        self.sync = settings.sync_flush
        self.flusher: CommitLogFlusher | None = None
        self.waiting = Waiting(settings.syncFlushTimeout)
        self.inbox = self.replies = None
        self.acked_in: Doorbell | None = None

    def open(self) -> None:
        s = self.settings
        self.flusher = CommitLogFlusher(s, self.control)
        self.inbox = inbox(self, waits_from_wire)  # the write service's held sends
        self.replies = outbox(self, "flush-to-front", lambda replies: [pack_replies(replies)])
        self.acked_in = doorbell(s, "acked", listen=True)  # the ha-server's acks (SYNC_MASTER)
        self.items = [*self.inbox.poll_items(), (self.acked_in.fileno(), zmq.POLLIN)]

    def poll_items(self) -> list:
        return self.items

    def timeout_ms(self) -> int:
        timeout = GROUP_COMMIT_WAKE_MS if (self.sync or self.waiting) else min(50, self.settings.flushIntervalCommitLog)
        return self.inbox.wait_ms(timeout)

    def step(self, events: set) -> None:
        self._take_waits()
        if self.acked_in.fileno() in events:
            self.acked_in.drain()
        if self.sync:
            if self.waiting or self.control.get("written") > self.control.get("flushed"):
                self.flusher.flush_to_written()
        else:
            self.flusher.async_turn()
        if self.waiting:
            self._send(self.waiting.settle(self.control.get("flushed"), self.control.get("slave_acked")))

    def _take_waits(self) -> None:
        for waits in self.inbox.take():
            self._send(self.waiting.add(waits))

    def _send(self, replies: list[tuple]) -> None:
        if replies:
            self.replies.send_waiting(replies)

    def drain(self) -> None:
        """Stop: flush what was written and answer everyone still waiting."""
        self._take_waits()
        self.flusher.finish()
        self._send(self.waiting.settle(self.control.get("flushed"), self.control.get("slave_acked"), everyone=True))

    def statistics(self) -> dict:
        stats = super().statistics() | self.waiting.statistics()
        if self.flusher is not None:
            stats |= self.flusher.statistics()
        return stats

    def close(self) -> None:
        for end in (self.flusher, self.inbox, self.acked_in):
            if end is not None:
                end.close()
        if self.replies is not None and not self.replies.local:  # (a local link: the host's)
            self.replies.close()
        super().close()


def _injected_flush_failure() -> int:
    """`MQNODE_INJECT_FLUSH_EIO=N`: the N-th fdatasync of each flusher fails with EIO (tests of
    fail-stop on a real node; unset, 0: never)."""
    return _injected_count("MQNODE_INJECT_FLUSH_EIO")


def _injected_count(variable: str) -> int:
    """A test's injection: `MQNODE_INJECT_FLUSH_HANG=N`, the N-th fdatasync of each flusher never
    returns; unset, 0: never."""
    text = os.environ.get(variable, "")
    return int(text) if text.isdigit() else 0
