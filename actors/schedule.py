"""schedule: delivers delayed messages (RocketMQ 4.x's ScheduleMessageService, docs/storage.md
"Delayed messages") and takes consumers' send-backs into `%RETRY%<group>` / `%DLQ%<group>`.

A send with `DELAY` = n > 0 is stored in `SCHEDULE_TOPIC_XXXX` queue n-1 (the write path does
that), its ConsumeQueue tag slot holding the due time. Per level, the core walks that queue from
the level's offset: an entry due (its slot <= now; a slot further ahead than the level's delay is
taken as now, RocketMQ's clock-skew guard) is re-put into its real topic and queue, the record's
fields copied (body, flag, sysFlag, born time and host, reconsumeTimes, and the properties string
as stored, so the delivered record keeps DELAY, REAL_TOPIC and REAL_QID, as 4.9's does). An entry
not yet due stops its level until it is. Deliveries of a level are acknowledged in any order; the
level's offset moves to the first one not yet stored, so a message is never lost and, across a
crash, may be delivered twice, never early. Offsets persist in `config/delayOffset.json`
(RocketMQ's format) every `flushDelayOffsetInterval` ms and at stop.

Re-puts travel to the front over the node's private `reput` socket (only the node's processes can
reach the run directory) as send requests that the write path stores as given; the front answers
them over `reput-replies`. The service runs only on a master.

`ScheduleCore` holds the levels without I/O (the reads and the clock are given to it), and
`actors.timer.TimerCore` the timers; `actors.reput` builds the requests; `Schedule` is the
process's shell.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field

import orjson
import zmq

from actors.base import Actor, incoming, socket, wait_readable
from actors.reput import (
    DLQ_PREFIX,
    ReputDeadline,
    delivered_statuses,
    delivery_request,
    reput_item,
    reput_item_raw,
    send_back_request,
    timer_entry,
)
from actors.timer import RECALLED, Recalls, TimerCore
from actors.wire import pack_replies, read_meta
from node import protocol
from node.frames import send_frames
from actors import config_files
from shm import reader as store_reader
from shm.codec import (
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    Record,
    decode,
    decode_msg_id,
    record_properties,
)
from shm import consume_queue
from shm.consume_queue import FILLER_SIZE
from shm.control_block import ROLE_CODES
from shm.mapped_file import AllocationFailed
from shm.timer_log import TimerLog

log = logging.getLogger("mqnode")
LEVEL_IN_FLIGHT = 4096  # re-puts of a level awaiting their answer
REPUT_BATCH = 256  # deliveries a request
TIMER_IN_FLIGHT = 4096  # timer re-puts awaiting their answer
TIMER_TAKE = 8192  # timer messages taken into the log a turn
TIMER_LOOK_MS = 100  # how often new timer messages are looked for
NO_ROOM_AGAIN_S = 1.0  # timer messages the full disk kept out of the log are looked at again after this
TIMER = "timer"  # a timer delivery's key: (TIMER, log index)
RETRY_S = 0.1  # a level whose re-put failed tries again after this (RocketMQ: 100 ms)
IDLE_S = 0.5  # how often a level with nothing due looks again (a new entry is due a level's delay, >= 1 s, later)
PERMANENT = frozenset({"MESSAGE_ILLEGAL", "TOPIC_NOT_EXIST", "NO_PERMISSION"})  # never to be retried
REPUT_CLIENT = b"\x00mqnode-schedule"  # the reput socket's pseudo-client at the front


@dataclass
class Level:
    level: int
    delay_ms: int
    offset: int = 0  # the first queue offset not yet delivered
    read_to: int = 0  # entries below this were handed out
    in_flight: dict[int, bool] = field(default_factory=dict)  # queue offset -> stored
    wait_until: float = 0.0  # monotonic s: nothing to do here before
    delivered: int = 0
    dropped: int = 0
    lag_ms: int = 0  # how late the oldest due entry is


class ScheduleCore:
    """The delay levels: `due(now_s, now_ms, entries_of)` hands out the entries to re-put,
    `stored(level, offset, status)` takes their answers. `entries_of(level, offset, count)` reads
    the level's ConsumeQueue entries from `offset` as (queue offset, phy, size, tag slot)."""

    def __init__(self, delay_levels_ms: list[int], offsets: dict[int, int]):
        self.levels = {n: Level(n, ms, offsets.get(n, 0), offsets.get(n, 0)) for n, ms in
                       enumerate(delay_levels_ms, start=1)}
        self.dirty = False

    def due(self, now_s: float, now_ms: int, entries_of) -> list[tuple[int, int, int, int]]:
        """(level, queue offset, phy, size) of every entry due now that is not yet handed out."""
        out = []
        for level in self.levels.values():
            if now_s < level.wait_until or len(level.in_flight) >= LEVEL_IN_FLIGHT:
                continue
            level.lag_ms = 0
            room = LEVEL_IN_FLIGHT - len(level.in_flight)
            entries = entries_of(level.level, level.read_to, room)
            for offset, phy, size, slot in entries:
                if size == FILLER_SIZE:
                    level.read_to = offset + 1
                    continue
                deliver_at = now_ms if slot > now_ms + level.delay_ms else slot  # the clock-skew guard
                if deliver_at > now_ms:
                    level.wait_until = now_s + min(RETRY_S, (deliver_at - now_ms) / 1000)
                    break
                level.lag_ms = max(level.lag_ms, now_ms - deliver_at)
                level.in_flight[offset] = False
                level.read_to = offset + 1
                out.append((level.level, offset, phy, size))
            else:  # all handed out: more may be waiting when the read was cut at `room`
                level.wait_until = now_s if len(entries) >= room else now_s + IDLE_S
        return out

    def next_look(self) -> float:
        """When some level has something to do next (monotonic s)."""
        return min(level.wait_until for level in self.levels.values())

    def stored(self, level_number: int, offset: int, status: str, now_s: float) -> None:
        """The answer to a re-put: stored, given up (a permanent refusal), or to be tried again."""
        level = self.levels[level_number]
        if offset not in level.in_flight:
            return
        if status == "PUT_OK" or status in PERMANENT:
            level.in_flight[offset] = True
            level.delivered += status == "PUT_OK"
            level.dropped += status != "PUT_OK"
            self._advance(level)
        else:  # not stored: that entry and the ones after it are read again
            for later in [o for o in level.in_flight if o >= offset and not level.in_flight[o]]:
                del level.in_flight[later]
            level.read_to = min(level.read_to, offset)
            level.wait_until = now_s + RETRY_S

    def skip(self, level_number: int, offset: int) -> None:
        """An entry that needs no delivery (a record gone, a transaction half message)."""
        self.stored(level_number, offset, "MESSAGE_ILLEGAL", 0.0)

    def _advance(self, level: Level) -> None:
        while level.in_flight.get(level.offset):
            del level.in_flight[level.offset]
            level.offset += 1
            self.dirty = True
        if not level.in_flight:
            level.offset = max(level.offset, level.read_to)

    def clamp(self, bounds: dict[int, tuple[int, int]]) -> None:
        """At load: each level's offset into its queue's [min, max] (RocketMQ does the same)."""
        for n, (low, high) in bounds.items():
            level = self.levels.get(n)
            if level is not None and not level.in_flight:
                level.offset = level.read_to = min(max(level.offset, low), high)

    def offsets(self) -> dict[int, int]:
        return {n: level.offset for n, level in self.levels.items() if level.offset}

    def statistics(self, max_offsets: dict[int, int]) -> dict:
        return {str(n): {"offset": level.offset, "maxOffset": max_offsets.get(n, 0),
                         "lag": max(0, max_offsets.get(n, 0) - level.offset), "lagMillis": level.lag_ms,
                         "delivered": level.delivered, "dropped": level.dropped, "inFlight": len(level.in_flight),
                         "readTo": level.read_to}
                for n, level in self.levels.items()}


class TimersBlocked(Exception):
    """The timer log has no room for the timer message at `offset` of the timer topic's queue
    (the disk is full); those before it were taken in."""

    def __init__(self, offset: int):
        super().__init__(offset)
        self.offset = offset


class PromotedRestart(RuntimeError):
    """The node was promoted: the service's process ends, and Ray starts it afresh as a master's."""


class Schedule(Actor):
    """The schedule service's process: reads the schedule topic's queues and the records below
    `dispatched`, re-puts through the front's `reput` socket, answers send-backs."""

    name = "schedule"

    def __init__(self, settings, **kwargs):
        super().__init__(settings, **kwargs)
        self.core: ScheduleCore | None = None  # these three opened by `open`, in the actor's thread
        self.reader: store_reader.StoreReader | None = None
        self.timers: TimerCore | None = None
        self.recalls = Recalls()  # (the checkpoint's, once the timers open)
        self.waiting: dict[int, tuple] = {}  # opaque -> (level, offset) or ("back", client, arrival, opaque)
        self.sent_at: dict[int, float] = {}  # opaque -> when its re-put went out (monotonic s)
        self.send_backs_done = self.dlq = self.expired = 0
        self.next_expiry = 0.0
        self.deadline = ReputDeadline()

    def open(self) -> None:
        self.role_at_open = self.control.get("role")
        s = self.settings
        self.delays_ms = s.delay_levels_ms()
        self.path = s.root / "config" / "delayOffset.json"
        data = config_files.read(self.path) or {}
        offsets = {int(k): int(v) for k, v in (data.get("offsetTable") or {}).items()}
        self.core = ScheduleCore(self.delays_ms, offsets)
        self.reader = store_reader.StoreReader(s)
        dispatched = self.control.get("dispatched")
        self.core.clamp({n: (self._view(n, dispatched).min_offset(self.reader.commitlog_min),
                             self._view(n, dispatched).max_offset) for n in self.core.levels})
        self.reputs = socket(self.context, zmq.PUSH, hwm=100000)
        self.reputs.connect(self.endpoints["reput-in"])
        self.answers = socket(self.context, zmq.PULL, hwm=100000)
        self.answers.bind(self.endpoints["reput-out"])
        self.send_backs = socket(self.context, zmq.PULL, hwm=10000)
        self.send_backs.connect(self.endpoints["schedule"])
        self.replies = socket(self.context, zmq.PUSH, hwm=10000)
        self.replies.connect(self.endpoints["replies"])
        self.items = [(self.answers, zmq.POLLIN), (self.send_backs, zmq.POLLIN)]
        self.opaque = random.randrange(1 << 30)
        self.next_persist = time.monotonic() + s.flushDelayOffsetInterval / 1000
        self.timers = self._open_timers(dispatched) if s.timerWheelEnable else None

    def _open_timers(self, dispatched: int) -> TimerCore:
        """The timer log and its wheel, from the checkpoint (`config/timerCheckpoint.json`)."""
        self.timer_path = self.settings.root / "config" / "timerCheckpoint.json"
        check = config_files.read(self.timer_path) or {}
        timer_log = TimerLog(self.settings.root / "timerlog")
        timer_log.open(int(check.get("logEnd", 0)))
        core = TimerCore(timer_log, int(check.get("deliveredMs", 0)), PERMANENT)
        core.rebuild()
        taken = timer_log.entry(timer_log.end - 1)[4] + 1 if timer_log.end > timer_log.start else 0  # the intact prefix's last
        view = self.reader.queue(TIMER_TOPIC, 0, dispatched)
        low = view.min_offset(self.reader.commitlog_min)
        checked = min(max(int(check.get("enqueueOffset", 0)), low), view.max_offset)
        self.timer_offset = min(max(checked, taken, low), view.max_offset)
        self.recalls = Recalls(check.get("recalled"))
        # recalls taken in after the checkpoint are in neither it nor the log: read them again
        self._read_timer_queue(checked, self.timer_offset, dispatched, recalls_only=True)
        self.next_timer_check = time.monotonic() + self.settings.timerFlushIntervalMs / 1000
        self.timers_blocked_until, self.timers_blocked = 0.0, 0  # (a full disk: TimersBlocked)
        return core

    def _view(self, level: int, dispatched: int):
        return self.reader.queue(SCHEDULE_TOPIC, level - 1, dispatched)

    def turn(self) -> None:
        # asleep until a level is due to look again or an answer comes: an idle node's schedule
        # service wakes twice a second, not a hundred times (it shares the cores with the front)
        wait_ms = int((self.core.next_look() - time.monotonic()) * 1000) + 1
        if self.control.get("role") == ROLE_CODES["SLAVE"]:
            wait_ms = 500  # nothing falls due on a slave: only send-backs (answered) and a promotion
        elif self.timers is not None:  # new timer messages are looked for every TIMER_LOOK_MS
            next_due = self.timers.next_due()
            wait_ms = min(wait_ms, TIMER_LOOK_MS, next_due - time.time_ns() // 1_000_000 + 1 if next_due else wait_ms)
        events = wait_readable(self.items, max(1, min(500, wait_ms)))
        now = time.monotonic()
        if self.answers in events:
            for frames in incoming(self.answers, 4096):
                self._answered(frames, now)
        if self.send_backs in events:
            for frames in incoming(self.send_backs, 256):
                self._send_back(frames)
        self._expire(now)
        role = self.control.get("role")
        if role == ROLE_CODES["SLAVE"]:
            return  # a slave delivers nothing: its master does, and the slave follows its log
        if self.role_at_open == ROLE_CODES["SLAVE"]:
            # promoted: start again from the delay offsets the master last sent (restart is recovery)
            raise PromotedRestart("promoted from slave: the schedule service starts afresh")
        dispatched = self.control.get("dispatched")
        due = self.core.due(now, time.time_ns() // 1_000_000, lambda n, at, count: self._entries(n, at, count, dispatched))
        if due:
            self._deliver([((level, offset), phy, size) for level, offset, phy, size in due])
        if self.timers is not None:
            self._take_timers(dispatched, now)
            room = TIMER_IN_FLIGHT - (len(self.timers.firing.in_flight) if self.timers.firing else 0)
            due = self.timers.due(time.time_ns() // 1_000_000, room)
            if due:
                self._deliver([((TIMER, index), phy, size) for index, phy, size in due])
            if now >= self.next_timer_check:
                self.next_timer_check = now + self.settings.timerFlushIntervalMs / 1000
                self._timer_checkpoint()
        if now >= self.next_persist:
            self.next_persist = now + self.settings.flushDelayOffsetInterval / 1000
            self._persist()

    def _entries(self, level: int, offset: int, count: int, dispatched: int):
        """Up to `count` entries of the level's queue from `offset`, across its files."""
        view = self._view(level, dispatched)
        end = min(view.max_offset, offset + count)
        out = []
        while offset < end:
            raw = view.queue.raw_entries(offset, end - offset, limit_offset=view.max_offset)
            if not raw:
                break
            found = consume_queue.entries(raw)
            out += [(offset + i, *entry) for i, entry in enumerate(found)]
            offset += len(found)  # raw_entries stops at its file's end
        return out

    def _take_timers(self, dispatched: int, now: float) -> None:
        """Timer messages stored since the last look into the timer log, TIMER_TAKE at most. A
        full disk (no room for the log's next file) leaves the rest in the timer topic's queue,
        taken in once there is room: looked at again every NO_ROOM_AGAIN_S."""
        if now < self.timers_blocked_until:
            return
        view = self.reader.queue(TIMER_TOPIC, 0, dispatched)
        end = min(view.max_offset, self.timer_offset + TIMER_TAKE)
        try:
            self.timer_offset = self._read_timer_queue(self.timer_offset, end, dispatched)
        except TimersBlocked as blocked:
            self.timer_offset = blocked.offset
            self.timers_blocked_until = now + NO_ROOM_AGAIN_S
            if not self.timers_blocked:
                log.error("schedule: timer messages wait in their queue from offset %d: %s", blocked.offset,
                          blocked.__cause__)
            self.timers_blocked += 1
            return
        if self.timers_blocked:
            log.warning("schedule: timer messages are taken in again (%d looks found no room)", self.timers_blocked)
            self.timers_blocked = 0

    def _read_timer_queue(self, offset: int, end: int, dispatched: int, *, recalls_only: bool = False) -> int:
        """Take in the timer topic's messages from `offset` to `end`: each into the timer log, a
        recall into `recalls` (only those with `recalls_only`); the offset reached."""
        view = self.reader.queue(TIMER_TOPIC, 0, dispatched)
        while offset < end:
            raw = view.queue.raw_entries(offset, end - offset, limit_offset=view.max_offset)
            if not raw:
                break
            for phy, size, _ in consume_queue.entries(raw):
                entry = timer_entry(self.reader.record_bytes(phy, size))
                recalled = entry and Recalls.key_of_recall(entry[1])
                if recalled:
                    self.recalls.add(recalled, entry[0])
                elif entry is not None and not recalls_only:
                    try:
                        self.timers.add(entry[0], phy, size, offset)
                    except AllocationFailed as e:
                        raise TimersBlocked(offset) from e
                offset += 1
        return offset

    def _timer_checkpoint(self) -> None:
        """The log flushed, then the checkpoint naming what the flush made durable; then the
        files wholly delivered go."""
        log_end = self.timers.log.flush()  # an fsync error propagates: the process stops, restart recovers
        self.recalls.prune(self.timers.delivered_ms)
        if config_files.persist(self.timer_path, {"logEnd": log_end, "deliveredMs": self.timers.delivered_ms,
                                                  "enqueueOffset": self.timer_offset, "recalled": self.recalls.snapshot()}):
            self.timers.log.delete_before(self.timers.delivered_ms)  # (not past the checkpoint on disk)

    def _deliver(self, due: list[tuple]) -> None:
        """Re-put due entries, REPUT_BATCH to a request; `due` holds (key, phy, size), the key
        telling `_answered` whose entry it was."""
        items, keys = [], []
        for key, phy, size in due:
            raw = self.reader.record_bytes(phy, size)
            if raw and key[0] == TIMER and self.recalls.keys and self.recalls.cancels(record_properties(raw)):
                self._done(key, RECALLED, 0.0)
                continue
            item = reput_item_raw(raw) if raw else None
            if item is False:  # (an IPv6 host, a V2 record: the whole decode)
                record = decode(raw, check_crc=False)
                item = reput_item(record) if isinstance(record, Record) else None
            if item is None:
                self._done(key, "MESSAGE_ILLEGAL", 0.0)  # gone, or not for delivery: skipped
                continue
            items.append(item)
            keys.append(key)
            if len(items) == REPUT_BATCH:
                self._put(items, keys)
                items, keys = [], []
        if items:
            self._put(items, keys)

    def _put(self, items: list[tuple[dict, bytes]], keys: list[tuple]) -> None:
        header, body = delivery_request(items, self._next_opaque())
        self.waiting[header["opaque"]] = keys
        self.sent_at[header["opaque"]] = time.monotonic()
        send_frames(self.reputs, [REPUT_CLIENT, read_meta(time.monotonic_ns()), orjson.dumps(header), body])

    def _done(self, key: tuple, status: str, now: float) -> None:
        if key[0] == TIMER:
            self.timers.stored(key[1], status, time.time_ns() // 1_000_000)
        else:
            self.core.stored(key[0], key[1], status, now)

    def _answered(self, frames: list[bytes], now: float) -> None:
        self.deadline.answered(now)
        self._answer(orjson.loads(frames[1]), now)  # [client, header]: the front's own frames

    def _expire(self, now: float) -> None:
        """Re-puts unanswered for REPUT_TIMEOUT_S count as not stored: tried again (a send-back is
        answered SYSTEM_BUSY). An answer can be lost when this process restarts while the front
        still holds a connection to the old one; without this, a level would wait for it forever.
        A late answer to an expired re-put is ignored; the entry may be delivered twice, never lost.
        Until the front has answered once since this process opened, a re-put waits longer
        (`ReputDeadline`): a node starting on a loaded machine (18 s, seen) can open this service
        many seconds before its front serves, and overdue timers re-put in that gap would expire
        and go twice."""
        if now < self.next_expiry:
            return
        self.next_expiry = now + 1.0
        for opaque in [o for o, at in self.sent_at.items() if self.deadline.expired(at, now)]:
            self.expired += 1
            self._answer({"opaque": opaque, "status": "SYSTEM_BUSY", "remark": "the re-put was not answered"}, now)

    def _answer(self, header: dict, now: float) -> None:
        self.sent_at.pop(header.get("opaque"), None)
        waiting = self.waiting.pop(header.get("opaque"), None)
        if waiting is None:
            return
        if isinstance(waiting, list):  # a delivery request
            for key, status in zip(waiting, delivered_statuses(header, len(waiting))):
                self._done(key, status, now)
            return
        _, client, arrival, opaque, dlq = waiting  # a send-back
        status = "OK" if header.get("status") == "PUT_OK" else header.get("status", "SYSTEM_ERROR")
        self.send_backs_done += status == "OK"
        self.dlq += status == "OK" and dlq
        reply = protocol.reply_header(opaque, status, header.get("remark", ""))
        self.replies.send(pack_replies([(client, -arrival, orjson.dumps(reply))]))

    def _send_back(self, frames: list[bytes]) -> None:
        client, meta, header_raw, _ = frames  # the front's own frames, checked at the edge
        header, arrival = orjson.loads(header_raw), orjson.loads(meta)["t"]
        offset_id = header.get("offsetMsgId")
        phy = decode_msg_id(offset_id)[1] if offset_id else header["offset"]
        raw = self.reader.record_at(phy, self.control.get("written"))
        record = decode(raw, check_crc=False) if raw else None
        if not isinstance(record, Record):
            reply = protocol.reply_header(header.get("opaque"), "SYSTEM_ERROR", f"no message at offset {phy}")
            self.replies.send(pack_replies([(client, -arrival, orjson.dumps(reply))]))
            return
        request, body = send_back_request(record, header, self._next_opaque(), len(self.delays_ms))
        self.sent_at[request["opaque"]] = time.monotonic()
        self.waiting[request["opaque"]] = ("back", client, arrival, header.get("opaque"),
                                           request["topic"].startswith(DLQ_PREFIX))
        send_frames(self.reputs, [REPUT_CLIENT, read_meta(time.monotonic_ns()), orjson.dumps(request), body])

    def _next_opaque(self) -> int:
        self.opaque = (self.opaque + 1) % (1 << 31)
        return self.opaque

    def _persist(self) -> None:
        if self.core.dirty:  # (a disk that is full: again at the next period)
            self.core.dirty = not config_files.persist(self.path, {"offsetTable": dict(sorted(self.core.offsets().items()))})

    def follow_min_offset(self, min_offset: int) -> None:
        self.reader.follow_min_offset(min_offset)

    def drain(self) -> None:
        self._persist()
        if self.timers is not None:
            self._timer_checkpoint()

    def statistics(self) -> dict:
        if self.core is None or self.reader is None:  # (not opened yet)
            return super().statistics()
        dispatched = self.control.get("dispatched")
        max_offsets = {n: self._view(n, dispatched).max_offset for n in self.core.levels}
        out = super().statistics() | {"levels": self.core.statistics(max_offsets), "sendBacks": self.send_backs_done,
                                      "deadLetters": self.dlq, "waiting": len(self.waiting),
                                      "expired": self.expired}
        if self.timers is not None:
            out["timers"] = self.timers.statistics(time.time_ns() // 1_000_000) | {
                "takenTo": self.timer_offset, "queueMaxOffset": self.reader.queue(TIMER_TOPIC, 0, dispatched).max_offset,
                "recalls": self.recalls.statistics()}
        return out

    def close(self) -> None:
        if self.timers is not None:
            self.timers.log.close()
        if self.reader is not None:
            self.reader.close()
        super().close()
