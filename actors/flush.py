"""flush: makes the CommitLog durable and answers the sends that wait for it.

Sockets: `waits` PULL, bound at `flush` (from the writer: client, arrival, the offset the send
needs flushed, its PUT_OK reply); `replies` PUSH to the front.

SYNC_FLUSH (GroupCommitService): wakes on a wait or every 10 ms; one fdatasync covers every
send waiting at that moment (group commit), then each send whose offset is now durable is
answered PUT_OK; one still waiting after `syncFlushTimeout` is answered FLUSH_DISK_TIMEOUT (it
is stored; only its durability is unconfirmed).
ASYNC_FLUSH (FlushRealTimeService): every `flushIntervalCommitLog` ms, flush when at least
`flushCommitLogLeastPages` pages are dirty, and everything every
`flushCommitLogThoroughInterval` ms.

Either way it publishes `flushed` in the control block and advances the checkpoint's
physicMsgTimestamp to the store time read *before* the flush (so it never claims more than is
durable). It flushes by fdatasync on its own descriptors: dirty pages of a shared mapping
belong to the file, whichever process wrote them.
"""

from __future__ import annotations

import os
import time
from collections import deque

import orjson
import zmq

from actors.base import Actor, pack_replies, socket
from shm.checkpoint import Checkpoint
from shm.mapped_file import file_name

PAGE = 4096
GROUP_COMMIT_WAKE_MS = 10
CHECKPOINT_FORCE_S = 1.0
MAX_WAITING = 1_000_000  # sends held for the disk; beyond this the oldest are timed out early


class Flush(Actor):
    name = "flush"

    def open(self) -> None:
        s = self.settings
        self.sync = s.sync_flush
        self.segment_size = s.mappedFileSizeCommitLog
        self.directory = s.commitlog_dir
        self.fds: dict[int, int] = {}
        self.checkpoint = Checkpoint(s.root / "checkpoint")
        self.waits_in = socket(self.context, zmq.PULL, hwm=100000)
        self.waits_in.bind(self.endpoints["flush"])
        self.replies = socket(self.context, zmq.PUSH, hwm=100000)
        self.replies.connect(self.endpoints["replies"])
        self.waiting: deque[list] = deque()  # [client hex, arrival ns, offset, header], offset order
        self.flushes = self.flush_ns_total = self.flush_ns_max = self.timeouts = self.answered = 0
        now = time.monotonic()
        self.next_flush = now + s.flushIntervalCommitLog / 1000
        self.next_thorough = now + s.flushCommitLogThoroughInterval / 1000
        self.next_checkpoint_force = now

    # -- the loop ----------------------------------------------------------------------------------

    def turn(self) -> None:
        timeout = GROUP_COMMIT_WAKE_MS if self.sync else min(50, self.settings.flushIntervalCommitLog)
        if self.waits_in.poll(timeout):
            self._take_waits()
        if self.sync:
            if self.waiting or self.control.get("written") > self.control.get("flushed"):
                self.flush_to_written()
            self._answer()
        else:
            self._async_flush()

    def _take_waits(self) -> None:
        for _ in range(1000):
            try:
                self.waiting.extend(orjson.loads(self.waits_in.recv(zmq.NOBLOCK)))
            except zmq.Again:
                break
        while len(self.waiting) > MAX_WAITING:
            self._time_out(self.waiting.popleft())

    def _async_flush(self) -> None:
        now = time.monotonic()
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

    def flush_to_written(self) -> int:
        """fdatasync every segment holding unflushed bytes; publish `flushed`. Returns it."""
        store_timestamp = self.control.get("store_timestamp")
        written, flushed = self.control.get("written"), self.control.get("flushed")
        if written <= flushed:
            return flushed
        began = time.monotonic_ns()
        start = flushed - flushed % self.segment_size
        for segment_start in range(start, written, self.segment_size):
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
            now = time.monotonic()
            force = now >= self.next_checkpoint_force
            if force:
                self.next_checkpoint_force = now + CHECKPOINT_FORCE_S
            self.checkpoint.flush_physic(store_timestamp, force=force)
        self._forget_segments_below(start)
        return written

    def _fd(self, segment_start: int) -> int:
        fd = self.fds.get(segment_start)
        if fd is None:
            fd = self.fds[segment_start] = os.open(self.directory / file_name(segment_start), os.O_RDONLY)
        return fd

    def _forget_segments_below(self, start: int) -> None:
        for segment_start in [s for s in self.fds if s < start]:
            os.close(self.fds.pop(segment_start))

    # -- answering ---------------------------------------------------------------------------------

    def _answer(self) -> None:
        flushed = self.control.get("flushed")
        deadline = time.monotonic_ns() - self.settings.syncFlushTimeout * 1_000_000
        done, kept = [], deque()
        for wait in self.waiting:
            if wait[2] <= flushed:
                done.append((bytes.fromhex(wait[0]), wait[1], wait[3].encode()))
            elif wait[1] < deadline:
                self._time_out(wait)
            else:
                kept.append(wait)
        self.waiting = kept
        if done:
            self.answered += len(done)
            self.replies.send(pack_replies(done))

    def _time_out(self, wait: list) -> None:
        self.timeouts += 1
        header = orjson.loads(wait[3])
        _downgrade(header, "FLUSH_DISK_TIMEOUT")
        self.replies.send(pack_replies([(bytes.fromhex(wait[0]), wait[1], orjson.dumps(header))]))

    def drain(self) -> None:
        """Stop: flush what was written and answer everyone still waiting."""
        self._take_waits()
        self.flush_to_written()
        self._answer()
        for wait in list(self.waiting):
            self._time_out(wait)
        self.waiting.clear()
        if self.checkpoint.physic_timestamp:
            self.checkpoint.flush_physic(self.checkpoint.physic_timestamp)

    def statistics(self) -> dict:
        return super().statistics() | {
            "mode": "SYNC_FLUSH" if self.sync else "ASYNC_FLUSH", "flushes": self.flushes,
            "flushAvgMicros": self.flush_ns_total // max(1, self.flushes) // 1000,
            "flushMaxMicros": self.flush_ns_max // 1000, "waiting": len(self.waiting), "answered": self.answered,
            "flushDiskTimeouts": self.timeouts, "flushed": self.control.get("flushed") if self.control else 0}

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        if hasattr(self, "checkpoint"):
            self.checkpoint.close()
        super().close()


def _downgrade(header: dict, status: str) -> None:
    """A stored-but-not-durable reply: PUT_OK becomes `status` (and its code)."""
    from node.protocol import STATUS_CODES

    if header.get("status") == "PUT_OK":
        header["status"], header["code"] = status, STATUS_CODES[status]
    for result in header.get("results") or []:
        if result.get("status") == "PUT_OK":
            result["status"] = status
