"""writer: the single writer of the CommitLog.

Links (actors.links, rings in shared memory): in, the front's sends when `ingressWorkers = 0`
(which it encodes itself) or each ingress worker's encoded groups; out, replies to the front
and the held sends (SYNC_FLUSH, SYNC_MASTER) to the flush process. Socket: `wakes` PUSH,
conflated, to the dispatcher: "written moved", once per turn that moved it,
unless the dispatcher is polling (actors.dispatcher).

The service is two classes: `WriteCore`, the single writer's logic with no socket (the control
block, the CommitLog and a clock in; replies, flush waits and "wake the dispatcher" out), and
`Writer`, the thin shell that owns the links and sockets. The shell runs alone in the writer
process (split), or in the front's process loop beside the router (compact, actors.host): then
its links to the router and the group commit are local, and a send crosses no process.

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

from actors.base import Actor, Doorbell, conflated, doorbell
from actors.ingress import RequestBatcher
from actors.links import inbox, outbox
from actors.wire import group_from_wire, pack_replies, split_frames, waits_to_wire
from node.frames import NOBLOCK
from actors import sendcore, sendreply
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
    ROLE_CODES,
)
from shm.mapped_file import AllocationFailed, StoreError

# A wake-up is skipped only while the dispatcher's promise to look again has this long to run:
# its look then comes well after the write, which any core sees by then.
WAKE_MARGIN_NS = 200_000


MAX_TOPICS = 10_000  # per-topic put counters kept; the rest share OTHER_TOPICS
OTHER_TOPICS = "_other"


class TopicPuts:
    """Sends answered, per topic and status, and the bytes stored per topic: the metrics'
    `mqnode_put_messages_total` and `mqnode_put_bytes_total`."""

    def __init__(self):
        self.messages: dict[str, dict[str, int]] = {}
        self.bytes: dict[str, int] = {}

    def count(self, pending, sizes) -> None:
        topics, indices = pending.topics, pending.indices
        if not topics:
            return
        first = topics[0]
        if (not pending.refusals and topics.count(first) == len(topics)
                and indices[-1] - indices[0] + 1 == len(indices)):  # one topic, all stored together
            statuses = self._statuses(first)
            statuses["PUT_OK"] = statuses.get("PUT_OK", 0) + len(topics)
            self.bytes[first] = self.bytes.get(first, 0) + sum(sizes[indices[0]: indices[-1] + 1])
            return
        for i, (topic, index) in enumerate(zip(topics, indices)):
            status = "PUT_OK" if index >= 0 else pending.refusals.get(i, ("UNKNOWN_ERROR",))[0]
            statuses = self._statuses(topic)
            topic = topic if topic in self.messages else OTHER_TOPICS
            statuses[status] = statuses.get(status, 0) + 1
            if index >= 0:
                self.bytes[topic] = self.bytes.get(topic, 0) + sizes[index]

    def _statuses(self, topic: str) -> dict[str, int]:
        """The topic's counts; past MAX_TOPICS names (a client's refused names count too) they
        share OTHER_TOPICS, so a flood of made-up names cannot grow this without bound."""
        statuses = self.messages.get(topic)
        if statuses is None:
            key = topic if len(self.messages) < MAX_TOPICS else OTHER_TOPICS
            statuses = self.messages.setdefault(key, {})
        return statuses

    def statistics(self) -> dict:
        return {topic: {"messages": dict(statuses), "bytes": self.bytes.get(topic, 0)}
                for topic, statuses in self.messages.items()}


class WriteCore:
    """The CommitLog's single writer, without I/O but the log's own: requests (or encoded groups)
    in; replies, SYNC_FLUSH waits and the dispatcher's wake-up out. `clock` (monotonic seconds)
    times the write-buffer commits, `wall_ms` stamps STORETIMESTAMP; a test passes its own."""

    def __init__(self, settings, control, *, queue_offsets: dict[str, int] | None = None, recovered_offset: int = 0,
                 clock=time.monotonic, wall_ms=None):
        self.settings = settings
        self.control = control
        self.clock = clock
        self.wall_ms = wall_ms or (lambda: time.time_ns() // 1_000_000)
        self.recovered_queue_offsets = dict(queue_offsets or {})
        self.recovered_offset = recovered_offset
        self.put_times = self.put_bytes = self.put_failed = self.groups = 0
        self.by_topic = TopicPuts()
        self.append_ns_max = 0
        self.scrubbed = 0
        self.busy_ns = self.queue_wait_ns = 0  # time spent working; time groups waited before it
        s = settings
        self.log = CommitLog(s.commitlog_dir, s.mappedFileSizeCommitLog, keep_free=s.commitlog_headroom)
        self.log.segments.load()
        written = control.get("written")
        if control.get("writer_generation") == control.get("generation"):
            # a restart mid-run (Ray restarted the process): what the predecessor appended past
            # `written` must go
            self.scrubbed = self.log.discard_after(written)
        control.set("writer_generation", control.get("generation"))
        self.log.segments.resume_at(written)
        self.log.queue_offsets = self._queue_offsets(written)
        self.batcher = RequestBatcher(s) if s.ingressWorkers == 0 else None
        self.store_host = self.batcher.encoder.store_host if self.batcher else sendcore.SendEncoder(s).store_host
        self.sync_flush = s.sync_flush
        # Write-buffer mode, as RocketMQ applies it: only with ASYNC_FLUSH on a master.
        self.buffered = s.transientStorePoolEnable and not s.sync_flush and s.brokerRole != "SLAVE"
        self.end, self.end_timestamp = written, control.get("store_timestamp")
        self.poll_ms = min(50, s.commitIntervalCommitLog) if self.buffered else 50
        self.next_commit = self.next_thorough_commit = clock()
        self.commits = 0
        self.wake_due = False  # `written` moved since the dispatcher was last woken
        self.wake_now = False  # a reader waits for the dispatcher: wake it whatever it promised
        self.wakes_sent = self.wakes_skipped = 0
        self.pending_waits: list = []
        self.slave_not_available = 0
        self.ha_wake_due = False  # `written` moved since the ha-server was last woken

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

    def append_requests(self, messages: list[list[bytes]]) -> list:
        """Append what the requests carry (raw from the router: encoded together, so a turn's
        requests share one append; or groups the ingress workers encoded). Returns the replies
        to send at once, as (client, arrival_ns, header); those that must wait for the disk
        collect in `pending_waits` as (client, arrival_ns, offset to flush, header)."""
        replies: list = []
        began = time.monotonic_ns()
        if self.batcher is not None:
            groups, refused = self.batcher.build(messages)
            replies.extend(refused)
        else:
            # an ingress worker's groups: our own frames, so one that does not decode is a bug and
            # stops this process (a dropped group would leave its senders without a reply)
            groups = [group_from_wire(frames) for frames in messages]
        for batch, pendings, atomic in groups:
            if pendings:
                self.queue_wait_ns += began - min(p.arrival_ns for p in pendings)
            self._append(batch, pendings, atomic, replies, self.pending_waits)
        self.busy_ns += time.monotonic_ns() - began
        return replies

    def take_waits(self) -> list:
        """The sends appended since the last call that wait for the disk."""
        waits, self.pending_waits = self.pending_waits, []
        return waits

    def idle(self) -> None:
        """Each turn, busy or not: a write-buffer commit when one is due."""
        self._commit(force=False)

    def take_wake(self, now_ns: int) -> bool:
        """Whether to wake the dispatcher now: once per turn that moved `written` (after the
        replies: they are what a client waits for), unless the dispatcher promised to look again
        anyway (`reput_polling_until`, actors.dispatcher; `now_ns` is the shared monotonic
        clock's); and whenever a reader waits for a lagging dispatcher (`wake_now`)."""
        if not (self.wake_due or self.wake_now):
            return False
        self.wake_due = False
        if not self.wake_now and now_ns < self.control.get("reput_polling_until") - WAKE_MARGIN_NS:
            self.wakes_skipped += 1
            return False
        self.wakes_sent += 1
        return True

    def _publish(self, offset: int, store_timestamp: int) -> None:
        self.control.set("store_timestamp", store_timestamp)
        self.control.advance("written", offset)
        self.wake_due = self.ha_wake_due = True

    def slave_ok(self) -> bool:
        """SYNC_MASTER's check (spec §12): a slave follows, and it is less than
        haSlaveFallbehindMax behind."""
        control = self.control
        return (control.get("ha_slaves") > 0
                and control.get("written") - control.get("slave_acked") < self.settings.haSlaveFallbehindMax)

    def _append(self, batch, pendings, atomic: bool, replies: list, waits: list) -> None:
        status, remark, result = self._place(batch, atomic)
        sync_master = self.control.get("role") == ROLE_CODES["SYNC_MASTER"]  # (`admin role` may switch it)
        slave_ok = sync_master and self.slave_ok()
        physical = result.physical_offsets if result else []
        queue = result.queue_offsets if result else []
        for pending in pendings:
            appended = [i for i in pending.indices if i >= 0]
            if result is None:
                for i, index in enumerate(pending.indices):
                    if index >= 0:
                        pending.indices[i] = -1
                        pending.refusals[i] = (status, remark)
            self.by_topic.count(pending, batch.sizes)
            if pending.oneway:
                continue
            header = sendreply.answer(pending, physical, queue, self.store_host)
            if result is None or not appended or not pending.wait or not (self.sync_flush or sync_master):
                replies.append((pending.client, pending.arrival_ns, header))
                continue
            last = max(appended)
            end = physical[last] + batch.sizes[last]
            replicate = end if sync_master and slave_ok else 0
            if sync_master and not slave_ok:  # RocketMQ: at once, no wait for a slave
                header = sendreply.downgraded(header, "SLAVE_NOT_AVAILABLE")
                self.slave_not_available += 1
            if self.sync_flush or replicate:
                waits.append((pending.client, pending.arrival_ns, end if self.sync_flush else 0, header, replicate))
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
        store_timestamp = self.wall_ms()
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
        now = self.clock()
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

    def follow_min_offset(self, min_offset: int) -> None:
        self.log.segments.forget_deleted_head()

    def drain(self) -> None:
        """At stop: what a write buffer holds becomes readable."""
        self._commit(force=True)

    def statistics(self) -> dict:
        return {
            "putMessageTimesTotal": self.put_times, "putMessageSizeTotal": self.put_bytes,
            "putMessageFailedTimes": self.put_failed, "groups": self.groups, "topics": self.by_topic.statistics(),
            "appendMaxMicros": self.append_ns_max // 1000, "busySeconds": round(self.busy_ns / 1e9, 3),
            "queueWaitMicrosAvg": self.queue_wait_ns // max(1, self.groups) // 1000,
            "nativeEncode": self.batcher.encoder.native if self.batcher else False,
            "nativePlace": commitlog.NATIVE,
            "dispatcherWakes": self.wakes_sent, "dispatcherWakesSkipped": self.wakes_skipped,
            "writeBuffer": self.buffered, "scrubbedBytes": self.scrubbed, "commits": self.commits,
            "slaveNotAvailable": self.slave_not_available,
            "written": self.control.get("written"), "queues": len(self.log.queue_offsets),
        }

    def close(self) -> None:
        self.log.close()


class Writer(Actor):
    """The write service's shell: sends (or the ingress workers' groups) in, replies to the
    router, held sends to the group commit, wake-ups to the dispatcher and the ha-server."""

    name = "writer"

    def __init__(self, settings, *, queue_offsets: dict[str, int] | None = None, recovered_offset: int = 0):
        super().__init__(settings)
        self.recovered = (queue_offsets, recovered_offset)
        self.core: WriteCore | None = None
        self.inbox = self.replies = self.waits = None
        self.ha: Doorbell | None = None

    def open(self) -> None:
        self.core = None  # on a slave, until a promotion: the ha-client writes the CommitLog
        self._open_core()
        # sends from the router (which this shell encodes), or the ingress workers' groups
        per = 4 if self.settings.ingressWorkers == 0 else 2
        self.inbox = inbox(self, lambda joined: split_frames(joined, per))
        self.items = self.inbox.poll_items()
        self.replies = outbox(self, "writer-to-front", lambda replies: [pack_replies(replies)])
        self.waits = outbox(self, "writer-to-flush", lambda waits: [waits_to_wire(waits)])
        self.wakes = dispatcher_wakes(self.context, self.endpoints)
        self.ha = doorbell(self.settings, "ha-wake", listen=False)

    def _open_core(self) -> None:
        self.core = promoted_write_core(self.settings, self.control, self.recovered)

    def poll_items(self) -> list:
        return self.items

    def timeout_ms(self) -> int:
        core = self.core
        if core is None:  # a slave: the router refuses sends; look for a promotion now and then
            return 20
        return self.inbox.wait_ms(core.poll_ms)

    def step(self, events: set) -> None:
        core = self.core
        if core is None:
            self._open_core()
            return
        messages = []
        for requests in self.inbox.take():  # a turn's sends of the router, or groups of an ingress worker
            messages += requests
        if messages:
            replies = core.append_requests(messages)
            if replies:
                self.replies.send_waiting(replies)
            if core.pending_waits:
                self.waits.send_waiting(core.take_waits())
        # A reader holding pulls waits for the dispatcher's arrivals: while it lags the written
        # end, wake it at once, never a poll later; also when this turn wrote nothing (the pull
        # came in after a write whose wake was skipped).
        core.wake_now = self.control.watched() and self.control.get("dispatched") < self.control.get("written")
        core.idle()
        wake(core, self.wakes, self.ha)

    def follow_min_offset(self, min_offset: int) -> None:
        if self.core is not None:
            self.core.follow_min_offset(min_offset)

    def drain(self) -> None:
        if self.core is not None:
            self.core.drain()
            wake(self.core, self.wakes, self.ha)

    def statistics(self) -> dict:
        return super().statistics() | (self.core.statistics() if self.core is not None else {})

    def close(self) -> None:
        if self.core is not None:
            self.core.close()
        for end in (self.replies, self.waits):
            if end is not None and not end.local:  # (local links: the host's)
                end.close()
        for end in (self.inbox, self.ha):
            if end is not None:
                end.close()
        super().close()


def promoted_write_core(settings, control, recovered: tuple) -> WriteCore | None:
    """The write core, unless the node is a slave (None: the ha-client writes its CommitLog).
    After a promotion it opens once the dispatcher has caught up with what the slave received:
    its queue offsets are then the ConsumeQueues' ends (a walk of everything followed since
    start-up would take seconds a GiB)."""
    role = control.get("role")
    if role == ROLE_CODES["SLAVE"]:
        return None
    queue_offsets, recovered_offset = recovered
    if settings.is_slave:  # started as a slave, promoted since
        written = control.get("written")
        if control.get("dispatched") < written:
            return None
        queue_offsets, recovered_offset = consume_queue_ends(settings), written
    return WriteCore(settings, control, queue_offsets=queue_offsets, recovered_offset=recovered_offset)


def consume_queue_ends(settings) -> dict[str, int]:
    """"topic-queueId" -> next queue offset, from the ConsumeQueues on disk."""
    from shm.store import MessageStore

    store = MessageStore(settings, readonly=True)
    try:
        store.load_consume_queues()
        for queue in store.consume_queues.values():
            queue.recover()  # (read-only: finds the end of the valid entries, changes nothing)
        return {q.key: q.offset_max for q in store.consume_queues.values()}
    finally:
        store.close()


def dispatcher_wakes(context: zmq.Context, endpoints: dict) -> zmq.Socket:
    """The conflated PUSH to the dispatcher's `reput` socket: a dispatcher still busy finds one
    message, not many."""
    wakes = conflated(context, zmq.PUSH)
    wakes.connect(endpoints["reput"])
    return wakes


def wake(core: WriteCore, wakes: zmq.Socket, ha: Doorbell | None = None) -> None:
    """Wake the dispatcher when the core says so, and the ha-server while a slave follows (a
    SYNC_MASTER send waits for it; an ASYNC slave's lag shrinks)."""
    if core.take_wake(time.monotonic_ns()):
        try:
            wakes.send(b"", NOBLOCK)
        except zmq.Again:
            pass  # the dispatcher is not there (restarting): its timer catches up
    if ha is not None:
        ring_ha(core, ha)


def ring_ha(core: WriteCore, ha: Doorbell) -> None:
    """The ha-server's doorbell, once `written` moved and a slave follows."""
    if core.ha_wake_due:
        core.ha_wake_due = False
        if core.control.get("ha_slaves"):
            ha.ring()
