"""The read service's core (RocketMQ's PullMessageProcessor, PullRequestHoldService and the
query side of DefaultMessageStore, in one class with no socket): `ReadCore`. Its shell is
actors.pull.

Requests: PULL_MESSAGE, GET_MAX_OFFSET, GET_MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP,
VIEW_MESSAGE_BY_ID, QUERY_MESSAGE. Nothing is read past the control block's `dispatched`.

Long polling (PullRequestHoldService): a pull that finds nothing new (NO_NEW_MSG) and carries
`suspend` is held, keyed by topic@queueId, until an announcement says its queue reached past
its offset, or its `suspendTimeoutMillis` (default 15 s; `shortPollingTimeMills` without
`longPollingEnable`) ends; then it is served once more, without suspension. Held pulls are
entries in a dict: they cost nothing while idle. At most MAX_HELD are held per worker.
Announcements are read only while some pull is held; when holding starts, the queued ones are
dropped and each held pull's queue is looked at once more instead (`catch_up`).

Read your writes: a client told PUT_OK holds a queue offset and an offsetMsgId the dispatcher
may not have indexed yet (it runs behind `written` by up to a few ms). A read whose answer
would deny what was acknowledged before it arrived (a pull at or past the indexed end, which
would be NO_NEW_MSG or OFFSET_ILLEGAL, GET_MAX_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP, a
QUERY_MESSAGE that finds nothing) is deferred until `dispatched` reaches the `written` it saw on
arrival, then served
(a pull then may still be held). VIEW_MESSAGE_BY_ID reads the CommitLog below `written`
directly. A deferred read waits at most DEFER_MAX_S (the dispatcher stalled: SYSTEM_BUSY), and
at most MAX_DEFERRED wait at once.
"""

from __future__ import annotations

import time

import orjson

from actors.tiered import ArchiveDamaged, TieredArchive
from actors.topics import deletion_floors
from node import protocol
from shm import reader as store_reader
from shm.codec import Record, decode, decode_msg_id
from shm.index_file import IndexService
from shm.invariant import InvariantBroken

MAX_HELD = 100_000
DEFAULT_SUSPEND_MS = 15000
MAX_DEFERRED = 10_000
DEFER_MAX_S = 5.0
MAX_PULL_KEYS = 10_000  # (topic, group) pull counters kept
_PULL_STATUS = {  # the store's status -> the client's pull status
    store_reader.FOUND: "FOUND",
    store_reader.NO_MATCHED_MESSAGE: "NO_MATCHED_MSG",
    store_reader.MESSAGE_WAS_REMOVING: "NO_MATCHED_MSG",
    store_reader.OFFSET_FOUND_NULL: "NO_NEW_MSG",
    store_reader.OFFSET_OVERFLOW_ONE: "NO_NEW_MSG",
    store_reader.OFFSET_OVERFLOW_BADLY: "OFFSET_ILLEGAL",
    store_reader.OFFSET_TOO_SMALL: "OFFSET_ILLEGAL",
}


DEFER = object()  # serve(): the answer must wait for the dispatcher


class ReadCore:
    """The read service's logic: serves read requests below `dispatched`, holds empty pulls and
    defers reads that would deny an acknowledged send. `clock` (monotonic seconds) times holds
    and deferrals; a test passes its own. Replies go to the caller's `out` list as
    (client, -arrival, header[, body])."""

    def __init__(self, settings, control, *, watcher: int, clock=time.monotonic):
        s = settings
        self.settings = settings
        self.control = control
        self.clock = clock
        self.watcher = watcher
        control.set_watching(watcher, False)  # a predecessor killed while holding left it set
        self.reader = store_reader.StoreReader(s)
        self.reader.commitlog_min = control.get("min_offset")  # entries below it point at deleted files
        self.reader.floors = deletion_floors(s.root / "config")  # entries below them are deleted topics'
        self.index = IndexService(s.index_dir, s.maxHashSlotNum, s.maxIndexNum, readonly=True,
                                  max_query=s.maxMsgsNumBatch)
        self.watching = False  # reading arrivals: only while some pull is held
        self.held: dict[tuple[str, int], list[list]] = {}  # key -> [deadline, client, arrival, header]
        self.held_count = 0
        self.soonest = float("inf")  # no held pull ends before this (it may be early: never late)
        self.deferred: list[list] = []  # [written on arrival, give up at, client, arrival, header]
        self.served = self.found = self.woken = self.expired = self.deferrals = 0
        self.pulled: dict[tuple[str, str], list[int]] = {}  # (topic, group) -> [messages, bytes]
        self.tiered = TieredArchive(s.tieredArchiveDir, clock=clock) if s.tieredArchiveDir else None

    def after_turn(self, out: list) -> None:
        """End the held pulls whose time is up; serve the deferred reads the dispatcher caught
        up with."""
        self._expire(out)
        if self.deferred:
            self._serve_deferred(out)

    def follow_min_offset(self, min_offset: int) -> None:
        """Files below the CommitLog's new min offset are gone: drop their mappings; queue
        bounds start at the first entry still stored."""
        self.reader.follow_min_offset(min_offset)
        self.index.refresh()

    def follow_topic_deletions(self) -> None:
        """A topic deleted hides its messages from now on."""
        self.reader.follow_floors(deletion_floors(self.settings.root / "config"))

    def set_watching(self, on: bool) -> None:
        """Read arrivals or not, and tell the dispatcher, which announces only while some
        reader watches."""
        self.control.set_watching(self.watcher, on)
        self.watching = on

    def timeout_ms(self) -> int:
        if self.deferred:
            return 1  # the dispatcher is a millisecond or so behind
        if not self.held_count:
            return 100
        return max(1, min(100, int((self.soonest - self.clock()) * 1000) + 1))

    def serve_request(self, header: dict, client: bytes, arrival: int, out: list) -> None:
        """Serve one read request, its fields checked at the edge (actors.edge); its reply
        (client, -arrival, header[, body]) goes to `out` unless the read is held or deferred."""
        written = self.control.get("written")  # every send acknowledged before this request is below it
        reply = self.serve(header, client, arrival, allow_hold=True, written=written)
        if reply is None:
            return
        if reply is DEFER:
            self._defer(written, header, client, arrival, out)
        else:
            out.append((client, -arrival, *reply) if len(reply) == 2 else (client, -arrival, reply[0]))

    # -- requests ----------------------------------------------------------------------------------

    def serve(self, header: dict, client: bytes, arrival: int, *, allow_hold: bool, written: int = 0):
        """The reply frames; None when the pull is held; DEFER when the answer would deny a
        record below `written` that the dispatcher has not indexed yet."""
        self.served += 1
        code, opaque = header["code"], header.get("opaque")
        dispatched = self.control.get("dispatched")
        behind = dispatched < written
        if code == protocol.PULL_MESSAGE:
            return self._pull(header, client, arrival, dispatched, allow_hold, behind)
        if code == protocol.VIEW_MESSAGE_BY_ID:
            return self._view(header, opaque, self.control.get("written"))
        # (`indexed`: GET_MAX_OFFSET's, RocketMQ's indexed max at once; a min asked before the
        # dispatcher made a queue's file, a deleted topic's made again, said 0, not its numbering's 3)
        if behind and (code in (protocol.SEARCH_OFFSET_BY_TIMESTAMP, protocol.GET_MIN_OFFSET)
                       or code == protocol.GET_MAX_OFFSET and not header.get("indexed")):
            return DEFER
        if code == protocol.GET_MAX_OFFSET:
            view = self.reader.queue(header["topic"], header["queueId"], dispatched)
            return [orjson.dumps(protocol.reply_header(opaque, "OK", offset=view.max_offset))]
        if code == protocol.GET_MIN_OFFSET:
            return [orjson.dumps(protocol.reply_header(opaque, "OK", **self._min_offset(header, dispatched)))]
        if code == protocol.SEARCH_OFFSET_BY_TIMESTAMP:
            return [orjson.dumps(protocol.reply_header(opaque, "OK", offset=self._offset_by_time(header, dispatched)))]
        if code == protocol.QUERY_MESSAGE:
            return self._query(header, opaque, dispatched, behind)
        return [orjson.dumps(protocol.reply_header(opaque, "REQUEST_CODE_NOT_SUPPORTED", f"code {code}"))]

    def _pull(self, header: dict, client: bytes, arrival: int, dispatched: int, allow_hold: bool, behind: bool):
        opaque = header.get("opaque")
        topic, queue_id, offset = header["topic"], header["queueId"], header["queueOffset"]
        count = header.get("maxMsgNums", 32)
        try:
            selects = protocol.message_filter(header.get("expressionType"), header.get("subscription", "*"),
                                              sql92=self.settings.enablePropertyFilter)
        except protocol.FilterRefused as e:
            return [orjson.dumps(protocol.reply_header(opaque, e.status, str(e)))]
        match = selects.record_test
        result = self.reader.get_message(topic, queue_id, offset, count, selects.codes, dispatched, match)
        if result.status == store_reader.OFFSET_TOO_SMALL and self.tiered is not None:
            archived = self._pull_tiered(header, result, selects.tags, match)
            if archived is not None:
                return archived
        status = _PULL_STATUS.get(result.status)
        if result.status == store_reader.NO_MESSAGE_IN_QUEUE:
            status = "OFFSET_ILLEGAL" if offset != 0 else "NO_NEW_MSG"
        if behind and status in ("OFFSET_ILLEGAL", "NO_NEW_MSG") and offset >= result.max_offset:
            return DEFER  # maybe assigned, not yet indexed: "not yet", never "illegal" or "nothing new"
        if status == "NO_NEW_MSG" and allow_hold and header.get("suspend") and self.held_count < MAX_HELD:
            self._hold(topic, queue_id, header, client, arrival)
            return None
        if status == "FOUND":
            self.found += 1
        fields = {"nextBeginOffset": result.next_begin_offset, "minOffset": result.min_offset,
                  "maxOffset": result.max_offset, "getStatus": result.status, "count": result.count,
                  "suggestWhichBrokerId": self._suggested_broker(result)}
        reply = [orjson.dumps(protocol.reply_header(opaque, status, **fields))]
        if result.records:
            records = b"".join(result.records)
            reply.append(records)
            self._count_pulled(topic, header.get("consumerGroup") or "", result.count, len(records))
        return reply

    def _min_offset(self, header: dict, dispatched: int) -> dict:
        """GET_MIN_OFFSET's fields: the store's min, or the archive's with `tiered` when it is lower."""
        topic, queue_id = header["topic"], header["queueId"]
        offset = self.reader.queue(topic, queue_id, dispatched).min_offset(self.reader.commitlog_min)
        bound = self.reader.archive_floor(topic, queue_id) if self.tiered is not None else None
        archived = self.tiered.min_offset(topic, queue_id) if bound is not None else None
        archived = max(archived, bound) if archived is not None else None  # (below: a deleted topic's)
        lower = archived is not None and archived < offset
        return {"offset": archived, "tiered": True} if lower else {"offset": offset}

    def _pull_tiered(self, header: dict, result, tags: list[str] | None, match) -> list[bytes] | None:
        """A pull below the store's min offset, from the archive (actors.tiered); None when the
        archive holds nothing there either, or it is a deleted topic's (the store's OFFSET_ILLEGAL
        stands, below a deleted topic's offsets with `result` moved on to where they end)."""
        topic, queue_id, offset = header["topic"], header["queueId"], header["queueOffset"]
        bound = self.reader.archive_floor(topic, queue_id)
        if bound is None:
            return None
        if offset < bound:
            result.next_begin_offset = min(result.min_offset, max(bound, self.tiered.min_offset(topic, queue_id) or 0))
            return None
        opaque, s = header.get("opaque"), self.settings
        count = min(header.get("maxMsgNums", 32), s.maxTransferCountOnMessageInMemory)
        try:
            read = self.tiered.read(topic, queue_id, offset, count,
                                    s.maxTransferBytesOnMessageInMemory, set(tags) if tags else None, result.min_offset,
                                    match)
        except ArchiveDamaged as e:
            self.tiered.failed(str(e))
            return [orjson.dumps(protocol.reply_header(opaque, "SYSTEM_ERROR", f"tiered archive: {e}"))]
        if read is None:
            return None
        fields = {"nextBeginOffset": read.next_begin, "minOffset": read.min_offset, "maxOffset": result.max_offset,
                  "getStatus": read.status, "count": len(read.records), "suggestWhichBrokerId": 0, "tiered": True}
        reply = [orjson.dumps(protocol.reply_header(opaque, _PULL_STATUS[read.status], **fields))]
        if read.records:
            records = b"".join(read.records)
            reply.append(records)
            self._count_pulled(topic, header.get("consumerGroup") or "", len(read.records), len(records))
            self.found += 1
        return reply

    def _suggested_broker(self, result) -> int:
        """Spec §10.1: with slaveReadEnable, a read of data no longer in memory
        (accessMessageInMemoryMaxRatio) suggests whichBrokerWhenConsumeSlowly, anything else the
        master (0); a slave says the same, so its consumers go back once they read hot data."""
        s = self.settings
        return s.whichBrokerWhenConsumeSlowly if (result.suggest_pulling_from_slave and s.slaveReadEnable) else 0

    def _count_pulled(self, topic: str, group: str, count: int, size: int) -> None:
        """Messages and bytes pulled per (topic, group): the metrics' `mqnode_pull_*_total`. A
        group is what the pull names (RocketMQ's consumerGroup; "" when it names none); past
        MAX_PULL_KEYS pairs the rest share one ("_other", "_other")."""
        key = (topic, group)
        counts = self.pulled.get(key)
        if counts is None:
            counts = self.pulled.setdefault(key if len(self.pulled) < MAX_PULL_KEYS else ("_other", "_other"), [0, 0])
        counts[0] += count
        counts[1] += size

    def _store_time(self, phy: int, size: int) -> int | None:
        raw = self.reader.record_bytes(phy, size)
        record = decode(raw, check_crc=False, read_body=False) if raw else None
        return record.store_timestamp if isinstance(record, Record) else None

    def _offset_by_time(self, header: dict, dispatched: int) -> int:
        topic, queue_id, stamp = header["topic"], header["queueId"], header["timestamp"]
        view = self.reader.queue(topic, queue_id, dispatched)
        offset, low = view.queue.offset_by_time(stamp, self._store_time), view.min_offset(self.reader.commitlog_min)
        if self.reader.floors.get(topic):
            offset = max(offset, low)  # (the queue's file may begin below: a deleted topic's messages)
        bound = self.reader.archive_floor(topic, queue_id) if self.tiered is not None else None
        if bound is None or offset > low:
            return offset
        first = view.queue.entry(low)  # the store's first message: the archive's last may be nearer
        try:  # a time at or before the store's first message: the archive's answer, if nearer
            archived = self.tiered.offset_by_time(topic, queue_id, stamp, low,
                                                  first and self._store_time(first.physical_offset, first.size))
        except ArchiveDamaged as e:  # an offset is not data: the store's answer, the damage counted
            self.tiered.failed(str(e))
            return offset
        return offset if archived is None else max(archived, bound)

    def _view(self, header: dict, opaque, written: int) -> list[bytes]:
        """Straight from the CommitLog: every record below `written` is whole, indexed or not. The
        record found must be the one the id names, its store host too: an id of another node (a
        cluster's other group) is not answered with whatever this node stored at that offset."""
        msg_id = header["offsetMsgId"].upper()
        _, offset = decode_msg_id(msg_id)
        raw = self.reader.record_at(offset, written)
        record = decode(raw, check_crc=False, read_body=False) if raw is not None else None
        if not isinstance(record, Record):
            return [orjson.dumps(protocol.reply_header(opaque, "QUERY_NOT_FOUND", f"no message at offset {offset}"))]
        if record.msg_id != msg_id:
            remark = f"no message {msg_id} here: the one at offset {offset} was stored by {record.store_host}"
            return [orjson.dumps(protocol.reply_header(opaque, "QUERY_NOT_FOUND", remark))]
        return [orjson.dumps(protocol.reply_header(opaque, "OK")), raw]

    def _query(self, header: dict, opaque, dispatched: int, behind: bool):
        topic, key = header["topic"], header["key"]
        begin, end = header.get("beginTimestamp", 0), header.get("endTimestamp", 2**62)
        max_count = min(header.get("maxNum", 32), self.settings.maxMsgsNumBatch)
        self.index.refresh()
        found = []
        for offset in self.index.query(topic, key, max_count, begin, end):
            raw = self.reader.record_at(offset, dispatched)
            record = decode(raw, check_crc=False, read_body=False) if raw else None
            # the index matches by hash: re-check topic and key (UNIQ_KEY or one of KEYS)
            if isinstance(record, Record) and record.topic == topic and (key == record.uniq_key or key in record.keys):
                found.append(raw)
        if not found and behind:
            return DEFER  # the key may be in a record the index does not have yet
        if not found:
            return [orjson.dumps(protocol.reply_header(opaque, "QUERY_NOT_FOUND", f"no message with key {key}"))]
        return [orjson.dumps(protocol.reply_header(opaque, "OK", count=len(found))), b"".join(found)]

    # -- reads that wait for the dispatcher -----------------------------------------------------------

    def _defer(self, written: int, header: dict, client: bytes, arrival: int, out: list) -> None:
        if len(self.deferred) >= MAX_DEFERRED:
            out.append((client, -arrival, orjson.dumps(protocol.reply_header(
                header.get("opaque"), "SYSTEM_BUSY", f"{MAX_DEFERRED} reads already wait for the dispatcher"))))
            return
        self.deferrals += 1
        self.deferred.append([written, self.clock() + DEFER_MAX_S, client, arrival, header])

    def _serve_deferred(self, out: list) -> None:
        """Serve the deferred reads the dispatcher has caught up with (a pull may then be held);
        answer SYSTEM_BUSY to those it left waiting too long."""
        dispatched, now, keep = self.control.get("dispatched"), self.clock(), []
        for entry in self.deferred:
            written, give_up_at, client, arrival, header = entry
            if dispatched >= written:
                reply = self.serve(header, client, arrival, allow_hold=True, written=written)
                if reply is DEFER:
                    raise InvariantBroken("a read served with the dispatcher caught up was deferred again")
            elif now >= give_up_at:
                reply = [orjson.dumps(protocol.reply_header(header.get("opaque"), "SYSTEM_BUSY",
                                                            "the dispatcher is behind; try again"))]
            else:
                keep.append(entry)
                continue
            if reply is not None:
                out.append((client, -arrival, *reply) if len(reply) == 2 else (client, -arrival, reply[0]))
        self.deferred = keep

    # -- long polling ------------------------------------------------------------------------------

    def _hold(self, topic: str, queue_id: int, header: dict, client: bytes, arrival: int) -> None:
        if self.settings.longPollingEnable:
            wait_ms = header.get("suspendTimeoutMillis", DEFAULT_SUSPEND_MS)  # (its range: actors.edge)
        else:
            wait_ms = self.settings.shortPollingTimeMills
        deadline = self.clock() + wait_ms / 1000
        self.held.setdefault((topic, queue_id), []).append([deadline, client, arrival, header])
        self.held_count += 1
        self.soonest = min(self.soonest, deadline)

    def catch_up(self, out: list) -> None:
        """Look at each held pull's queue once more (when holding starts: `follow_arrivals`)."""
        dispatched = self.control.get("dispatched")
        for key in list(self.held):
            self._wake(key, self.reader.queue(key[0], key[1], dispatched).max_offset, out)

    def on_arrivals(self, announcements, out: list) -> None:
        """The dispatcher's "queue grew" announcements: (topic, queueId, max offset)."""
        for topic, queue_id, max_offset in announcements:
            self._wake((topic, queue_id), max_offset, out)

    def _wake(self, key: tuple[str, int], max_offset: int, out: list) -> None:
        """Answer the pulls held on queue `key` that `max_offset` has passed."""
        waiting = self.held.get(key)
        if not waiting:
            return
        keep = []
        for held in waiting:
            if held[3]["queueOffset"] < max_offset:
                self.woken += 1
                self._release(held, out)
            else:
                keep.append(held)
        self._set_waiting(key, keep)

    def _expire(self, out: list) -> None:
        """Walk the held pulls only when the soonest deadline has come (the front calls this
        every turn, thousands of times a second under load, with maybe thousands held)."""
        now = self.clock()
        if not self.held_count or now < self.soonest:
            return
        soonest = float("inf")
        for key in list(self.held):
            keep = []
            for held in self.held[key]:
                if held[0] <= now:
                    self.expired += 1
                    self._release(held, out)
                else:
                    keep.append(held)
                    soonest = min(soonest, held[0])
            self._set_waiting(key, keep)
        self.soonest = soonest

    def _set_waiting(self, key, keep: list) -> None:
        self.held_count -= len(self.held.get(key, ())) - len(keep)
        if keep:
            self.held[key] = keep
        else:
            self.held.pop(key, None)

    def _release(self, held: list, out: list) -> None:
        _, client, arrival, header = held
        reply = self.serve(header, client, arrival, allow_hold=False)  # (written 0: never deferred)
        out.append((client, -arrival, *reply) if len(reply) == 2 else (client, -arrival, reply[0]))

    def release_all(self, out: list) -> None:
        """Stop: answer every held pull now, and the deferred reads as they stand."""
        for entry in self.deferred:
            reply = self.serve(entry[4], entry[2], entry[3], allow_hold=False)
            out.append((entry[2], -entry[3], *reply) if len(reply) == 2 else (entry[2], -entry[3], reply[0]))
        self.deferred = []
        for key in list(self.held):
            for held in self.held.pop(key):
                self._release(held, out)
        self.held_count = 0
        if self.watching:
            self.set_watching(False)

    def statistics(self) -> dict:
        return {"served": self.served, "found": self.found, "held": self.held_count, "woken": self.woken,
                "pulled": [[topic, group, n, size] for (topic, group), (n, size) in self.pulled.items()],
                "expired": self.expired, "deferred": len(self.deferred), "deferrals": self.deferrals,
                **({"tiered": self.tiered.statistics()} if self.tiered is not None else {})}

    def close(self) -> None:
        self.reader.close()
        self.index.close()
