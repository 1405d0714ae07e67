"""dispatcher (reput): tails the CommitLog and builds the ConsumeQueues and the IndexFile.

Sockets: `wakes` PULL, conflated, bound at `reput`: the writer's "written moved", once per
writer turn that moved it; `arrivals` PUB (bound): after each batch, [topic, queueId, new max
offset] per queue that grew, for held pulls (the front's, or the pull workers').

It announces only while some reader holds pulls (its watcher slot in the control block is set),
and only to those readers: each frame is addressed to one watcher slot, the one byte a reader's
SUB subscribes to, so the PUB sends a reader not holding pulls nothing. Each announcement costs
this loop, two ZeroMQ I/O threads and the reader's socket a wake-up, and with nobody waiting it
buys nothing (at 5k single sends a second, ~1,000 a second); and one a reader does not read
stays queued: broadcast, the two pull workers of a node whose pops were held each kept ~80 MB of
them (libzmq holds each lone message in its own 8 KiB receive buffer, 10,000 of them at the
SUB's high-water mark). A reader sets its slot, then looks at `dispatched` once for each pull
it holds; this loop advances `dispatched`, then reads the slots, with a fence on both sides
(`ControlBlock.watchers`): one of the two sees the other's store. Without the C fence x86 lets
both reads see the old values (each store still in its core's store buffer), so then every
announcement goes to every reader (`ARRIVALS_TO_ALL`), and in either case what a batch touched
while no slot was seen set is kept (`unannounced`, at most one entry a queue) and announced on
the first turn that sees one set: a held pull that lost that race waits at most one turn
(POLL_MS), never its timeout.

It waits for a wake-up (or POLL_MS, which covers one lost while either side restarted), takes
the wake-ups waiting, then reads the control block's `written` counter, dispatches every
record below it with the batched `shm.dispatch.reput`, and advances `dispatched` (data first,
counter second: a reader below `dispatched` finds every entry).

While records keep coming it polls instead (RocketMQ's reput looks every 1 ms): after a reput
that found records it looks again every `dispatcherPollMillis` until `dispatcherPollHoldMillis`
after that look, and publishes that promise as `reput_polling_until` in the control block. The
writer sends no wake-up while the promise has more than WAKE_MARGIN_NS to run, so a steady
stream costs one timer wake-up a millisecond here instead of a wake-up chain per writer turn
(front's send, two ZeroMQ I/O threads, this loop, each a costly wake on a virtual machine:
docs/performance.md). The promise holds because the loop only stops polling after a look that
began at or after `reput_polling_until`, which comes after any write the writer skipped a wake
for. A front holding pulls still wakes it at once (`Writer.wake_now`): a waiting consumer's
message is not left for the next poll.

Its loop runs at nice `dispatcherNiceness` (5): on a busy CPU the front and the clients go
first, and the dispatcher catches up in larger, cheaper batches (more throughput, a few MiB more
lag under a saturating load: docs/performance.md). A reput of BUSY_RECORDS or more is followed
by a 1 ms pause, so under load each reput takes a large batch (without it, a reput per writer
turn looked ~10% slower on batch throughput); the first records after a quiet spell are
dispatched the moment they are written. (It used to poll `written` every 1-20 ms whatever the
load: ~12 ms added to a message's trip to a consumer at light load.)

It is the single writer of the ConsumeQueue and IndexFile files and of the checkpoint's logics
and index timestamps, which it advances only after flushing what they describe (every
`flushIntervalConsumeQueue` ms, and at stop).

A full disk (no room for a ConsumeQueue or index file): it publishes what it finished (each
segment it got through whole, at least: the clean service deletes only those, and a new CommitLog
segment leaves Settings.commitlog_headroom for the oldest's entries), sets the control block's
logics-write-error flag (the writer refuses sends meanwhile) and tries again every RETRY_S.

Restart: it resumes at `dispatched`; entries already written are recognised and skipped
(dispatch is idempotent), so a crash between writing entries and advancing the counter is
harmless.
"""

from __future__ import annotations

import time

import zmq

from actors.base import (
    POLL_MS,
    Actor,
    conflated,
    give_way,
    incoming,
    socket,
    wait_readable,
)
from actors.topics import deleted_topics
from actors.wire import ARRIVALS_TO_ALL, arrivals_to_wire
from shm.commitlog import CommitLog
from shm.control_block import FLAG_LOGICS_WRITE_ERROR, ROLE_CODES
from shm.dispatch import NATIVE, ReputStopped, reput
from shm.invariant import InvariantBroken
from shm.mapped_file import StoreError
from shm.ring import FENCED
from shm.store import MessageStore

RETRY_S = 0.5
MAX_WAKES = 64  # wake-ups taken per turn (conflated: normally one)
TURN_S = 1.0  # a reput returns after the batch that passes it: the turn beats (processHangTimeoutMillis)
BUSY_RECORDS = 64  # a reput this large means load: pause so the next one takes a batch
BUSY_PAUSE_S = 0.001


class Dispatcher(Actor):
    name = "dispatcher"

    def __init__(self, settings, **kwargs):
        super().__init__(settings, **kwargs)
        self.niceness = 0
        self.store: MessageStore | None = None  # opened by `open`, in the actor's thread
        self.position = 0
        self.records = self.stalls = self.last_count = 0
        self.caught_up_on_wake = self.caught_up_on_timer = 0
        self.polled = self.announced = self.announcements_held = self.index_slots_mended = self.queues_dropped = 0
        self.last_error = ""
        self.unannounced: dict[tuple[str, int], int] = {}  # (topic, queueId) -> max offset, while unwatched
        self.poll_ms, self.hold_ns = settings.dispatcherPollMillis, settings.dispatcherPollHoldMillis * 1_000_000
        self.looked_ns = self.polling_until = 0  # when the last look at `written` began; the promise
        self.next_flush = 0.0
        self.dropped_below = -1  # the min offset of the last look for deleted topics' queues to drop
        self.drop_due = 0  # a look is due again once dispatched this far (a deletion floor above the position)

    def open(self) -> None:
        s = self.settings
        self.niceness = give_way(s.dispatcherNiceness)
        self.store = MessageStore(s, lock=False)
        self.store.commitlog.close()
        self.store.commitlog = CommitLog(s.commitlog_dir, s.mappedFileSizeCommitLog, readonly=True)
        self.store.commitlog.segments.load()
        self.store.index.load(last_exit_ok=True)
        self.index_slots_mended = self.store.index.torn_slots  # a predecessor killed inside a put
        # every queue of the node: tens of thousands take seconds, so it beats as it goes (a
        # restart killed as hung, again and again, would leave the node without its dispatcher)
        self.store.load_consume_queues(progress=self.beat)
        for queue in self.store.consume_queues.values():
            queue.recover()
            self.beat()
        self._drop_deleted_topics()
        self.position = self.control.get("dispatched")
        self.arrivals = socket(self.context, zmq.PUB, hwm=10000)
        self.arrivals.bind(self.endpoints["arrivals"])
        self.wakes = conflated(self.context, zmq.PULL)
        self.wakes.bind(self.endpoints["reput"])
        self.wake_items = [(self.wakes, zmq.POLLIN)]
        self.next_flush = time.monotonic() + s.flushIntervalConsumeQueue / 1000
        # a restarted dispatcher keeps the promise its last incarnation published
        self.polling_until = self.control.get("reput_polling_until")

    def turn(self) -> None:
        polling = self.looked_ns < self.polling_until  # no look since the promise ran out yet
        woken = bool(wait_readable(self.wake_items, self.poll_ms if polling else POLL_MS))
        if woken:  # take them before reading `written`: a later move sends a fresh one
            for _ in incoming(self.wakes, MAX_WAKES, multipart=False):
                pass
        elif polling:
            self.polled += 1
        self.looked_ns = time.monotonic_ns()  # before catch_up reads `written`
        if self.catch_up():
            if self.hold_ns:
                # only ever later: looked_ns grows, so the published promise never shrinks
                self.polling_until = self.looked_ns + self.hold_ns
                self.control.set("reput_polling_until", self.polling_until)
            if woken:
                self.caught_up_on_wake += 1
            else:
                self.caught_up_on_timer += 1
            if self.last_count >= BUSY_RECORDS:
                self.stopping.wait(BUSY_PAUSE_S)
        elif self.unannounced:  # nothing new: a reader may have started watching since
            self._announce({})
        if self.drop_due and self.position >= self.drop_due:
            self.drop_due = 0
            self._drop_deleted_topics()
        if time.monotonic() >= self.next_flush:
            self.next_flush = time.monotonic() + self.settings.flushIntervalConsumeQueue / 1000
            self.flush()

    def follow_min_offset(self, min_offset: int) -> None:
        """Drop the mappings of what the clean service deleted (the space is freed only then)."""
        store = self.store
        store.commitlog.segments.forget_deleted_head()
        for queue in store.consume_queues.values():
            if queue.files.forget_deleted_head():
                queue.correct_min_offset(min_offset)
        store.index.forget_deleted_head()
        if min_offset != self.dropped_below:  # (not at each queue's deletion of a clean pass)
            self._drop_deleted_topics()

    def follow_topic_deletions(self) -> None:
        """A topic deleted has its queues dropped at once."""
        self._drop_deleted_topics()

    def _drop_deleted_topics(self) -> None:
        """The queues of deleted topics whose messages cleaning took or whose deletion hid them go
        now, not only at the next start (MessageStore.drop_queues_of): this loop is their single
        writer, so no entry can be on its way into them. Not a topic's deleted past this loop's
        position: a record stored before its deletion would make its queue again; the look is
        made again once dispatched there. Every process drops its views of them at its next turn."""
        self.dropped_below = self.control.get("min_offset")
        deleted = deleted_topics(self.settings.root / "config")
        if deleted is None:
            return

        def dispatched_past(topic: str) -> int | None:
            at = deleted(topic)
            if at is not None and at > self.position:
                self.drop_due = max(self.drop_due, at)
                return None
            return at

        dropped = self.store.drop_queues_of(dispatched_past)
        if dropped:
            self.queues_dropped += len(dropped)
            self.control.set("queues_dropped", self.control.get("queues_dropped") + 1)

    def catch_up(self) -> bool:
        """Dispatch up to the published end; True when it moved (`last_count`: records)."""
        written = self.control.get("written")
        # an empty slave's log begins where its master's first transfer landed (actors.ha_client)
        self.position = max(self.position, self.control.get("dispatched"))
        if written <= self.position:
            return False
        log = self.store.commitlog
        if log.segments.find(written - 1) is None or log.segments.find(self.position) is None:
            log.segments.refresh()
        touched: dict = {}
        try:
            reached, count = reput(self.store, self.position, written, touched, time.monotonic() + TURN_S)
            if reached == self.position:
                # Below a published counter nothing can be missing. Map the segments again once, in
                # case one was replaced under a name already mapped; still stuck, the log below
                # `written` is not what the writer published: stop (the restart is recovery).
                self.stalls += 1
                log.segments.refresh()
                reached, count = reput(self.store, self.position, written, touched, time.monotonic() + TURN_S)
                if reached == self.position:
                    raise InvariantBroken(f"no record readable at {self.position}, below the published written {written}")
        except StoreError as e:  # a full disk (ReputStopped: no room for a ConsumeQueue or index file)
            self.errors += 1
            self.last_error = str(e)
            self.control.set_flag(FLAG_LOGICS_WRITE_ERROR, True)  # the writer refuses sends meanwhile
            moved = isinstance(e, ReputStopped) and e.reached > self.position
            if moved:  # what it finished is published: the clean service deletes only that, making room
                self._advance(e.reached, e.count, touched)
            self.stopping.wait(RETRY_S)
            return moved
        if self.control.has_flag(FLAG_LOGICS_WRITE_ERROR):
            self.control.set_flag(FLAG_LOGICS_WRITE_ERROR, False)
        self._advance(reached, count, touched)
        return True

    def _advance(self, reached: int, count: int, touched: dict) -> None:
        """Publish `dispatched` (every entry below it is written), then announce what grew."""
        self.position = reached
        self.records += count
        self.last_count = count
        self.control.advance("dispatched", reached)
        if self.control.get("role") == ROLE_CODES["SLAVE"] and self.store.checkpoint.logics_timestamp:
            # a slave's physic checkpoint time is set as it dispatches (RocketMQ's rule): its
            # CommitLog writer, the ha-client, appends raw bytes and reads no record
            self.control.set("store_timestamp", self.store.checkpoint.logics_timestamp)
        if touched:
            self._announce(touched)

    def _announce(self, touched: dict) -> None:
        """"Queue grew", for the pulls held on these queues: now if a reader watches (read after
        `dispatched` moved), else kept until one does."""
        pending = self.unannounced
        readers = self.control.watchers()
        if not readers:
            if touched:
                pending.update(touched)  # a later batch's max offset is the higher
                self.announcements_held += 1
            return
        if pending:
            pending.update(touched)
            touched, self.unannounced = pending, {}
        if touched:
            for frame in arrivals_to_wire(touched, readers if FENCED else [ARRIVALS_TO_ALL]):
                self.arrivals.send(frame)
            self.announced += 1

    def flush(self) -> None:
        store = self.store
        for queue in store.consume_queues.values():
            queue.flush()
        store.index.flush()
        if store.checkpoint.logics_timestamp:
            store.checkpoint.flush_logics(store.checkpoint.logics_timestamp)

    def drain(self) -> None:
        for _ in range(1000):  # bounded: each round moves forward or stops
            if not self.catch_up():
                break
        self.flush()

    def statistics(self) -> dict:
        return super().statistics() | {"niceness": self.niceness, "dispatched": self.position,
                                       "records": self.records, "stalls": self.stalls,
                                       "caughtUpOnWake": self.caught_up_on_wake,
                                       "caughtUpOnTimer": self.caught_up_on_timer,
                                       "polls": self.polled, "announcements": self.announced,
                                       "announcementsHeld": self.announcements_held, "lastError": self.last_error,
                                       "indexSlotsMended": self.index_slots_mended, "queuesDropped": self.queues_dropped,
                                       "queues": len(self.store.consume_queues) if self.store is not None else 0,
                                       "nativeScan": NATIVE}

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        super().close()
