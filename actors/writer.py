"""writer: the single writer of the CommitLog.

Sockets: `records` PULL, bound at `writer` (encoded groups from the ingress workers, or raw
send requests from the front when `ingressWorkers = 0`, which it encodes itself); `replies`
PUSH to the front; `waits` PUSH to the flush actor (SYNC_FLUSH sends that wait for the disk);
`wakes` PUSH, conflated, to the dispatcher: "written moved", once per turn that moved it,
unless the dispatcher is polling (actors.dispatcher).

In the compact topology (the default, node.server.topology) no writer process runs: the front
opens this class's write core (`open_writes`, `append_requests`, `finish_turn`, `idle`,
`drain`, `close_writes`) and is the CommitLog's single writer; a request then crosses one hop
and wakes one process fewer (docs/performance.md).

Per group: one append (one copy per segment, three patches per record), then the written
position and store time are published in the control block, then the replies go out: to the
front at once, or through the flush actor when the send must be durable first. Data first,
counter second, reply third: a reader never sees an unpublished record, a client never hears
of an unwritten one.

Write-buffer mode (`transientStorePoolEnable`, ASYNC_FLUSH only): records are acked once
appended, but `written` (what readers and the flush actor see) moves only at each commit,
every `commitIntervalCommitLog` ms. mqnode's buffer is the mapping itself, beyond the published
end: a writer crash loses what was not yet committed, as RocketMQ's pool loses it, and the
restarted writer overwrites it.

Restart (Ray restarts a killed writer): it resumes at the control block's `written`. Its
queue-offset table is the one recovery built at start-up (passed in by the supervisor) advanced
over the records appended since, re-read from the log.
"""

from __future__ import annotations

import time

import zmq

from actors.base import Actor, conflated, incoming, socket, wait_readable
from actors.ingress import RequestBatcher
from actors.wire import group_from_wire, pack_replies, waits_to_wire
from node.client.frames import NOBLOCK
from node.server import sendcore, sendreply
from shm import commitlog
from shm.codec import (
    TRANSACTION_COMMIT,
    TRANSACTION_MASK,
    TRANSACTION_NOT,
    Record,
)
from shm.commitlog import CommitLog, RecordTooLarge
from shm.control_block import (
    FLAG_DISK_FULL,
    FLAG_LOGICS_WRITE_ERROR,
    FLAG_SHUTTING_DOWN,
)
from shm.mapped_file import AllocationFailed, StoreError

MAX_GROUPS = 64  # groups appended per turn before replies are flushed out
# A wake-up is skipped only while the dispatcher's promise to look again has this long to run:
# its look then comes well after the write, which any core sees by then.
WAKE_MARGIN_NS = 200_000

class Writer(Actor):
    name = "writer"

    def __init__(self, settings, *, queue_offsets: dict[str, int] | None = None, recovered_offset: int = 0):
        super().__init__(settings)
        self.recovered_queue_offsets = dict(queue_offsets or {})
        self.recovered_offset = recovered_offset
        self.put_times = self.put_bytes = self.put_failed = self.groups = 0
        self.append_ns_max = 0
        self.scrubbed = 0
        self.busy_ns = self.queue_wait_ns = 0  # time spent working; time groups waited before it

    def open(self) -> None:
        self.open_writes()
        self.records = socket(self.context, zmq.PULL, hwm=max(1000, self.settings.sendQueueCapacity))
        self.records.bind(self.endpoints["writer"])
        self.poll_items = [(self.records, zmq.POLLIN)]
        self.replies = socket(self.context, zmq.PUSH, hwm=100000)
        self.replies.connect(self.endpoints["replies"])

    def open_writes(self) -> None:
        """The write core: the CommitLog, the encoder and the sockets to the flush actor and the
        dispatcher (what the front opens when it writes itself, the compact topology)."""
        s = self.settings
        self.log = CommitLog(s.commitlog_dir, s.mappedFileSizeCommitLog)
        self.log.segments.load()
        written = self.control.get("written")
        if self.control.get("writer_generation") == self.control.get("generation"):
            # Ray restarted us mid-run: what the predecessor appended past `written` must go
            self.scrubbed = self.log.discard_after(written)
        self.control.set("writer_generation", self.control.get("generation"))
        self.log.segments.resume_at(written)
        self.log.queue_offsets = self._queue_offsets(written)
        self.batcher = RequestBatcher(s) if s.ingressWorkers == 0 else None
        self.store_host = self.batcher.encoder.store_host if self.batcher else sendcore.SendEncoder(s).store_host
        self.sync_flush = s.sync_flush
        # Write-buffer mode, as RocketMQ applies it: only with ASYNC_FLUSH on a master.
        self.buffered = s.transientStorePoolEnable and not s.sync_flush and s.brokerRole != "SLAVE"
        self.end, self.end_timestamp = written, self.control.get("store_timestamp")
        self.poll_ms = min(50, s.commitIntervalCommitLog) if self.buffered else 50
        self.next_commit = self.next_thorough_commit = time.monotonic()
        self.commits = 0
        self.waits = None
        if not s.front_flushes:
            self.waits = socket(self.context, zmq.PUSH, hwm=100000)
            self.waits.connect(self.endpoints["flush"])
        self.wakes = conflated(self.context, zmq.PUSH)
        self.wakes.connect(self.endpoints["reput"])
        self.wake_due = False
        self.wakes_sent = self.wakes_skipped = 0
        self.wake_now = False
        self.pending_waits: list = []

    def _queue_offsets(self, written: int) -> dict[str, int]:
        """Recovery's table, advanced over what was appended since start-up (a restarted writer)."""
        table = dict(self.recovered_queue_offsets)
        begin = self.recovered_offset
        for item in self.log.iterate(begin, limit=written, read_body=False) if written > begin else ():
            if not isinstance(item, Record):
                raise StoreError(f"the CommitLog below the published end {written} is damaged at {item.position}")
            if item.sys_flag & TRANSACTION_MASK in (TRANSACTION_NOT, TRANSACTION_COMMIT):
                key = f"{item.topic}-{item.queue_id}"
                table[key] = max(table.get(key, 0), item.queue_offset + 1)
        return table

    # -- the loop ----------------------------------------------------------------------------------

    def turn(self) -> None:
        if not wait_readable(self.poll_items, self.poll_ms):
            self.idle()
            return
        replies = self.append_requests(list(incoming(self.records, MAX_GROUPS)))
        if replies:
            self.replies.send(pack_replies(replies))
        self.finish_turn()

    def append_requests(self, messages: list[list[bytes]]) -> list:
        """Append what the requests carry (raw from the front: encoded together, so a turn's
        requests share one append; or groups the ingress workers encoded). Returns the replies
        to send at once, as (client, arrival_ns, header); those that must wait for the disk
        collect in `pending_waits` as (client, arrival_ns, offset to flush, header), sent to the
        flush actor in `finish_turn`, after the replies (or taken by a front that flushes)."""
        replies: list = []
        began = time.monotonic_ns()
        if self.batcher is not None:
            groups, refused = self.batcher.build(messages)
            replies.extend(refused)
        else:
            groups = [group for frames in messages for group in self._from_ingress(frames)]
        for batch, pendings, atomic in groups:
            if pendings:
                self.queue_wait_ns += began - min(p.arrival_ns for p in pendings)
            self._append(batch, pendings, atomic, replies, self.pending_waits)
        self.busy_ns += time.monotonic_ns() - began
        return replies

    def take_waits(self) -> list:
        """This turn's sends that wait for the disk (a front that flushes holds them itself)."""
        waits, self.pending_waits = self.pending_waits, []
        return waits

    def finish_turn(self) -> None:
        if self.pending_waits and self.waits is not None:
            self.waits.send(waits_to_wire(self.take_waits()))
        self.idle()

    def idle(self) -> None:
        """Each turn, busy or not: a write-buffer commit when one is due, the dispatcher's wake."""
        self._commit(force=False)
        self._wake_dispatcher()

    def _publish(self, offset: int, store_timestamp: int) -> None:
        self.control.set("store_timestamp", store_timestamp)
        self.control.advance("written", offset)
        self.wake_due = True

    def _wake_dispatcher(self) -> None:
        """One wake-up per turn that moved `written` (after the replies: they are what a
        client waits for), unless the dispatcher promised to look again anyway
        (`reput_polling_until`, actors.dispatcher); and whenever a consumer waits for a
        lagging dispatcher (`wake_now`, set by a front that holds pulls). Conflated: a
        dispatcher still busy finds one message, not many."""
        if self.wake_due or self.wake_now:
            self.wake_due = False
            if not self.wake_now and time.monotonic_ns() < self.control.get("reput_polling_until") - WAKE_MARGIN_NS:
                self.wakes_skipped += 1
                return
            self.wakes_sent += 1
            try:
                self.wakes.send(b"", NOBLOCK)
            except zmq.Again:
                pass  # the dispatcher is not there (restarting): its timer catches up

    def _from_ingress(self, frames: list[bytes]) -> list:
        """An ingress worker's group: our own frames, so one that does not decode is a bug and
        stops this process (a dropped group would leave its senders without a reply)."""
        return [group_from_wire(frames)]

    def _append(self, batch, pendings, atomic: bool, replies: list, waits: list) -> None:
        status, remark, result = self._place(batch, atomic)
        physical = result.physical_offsets if result else []
        queue = result.queue_offsets if result else []
        for pending in pendings:
            appended = [i for i in pending.indices if i >= 0]
            if result is None:
                for i, index in enumerate(pending.indices):
                    if index >= 0:
                        pending.indices[i] = -1
                        pending.refusals[i] = (status, remark)
            if pending.oneway:
                continue
            header = sendreply.answer(pending, physical, queue, self.store_host)
            if result is not None and appended and self.sync_flush and pending.wait:
                last = max(appended)
                waits.append((pending.client, pending.arrival_ns, physical[last] + batch.sizes[last], header))
            else:
                replies.append((pending.client, pending.arrival_ns, header))

    def _place(self, batch, atomic: bool):
        """Append and publish; (status, remark, result) with result None when nothing was stored."""
        if not len(batch):
            return "PUT_OK", "", None
        if self.control.has_flag(FLAG_SHUTTING_DOWN):
            return self._failed(batch, "SERVICE_NOT_AVAILABLE", "the node is shutting down")
        if self.control.has_flag(FLAG_DISK_FULL):
            return self._failed(batch, "SERVICE_NOT_AVAILABLE", "the disk is full: the store is not writable")
        if self.control.has_flag(FLAG_LOGICS_WRITE_ERROR):
            return self._failed(batch, "SERVICE_NOT_AVAILABLE",
                                "ConsumeQueue/index writes are failing (disk full?): the store is not writable")
        began = time.monotonic_ns()
        store_timestamp = int(time.time() * 1000)
        table = self.log.queue_offsets
        saved = {key: table.get(key) for key in set(batch.queue_keys)}  # to undo a half-placed batch
        try:
            result = self.log.append_batch(batch, store_timestamp, atomic=atomic)
        except (AllocationFailed, RecordTooLarge) as e:
            for key, value in saved.items():
                if value is None:
                    table.pop(key, None)
                else:
                    table[key] = value
            status = "CREATE_MAPEDFILE_FAILED" if isinstance(e, AllocationFailed) else "MESSAGE_ILLEGAL"
            return self._failed(batch, status, str(e))
        self.end, self.end_timestamp = result.offset_written, store_timestamp
        if not self.buffered:
            self._publish(result.offset_written, store_timestamp)
        self.append_ns_max = max(self.append_ns_max, time.monotonic_ns() - began)
        self.put_times += len(batch)
        self.put_bytes += batch.size_bytes
        self.groups += 1
        return "PUT_OK", "", result

    def _failed(self, batch, status: str, remark: str):
        self.put_failed += len(batch)
        # a failed append may have placed part of the batch and closed a segment with a blank;
        # nothing of it was published, so it is zeroed and the log resumes at its end.
        self.scrubbed += self.log.discard_after(self.end)
        self.log.segments.resume_at(self.end)
        return status, remark, None

    # -- write-buffer mode ---------------------------------------------------------------------------

    def _commit(self, *, force: bool) -> None:
        """transientStorePoolEnable: appended bytes become readable (and flushable) only here,
        every commitIntervalCommitLog ms once commitCommitLogLeastPages pages wait, or at
        commitCommitLogThoroughInterval / stop whatever waits."""
        if not self.buffered:
            return
        pending = self.end - self.control.get("written")
        now = time.monotonic()
        if pending <= 0 or (not force and now < self.next_commit):
            return
        s = self.settings
        thorough = now >= self.next_thorough_commit
        if not (force or thorough or pending >= s.commitCommitLogLeastPages * 4096):
            return
        self.next_commit = now + s.commitIntervalCommitLog / 1000
        if thorough:
            self.next_thorough_commit = now + s.commitCommitLogThoroughInterval / 1000
        self._publish(self.end, self.end_timestamp)
        self.commits += 1

    def drain(self) -> None:
        self._commit(force=True)
        self._wake_dispatcher()

    def statistics(self) -> dict:
        return super().statistics() | {
            "putMessageTimesTotal": self.put_times, "putMessageSizeTotal": self.put_bytes,
            "putMessageFailedTimes": self.put_failed, "groups": self.groups,
            "appendMaxMicros": self.append_ns_max // 1000, "busySeconds": round(self.busy_ns / 1e9, 3),
            "queueWaitMicrosAvg": self.queue_wait_ns // max(1, self.groups) // 1000,
            "nativeEncode": self.batcher.encoder.native if getattr(self, "batcher", None) else False,
            "nativePlace": commitlog.NATIVE,
            "dispatcherWakes": getattr(self, "wakes_sent", 0), "dispatcherWakesSkipped": getattr(self, "wakes_skipped", 0),
            "writeBuffer": getattr(self, "buffered", False), "scrubbedBytes": self.scrubbed, "commits": getattr(self, "commits", 0), "written": self.control.get("written") if self.control else 0,
            "queues": len(self.log.queue_offsets) if hasattr(self, "log") else 0,
        }

    def close_writes(self) -> None:
        """Close the write core (the front's, in the compact topology; the control block is the
        front's, not closed here)."""
        for name in ("waits", "wakes"):
            if getattr(self, name, None) is not None:
                getattr(self, name).close(0)
        if hasattr(self, "log"):
            self.log.close()

    def close(self) -> None:
        if hasattr(self, "log"):
            self.log.close()
        super().close()
