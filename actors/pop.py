"""pop: pop consumption's service (RocketMQ 5's PopMessageProcessor, AckMessageProcessor,
ChangeInvisibleTimeProcessor and revive service in one process actor; docs/protocol.md "Pop").

Links (actors.links) and sockets:
- ring `front-to-pop`: POP_MESSAGE, PEEK_MESSAGE, ACK_MESSAGE, BATCH_ACK_MESSAGE,
  CHANGE_MESSAGE_INVISIBLETIME, GET_POP_STATE and RESET_POP_OFFSET, their headers completed by the
  router (the topic's queues, the group's committed offsets and retryMaxTimes); and, from
  FORGET_CLIENT, the front's word that a group or a topic was deleted (not answered).
- ring `pop-to-front`: the answers (one too large for a ring message: the front's `replies`),
  and the re-puts of messages whose retries are used up into `%DLQ%<group>` (as replies to
  POP_CLIENT, which the front serves as the write path's requests; their answers come back on
  `front-to-pop`).
- `arrivals` SUB to the dispatcher's "queue grew", read only while a pop is held (long polling,
  `pollTime`), as the read service does.

`PopCore` (actors.pop_core) holds the state and decides; this shell reads the store for it (from
read-only mappings, below `dispatched`), keeps its records in the pop log (shm.pop_log: written
before the answers that follow from them go out, every SEND_EARLY messages handed out and at the
end of each turn; under SYNC_FLUSH once a turn, fdatasynced first) and moves frames.
A lease that runs out needs no service of its own: the core runs the deadlines out each turn and
wakes the pops held on that topic. The service takes pops only on a master. Promoted from a
slave, it takes over its master's pop state from the copy of its pop log the ha-client kept
(`_take_over`: restored, cut where this node's log ended, made its own).
"""

from __future__ import annotations

import collections
import errno
import logging
import shutil
import time
from collections.abc import Callable

import orjson
import zmq

from actors.base import Actor, incoming
from actors.links import inbox, reply_outbox, service_links_statistics
from actors.pop_core import MAX, MIN, OK, Entry, PopCore, PopRequest
from actors.pull import arrivals_socket
from actors.reput import ReputDeadline, send_back_request
from actors.topics import deletion_floors
from actors.wire import SERVICE_SEND, arrivals_from_wire, read_from_wire
from node import protocol
from shm import consume_queue
from shm import reader as store_reader
from shm.codec import Record, decode, queue_entries
from shm.control_block import ROLE_CODES, WATCHER_SLOTS
from shm.epochs import EpochFile
from shm.disk import free_bytes
from shm.pop_log import POP_REPLICA, PopLog, PopLogDamaged

log = logging.getLogger("mqnode")
POP_CLIENT = b"\x00mqnode-pop"  # its re-puts' pseudo-client at the front (no peer's id begins with 0)
FORGET_CLIENT = b"\x00mqnode-forget"  # the front's word that a group or topic was deleted (no answer)
POP_WATCHER = WATCHER_SLOTS - 1  # the control block's watcher slot of this service (shm.control_block)
MAX_HELD = 10_000  # pops held at once (long polling); more are answered POLLING_FULL
COMPACT_BYTES = 64 << 20  # the journal is folded into a snapshot beyond this (shm.pop_log)
COMPACT_AGAIN_S = 10.0  # a fold the full disk refused is tried again after this
ROOM_MIN = 1 << 20  # bytes free on the pop log's disk below which pops, acks and changes are refused
ROOM_LOOK_S = 0.1  # how often the free bytes are looked at
LOGGED = frozenset({protocol.POP_MESSAGE, protocol.ACK_MESSAGE, protocol.BATCH_ACK_MESSAGE,
                    protocol.CHANGE_MESSAGE_INVISIBLETIME, protocol.RESET_POP_OFFSET})  # requests whose records go to the log
DLQ_IN_FLIGHT = 256  # dead-letter re-puts awaiting their answer
DLQ_RETRY_S = 1.0  # a dead letter the write path refused is re-put again after this
SEND_EARLY = 128  # messages handed out in a turn before its answers so far go (ASYNC_FLUSH): a turn
# that served three pops of 256 kept the first answer back until the third was read, and the
# consumer decoded all three at once while the service idled
DEFER_MAX_S = 5.0  # a pop waits at most this for the dispatcher to index what was acknowledged before it
PROGRESS_EVERY_S = 1.0  # how often each queue's low that moved goes to the front as the group's committed offset
PROGRESS_A_MESSAGE = 4096  # queues' lows in one message to the front (~100 bytes each)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Pop(Actor):
    name = "pop"

    def __init__(self, settings):
        super().__init__(settings)
        self.core: PopCore | None = None
        self.log: PopLog | None = None
        self.reader = None
        self.requests = self.replies = None

    def open(self) -> None:
        s = self.settings
        self.reader = store_reader.StoreReader(s)
        self.reader.commitlog_min = self.control.get("min_offset")
        self.reader.floors = deletion_floors(s.root / "config")  # (a deleted topic's messages are never handed out)
        self.log = PopLog(s.root / "pop")
        state, records = self.log.open()
        self.core = PopCore(self.log, wall_ms, self._read)
        self.was_slave = self.control.get("role") == ROLE_CODES["SLAVE"]
        if not self.was_slave:
            self.core.restore(state, records)
        elif records or (state is not None and state["queues"]):
            # made when this node was a master: its master has gone on since, and a log cut at the
            # fencing may put new messages where this state says messages were handed out; promoted,
            # it takes over its master's (`_take_over`), as a slave that never popped
            self._fold()
        # a copy of its master's pop log left by a promotion this service did not finish taking over
        self.taking_over = not self.was_slave and any((s.root / POP_REPLICA).glob("*"))
        self.took_over = self.leases_cut = 0
        self.take_over_ms = 0.0
        self.forgets: list[dict] = []  # groups and topics deleted, their pop state to forget
        self.next_progress = time.monotonic()
        self.sync_each_turn = s.flushDiskType == "SYNC_FLUSH"
        self.next_sync = self.next_compact = self.next_room_look = time.monotonic()
        self.room = True
        self.requests = inbox(self, read_from_wire)
        self.replies = reply_outbox(self)
        self.arrivals = arrivals_socket(self.context, self.endpoints, POP_WATCHER)
        self.control.set_watching(POP_WATCHER, False)  # a predecessor killed while holding left it set
        self.watching = False
        self.items = self.requests.poll_items()
        self.held: dict[str, list[list]] = {}  # topic -> [[end (monotonic s), client, arrival, header], ...]
        self.held_count = 0
        self.deferred: list[list] = []  # [written when served, give up at, client, arrival, header]: read your writes
        self.dlq_todo: collections.deque = collections.deque()  # (key, offset) to re-put into the DLQ
        self.dlq_waiting: dict[int, tuple] = {}  # opaque -> ((key, offset), sent at)
        self.dlq_later: collections.deque = collections.deque()  # (when, (key, offset)): refused, tried again then
        self.opaque = 0
        self.deadline = ReputDeadline()  # when an unanswered dead letter goes again
        self.handed_out = 0  # messages in the answers of this turn not yet sent
        self.held_expired = self.polling_full = 0

    # -- the turn ----------------------------------------------------------------------------------

    def poll_items(self) -> list:
        return self.items + [(self.arrivals, zmq.POLLIN)] if self.watching else self.items

    def timeout_ms(self) -> int:
        waits = [200]
        soonest = self.core.soonest_deadline()
        if soonest is not None:
            waits.append(soonest - wall_ms() + 1)
        if self.held_count:
            now = time.monotonic()
            waits += [int((held[0][0] - now) * 1000) + 1 for held in self.held.values() if held]
        if self.dlq_todo:
            waits.append(10)
        if self.dlq_later:
            waits.append(int((self.dlq_later[0][0] - time.monotonic()) * 1000) + 1)
        if self.deferred:
            waits.append(1)  # (the dispatcher is a millisecond or so behind)
        return self.requests.wait_ms(max(1, min(waits)))

    def step(self, events: set) -> None:
        out: list = []
        self._follow_role()
        if self.deferred:
            self._serve_deferred(out)
        for header, client, arrival in self.requests.take():
            if client == POP_CLIENT:  # the front's answer to a dead letter's re-put
                self._dlq_answered(header)
                continue
            if client == FORGET_CLIENT:  # a group or topic deleted: its state goes with its offsets
                self.forgets.append(header)  # (one that comes while a promotion's copy is taken over: after it)
                if not self.taking_over:
                    self._forget()
                continue
            self._serve(header, client, arrival, out)
            if self.handed_out >= SEND_EARLY and not self.sync_each_turn:
                out = self._answer(out)  # (the client decodes these while the next pops are served)
        if self.watching and self.arrivals in events:
            grew = {topic for raw in incoming(self.arrivals, 4096, multipart=False)
                    for topic, _, _ in arrivals_from_wire(raw)}
            for topic in grew:
                self._retry_held(topic, out)
        if not (self.was_slave or self.taking_over):  # (a slave has no pop state: `open`)
            due, dead = self.core.expire()
            self.dlq_todo.extend(dead)
            for topic in {topic for _, topic in due}:
                self._retry_held(topic, out)
            self._dead_letter()
            self._progress(out)
        self._end_holds(out)
        self._follow_arrivals(out)
        self._answer(out)

    def _follow_role(self) -> None:
        """A promotion seen: the pop state to take over is its master's, as this node's copy of
        its pop log has it (shm.pop_log.PopReplica), once the dispatcher has indexed the whole
        log (the cut at each queue's end needs the end)."""
        slave = self.control.get("role") == ROLE_CODES["SLAVE"]
        if self.was_slave and not slave:
            self.taking_over = True
        self.was_slave = slave
        if self.taking_over and not slave:
            promoted_at = self._promoted_at()
            if self.control.get("dispatched") >= promoted_at:
                self._take_over(promoted_at)

    def _promoted_at(self) -> int:
        """Where the log ended at the promotion: its epoch's start (the ha-client begins it
        before it switches the role; sends may have been stored since)."""
        last = EpochFile(self.settings.root).last
        return last.start if last is not None else self.control.get("written")

    def _take_over(self, promoted_at: int) -> None:
        """Its master's pop state from the copy, cut where this node's log ended at the
        promotion (PopCore.fence), made this node's own (compacted into its log, then the copy
        deleted: a crash before the deletion takes it over again, and after it finds the state
        its own). A node that has a pop state of its own (not a slave since it made it) keeps it."""
        replica, began = self.settings.root / POP_REPLICA, time.monotonic()
        if any(replica.glob("*")) and not self.core.queues:
            try:
                copy = PopLog(replica)
                state, records = copy.open()
                copy.close()
            except PopLogDamaged as e:  # (a host's crash tore the copy: the committed offsets serve)
                log.warning("pop: the copy of the master's pop log is damaged (%s): each queue starts at the "
                            "group's committed offset", e)
                state, records = None, []
            self.core.restore(state, records)
            dispatched = self.control.get("dispatched")
            self.leases_cut = self.core.fence(
                lambda topic, queue_id: self.reader.queue(topic, queue_id, dispatched).end_before(promoted_at))
            self._fold()  # (before the copy goes)
            self.took_over += 1
            self.take_over_ms = round((time.monotonic() - began) * 1000, 1)
            log.warning("pop: took over the master's pop state in %.0f ms: %d queues, %d in flight (%d past this "
                        "log's end cut)", self.take_over_ms, len(self.core.queues), self.core.in_flight, self.leases_cut)
        shutil.rmtree(replica, ignore_errors=True)
        self.taking_over = False
        self._forget()

    def _forget(self) -> None:
        for header in self.forgets:
            self.core.forget(header.get("consumerGroup"), header.get("topic"))
        self.forgets.clear()

    def _progress(self, out: list) -> None:
        """Each queue's low that moved, to the front as the group's committed offset (after this
        turn's records are in the log: `out` goes after them). A slave gets the offsets with the
        configs; promoted, it starts the group's queues there."""
        now = time.monotonic()
        if now < self.next_progress:
            return
        self.next_progress = now + PROGRESS_EVERY_S
        commits = self.core.progress()
        for at in range(0, len(commits), PROGRESS_A_MESSAGE):  # (each well within a ring message)
            out.append((POP_CLIENT, SERVICE_SEND, orjson.dumps({"_commits": commits[at: at + PROGRESS_A_MESSAGE]}), b""))

    def _answer(self, out: list) -> list:
        """The records behind `out` to the log, then `out` to the front; a fresh `out`."""
        self._persist()
        if out:
            self.replies.send(out)
        self.handed_out = 0
        return []

    def _persist(self) -> None:
        """This turn's records to the log before any answer leaves (fdatasynced first under
        SYNC_FLUSH, else every flushIntervalCommitLog ms); the journal folded when large."""
        self.log.write()
        now = time.monotonic()
        if self.sync_each_turn or now >= self.next_sync:
            self.next_sync = now + self.settings.flushIntervalCommitLog / 1000
            self.log.sync()
        if self.log.size > COMPACT_BYTES and now >= self.next_compact:
            if not self.log.compact(self.core.snapshot()):  # (no room: the journal goes on, tried again later)
                self.next_compact = now + COMPACT_AGAIN_S

    def _room(self) -> bool:
        """Whether the pop log's disk has room for a turn's records (a write that found none would
        stop the process: its records' changes are applied before they are written)."""
        now = time.monotonic()
        if now >= self.next_room_look:
            self.next_room_look = now + ROOM_LOOK_S
            room = free_bytes(self.log.directory) >= ROOM_MIN
            if room != self.room:
                (log.warning if room else log.error)("pop: the disk %s: pops, acks and changes of invisible time "
                                                     "are %s", "has room again" if room else "is full",
                                                     "taken again" if room else "refused")
            self.room = room
        return self.room

    def _fold(self) -> None:
        """The state into the log's snapshot where what follows depends on it being there: no
        room stops the process (its restart does it again)."""
        if not self.log.compact(self.core.snapshot()):
            raise OSError(errno.ENOSPC, "no room for the pop log's snapshot")

    # -- requests ----------------------------------------------------------------------------------

    def _serve(self, header: dict, client: bytes, arrival: int, out: list) -> None:
        code, opaque, group = header["code"], header.get("opaque"), header["consumerGroup"]
        if self.was_slave and code != protocol.GET_POP_STATE:
            return out.append(_reply(client, arrival, opaque, "SERVICE_NOT_AVAILABLE",
                                     "this node is a slave: pop from its master"))
        if self.taking_over and code != protocol.GET_POP_STATE:
            return out.append(_reply(client, arrival, opaque, "SYSTEM_BUSY",
                                     "promoted a moment ago: taking over its master's pop state"))
        if code in LOGGED and not self._room():
            return out.append(_reply(client, arrival, opaque, "SERVICE_NOT_AVAILABLE",
                                     "the disk is full: the pop log cannot take pops, acks or changes"))
        self.core.retry_max_of[group] = header.get("_retryMax", self.core.retry_max(group))
        if code in (protocol.POP_MESSAGE, protocol.PEEK_MESSAGE):
            self._pop(header, client, arrival, out, hold=True)
        elif code == protocol.ACK_MESSAGE:
            status = self.core.ack(group, [header["extraInfo"]])[0]
            out.append(_reply(client, arrival, opaque, status, _remark(status)))
        elif code == protocol.BATCH_ACK_MESSAGE:
            statuses = self.core.ack(group, header["extraInfos"])
            out.append(_reply(client, arrival, opaque, "OK", results=statuses))
        elif code == protocol.CHANGE_MESSAGE_INVISIBLETIME:
            status, handle, deadline = self.core.change_invisible(group, header["extraInfo"], header["invisibleTime"])
            fields = {"extraInfo": handle, "invisibleTime": header["invisibleTime"], "popTime": wall_ms()} if handle else {}
            out.append(_reply(client, arrival, opaque, status, _remark(status), **fields))
        elif code == protocol.RESET_POP_OFFSET:
            table = {int(queue): offset for queue, offset in header["offsetTable"].items()}
            queues, dropped = self.core.reset(group, header["topic"], table)
            out.append(_reply(client, arrival, opaque, "OK", queues=queues, leasesDropped=dropped))
            self._retry_held(header["topic"], out)  # (moved back: what a held pop waits for is there again)
        else:  # GET_POP_STATE
            out.append(_reply(client, arrival, opaque, "OK", topics=self.core.group_view(group)))

    def _pop(self, header: dict, client: bytes, arrival: int, out: list, *, hold: bool, deferred: bool = False) -> bool:
        """Answer a pop (or peek) now, or hold it; False when it stays held."""
        opaque = header.get("opaque")
        try:
            request = _pop_request(header, self.settings.enablePropertyFilter)
        except protocol.FilterRefused as e:
            out.append(_reply(client, arrival, opaque, e.status, str(e)))
            return True
        if header["code"] == protocol.PEEK_MESSAGE:
            entries = self.core.peek(request)
            return self._found(out, client, arrival, opaque, [e.raw for e in entries],
                               reconsumeTimes=[e.reconsume for e in entries])
        deliveries = self.core.pop(request)
        if deliveries:
            return self._found(out, client, arrival, opaque, [d.raw for d in deliveries],
                               popTime=wall_ms(), invisibleTime=request.invisible_ms,
                               receiptHandles=[d.handle for d in deliveries],
                               reconsumeTimes=[d.reconsume_times for d in deliveries])
        written = self.control.get("written")
        if hold and not deferred and self.control.get("dispatched") < written and len(self.deferred) < MAX_HELD:
            # a send acknowledged before this pop may not be indexed yet: look again once it is
            self.deferred.append([written, time.monotonic() + DEFER_MAX_S, client, arrival, header])
            return False
        poll_ms = header.get("pollTime", 0)
        if hold and poll_ms > 0:
            if self.held_count < MAX_HELD:
                self.held.setdefault(request.topic, []).append([time.monotonic() + poll_ms / 1000, client, arrival, header])
                self.held_count += 1
                return False
            self.polling_full += 1
            out.append(_reply(client, arrival, opaque, "POLLING_FULL", f"{MAX_HELD} pops are held already"))
            return True
        if not hold:
            return False
        out.append(_reply(client, arrival, opaque, "NO_NEW_MSG"))
        return True

    def _found(self, out: list, client: bytes, arrival: int, opaque, raws: list[bytes], **fields) -> bool:
        if not raws:
            out.append(_reply(client, arrival, opaque, "NO_NEW_MSG"))
            return True
        self.handed_out += len(raws)
        header = orjson.dumps(protocol.reply_header(opaque, "FOUND", count=len(raws), **fields))
        out.append((client, -arrival, header, raws))  # (joined by pack_replies)
        return True

    def _serve_deferred(self, out: list) -> None:
        dispatched, now = self.control.get("dispatched"), time.monotonic()
        ready = [entry for entry in self.deferred if entry[0] <= dispatched or entry[1] <= now]
        if not ready:
            return
        self.deferred = [entry for entry in self.deferred if entry[0] > dispatched and entry[1] > now]
        for _, _, client, arrival, header in ready:  # (found nothing still: held for its pollTime, or answered)
            self._pop(header, client, arrival, out, hold=True, deferred=True)

    # -- long polling ------------------------------------------------------------------------------

    def _retry_held(self, topic: str, out: list) -> None:
        held = self.held.pop(topic, None)
        if not held:
            return
        self.held_count -= len(held)
        keep = [entry for entry in held if not self._pop(entry[3], entry[1], entry[2], out, hold=False)]
        if keep:
            self.held[topic] = keep
            self.held_count += len(keep)

    def _end_holds(self, out: list) -> None:
        if not self.held_count:
            return
        now = time.monotonic()
        for topic in list(self.held):
            ended = [entry for entry in self.held[topic] if entry[0] <= now]
            if not ended:
                continue
            self.held[topic] = [entry for entry in self.held[topic] if entry[0] > now]
            self.held_count -= len(ended)
            self.held_expired += len(ended)
            for _, client, arrival, header in ended:
                out.append(_reply(client, arrival, header.get("opaque"), "NO_NEW_MSG"))
            if not self.held[topic]:
                del self.held[topic]

    def _follow_arrivals(self, out: list) -> None:
        """Read arrivals only while a pop is held (actors.pull.follow_arrivals: say so, drop
        what queued, look at every held pop once more)."""
        if self.held_count and not self.watching:
            self.control.set_watching(POP_WATCHER, True)
            self.watching = True
            for _ in incoming(self.arrivals, 10_000, multipart=False):
                pass
            for topic in list(self.held):
                self._retry_held(topic, out)
        if self.watching and not self.held_count:
            self.control.set_watching(POP_WATCHER, False)
            self.watching = False

    # -- dead letters ------------------------------------------------------------------------------

    def _dead_letter(self) -> None:
        now = time.monotonic()
        while self.dlq_later and self.dlq_later[0][0] <= now:
            self.dlq_todo.append(self.dlq_later.popleft()[1])
        for opaque in [o for o, (_, at) in self.dlq_waiting.items() if self.deadline.expired(at, now)]:
            self.dlq_todo.append(self.dlq_waiting.pop(opaque)[0])  # unanswered: again (at least once)
        gone = []
        while self.dlq_todo and len(self.dlq_waiting) < DLQ_IN_FLIGHT:
            key, offset = item = self.dlq_todo.popleft()
            found = self._read_one(key[1], key[2], offset)
            record = decode(found.raw, check_crc=False) if found is not None else None
            if not isinstance(record, Record):
                gone.append(item)  # cleaned away meanwhile: nothing to keep
                continue
            self.opaque = (self.opaque + 1) % (1 << 31)
            request, body = send_back_request(record, {"consumerGroup": key[0], "delayLevel": -1}, self.opaque, 0)
            self.dlq_waiting[self.opaque] = (item, now)
            self.replies.send([(POP_CLIENT, SERVICE_SEND, orjson.dumps(request), body)])  # (the front serves it as a send)
        if gone:
            self.core.dead_lettered_done(gone)

    def _dlq_answered(self, header: dict) -> None:
        self.deadline.answered(time.monotonic())
        waiting = self.dlq_waiting.pop(header.get("opaque"), None)
        if waiting is None:
            return  # (timed out and sent again: the second answer counts)
        if header.get("status") in protocol.STORED_STATUSES:
            self.core.dead_lettered_done([waiting[0]])
        else:  # refused (disk full, say): again in a while, not at once
            self.dlq_later.append((time.monotonic() + DLQ_RETRY_S, waiting[0]))

    # -- the store ---------------------------------------------------------------------------------

    def _read(self, topic: str, queue_id: int, offset: int, count: int, codes,
              match: Callable[[bytes], bool] | None = None):
        """PopCore's read: (entries from `offset`, the offset to look at next, min, max)."""
        dispatched = self.control.get("dispatched")
        if count == 0:
            view = self.reader.queue(topic, queue_id, dispatched)
            return [], offset, view.min_offset(self.reader.commitlog_min), view.max_offset
        if count == 1 and codes is None and match is None:  # (a message handed out again: one entry, one record)
            found = self._read_one(topic, queue_id, offset)
            if found is not None:
                return [found], offset + 1, 0, 0
        result = self.reader.get_message(topic, queue_id, offset, count, codes, dispatched, match)
        moved = result.status in (store_reader.FOUND, store_reader.NO_MATCHED_MESSAGE,
                                  store_reader.OFFSET_TOO_SMALL, store_reader.OFFSET_FOUND_NULL,
                                  store_reader.MESSAGE_WAS_REMOVING)
        return (entries_of(result.records), result.next_begin_offset if moved else offset,
                result.min_offset, result.max_offset)

    def _read_one(self, topic: str, queue_id: int, offset: int) -> Entry | None:
        view = self.reader.queue(topic, queue_id, self.control.get("dispatched"))
        if not view.min_offset(self.reader.commitlog_min) <= offset < view.max_offset:
            return None
        raw = view.queue.raw_entries(offset, 1, limit_offset=view.max_offset)
        entries = consume_queue.entries(raw) if raw else []
        record = self.reader.record_bytes(entries[0][0], entries[0][1]) if entries else None
        found = entries_of([record]) if record else []
        return found[0] if found and found[0].offset == offset else None

    def follow_min_offset(self, min_offset: int) -> None:
        self.reader.follow_min_offset(min_offset)

    def follow_topic_deletions(self) -> None:
        self.reader.follow_floors(deletion_floors(self.settings.root / "config"))

    # -- lifecycle ---------------------------------------------------------------------------------

    def drain(self) -> None:
        out: list = []
        for topic in list(self.held):
            for _, client, arrival, header in self.held.pop(topic):
                out.append(_reply(client, arrival, header.get("opaque"), "NO_NEW_MSG"))
        self.held_count = 0
        for _, _, client, arrival, header in self.deferred:
            out.append(_reply(client, arrival, header.get("opaque"), "NO_NEW_MSG"))
        self.deferred = []
        self.log.write()
        self.log.sync()
        self.log.compact(self.core.snapshot())  # (a clean stop starts the next from a snapshot)
        if out:
            self.replies.send(out)

    def statistics(self) -> dict:
        stats = super().statistics()
        if self.core is None:
            return stats
        return stats | self.core.statistics() | {
            "held": self.held_count, "heldExpired": self.held_expired, "pollingFull": self.polling_full,
            "deadLetterWaiting": len(self.dlq_todo) + len(self.dlq_waiting) + len(self.dlq_later),
            "log": self.log.statistics(), "tookOver": self.took_over, "leasesCutAtTakeOver": self.leases_cut,
            "takeOverMs": self.take_over_ms,
            "links": service_links_statistics(self.requests, self.replies)}

    def close(self) -> None:
        if self.control is not None:
            self.control.set_watching(POP_WATCHER, False)
        if self.log is not None:
            self.log.close()
        if self.reader is not None:
            self.reader.close()
        for end in (self.requests, self.replies):
            if end is not None:
                end.close()
        super().close()


def _pop_request(header: dict, sql92: bool) -> PopRequest:
    selects = protocol.message_filter(header.get("expType"), header.get("exp", "*"), sql92=sql92)  # FilterRefused
    return PopRequest(header["consumerGroup"], header["topic"], header["_queues"], header.get("maxMsgNums", 32),
                      header.get("invisibleTime", 60_000), orderly=header.get("order", False),
                      start={int(q): o for q, o in header.get("_start", {}).items()},
                      init_mode=MAX if header.get("initMode", MIN) == MAX else MIN,
                      codes=selects.codes, match=selects.record_test)


def _reply(client: bytes, arrival: int, opaque, status: str, remark: str = "", **fields) -> tuple:
    return client, -arrival, orjson.dumps(protocol.reply_header(opaque, status, remark, **fields))


def _remark(status: str) -> str:
    if status == OK:
        return ""
    if status == "RECEIPT_HANDLE_EXPIRED":
        return "the handle no longer holds its message: its invisible time passed, or it was acked or changed"
    return "not a receipt handle this node gave to this group"


def entries_of(runs: list[bytes]) -> list[Entry]:
    return list(map(Entry._make, queue_entries(runs)))
