"""Dispatch: turn CommitLog records into their ConsumeQueue entries and IndexFile keys.

Shared by start-up recovery and the reput dispatcher, so both build the derived structures the
same way. Idempotent: dispatching a record twice changes nothing (ConsumeQueue.put and
IndexService.build_index skip what they already hold).

`dispatch` handles one decoded Record (the reference). `reput` is the fast path: it walks the
log with one unpack per record into a `DispatchBatch` of up to BATCH_RECORDS, packing each
queue's entries (ConsumeQueue.RUN_ENTRY) and the batch's hashed index keys (INDEX_KEY) into
bytearrays, then writes each queue's run in one copy and links the index keys with numpy. A test
holds the two to identical bytes.

The scan's common case also runs in C (`shm/_dispatch.c`), when it was compiled at install and
`MQNODE_NATIVE=0` is not set; the Python scan stays the reference, and takes every record the C
loop stops in front of. tests/unit/test_native_dispatch.py holds the two to the same batch.
"""

from __future__ import annotations

import time

from array import array

from shm.codec import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    SCHEDULE_TOPIC,
    TRANSACTION_COMMIT,
    TRANSACTION_MASK,
    TRANSACTION_NOT,
    TRANSACTION_ROLLBACK,
    Blank,
    Corruption,
    Record,
    dispatch_fields,
    index_key_hash,
    tags_code,
)
from shm.consume_queue import RUN_ENTRY
from shm.index_file import INDEX_KEY
from shm.javacompat import jhash_cached
from shm.mapped_file import AllocationFailed, StoreError
from shm.native import NATIVE, _dispatch

_SCHEDULE_RAW = SCHEDULE_TOPIC.encode()


def delivery_time(store_timestamp: int, level_text: str, delay_levels_ms: list[int]) -> int | None:
    """The SCHEDULE_TOPIC_XXXX tag slot: store time + the level's delay, the level clamped to the
    highest configured one (as RocketMQ clamps it); None for a level that is not a positive int."""
    try:
        level = min(int(level_text), len(delay_levels_ms))
    except ValueError:
        return None
    return store_timestamp + delay_levels_ms[level - 1] if level > 0 else None


def tags_code_of(record: Record, delay_levels_ms: list[int]) -> int:
    properties = record.properties
    if record.topic == SCHEDULE_TOPIC and PROPERTY_DELAY in properties:
        due = delivery_time(record.store_timestamp, properties[PROPERTY_DELAY], delay_levels_ms)
        if due is not None:
            return due
    return tags_code(record.tags)


def is_queued(record: Record) -> bool:
    """PREPARED and ROLLBACK records never reach a ConsumeQueue."""
    return record.sys_flag & TRANSACTION_MASK in (TRANSACTION_NOT, TRANSACTION_COMMIT)


def dispatch(store, record: Record) -> None:
    """Write `record`'s ConsumeQueue entry and index keys into `store` (a MessageStore)."""
    if is_queued(record):
        queue = store.consume_queue(record.topic, record.queue_id)
        queue.put(record.queue_offset, record.physical_offset, record.total_size,
                  tags_code_of(record, store.delay_levels_ms))
        store.checkpoint.logics_timestamp = record.store_timestamp
    if store.settings.messageIndexEnable:
        store.index.build_index(record.topic, record.physical_offset, record.store_timestamp,
                                record.sys_flag, record.uniq_key, record.keys)


BATCH_RECORDS = 4096  # records dispatched per batch: bounds the memory a batch holds


class DispatchBatch:
    """Dispatch requests collected in CommitLog order and applied together: ConsumeQueue entries
    packed per queue, index keys hashed and linked per batch. Same bytes as `dispatch` per record.

    `queue_entries`: (topic, queueId) -> a bytearray of RUN_ENTRY records. `index_keys`: a
    bytearray of INDEX_KEY records, UNIQ_KEY then each KEYS token of each record but ROLLBACKs."""

    def __init__(self, store):
        self.store = store
        self.index_enabled = store.settings.messageIndexEnable
        self.queue_entries: dict[tuple[str, int], bytearray] = {}
        self.index_keys = bytearray()
        self.count = 0
        self.logics_timestamp = 0
        self.touched: dict | None = None
        self.native = NATIVE
        self.delay_table = array("q", store.delay_levels_ms).tobytes()  # the C scan's level -> delay ms

    def scan(self, buf, position: int, limit: int) -> tuple[int, Blank | Corruption | None]:
        """Add records from `position` until `limit`, a blank, damage, or a full batch; returns
        where it stopped and what stopped it (None: the limit or a full batch)."""
        if not self.native:
            return self._scan_python(buf, position, limit, BATCH_RECORDS - self.count)
        index_keys = self.index_keys if self.index_enabled else None
        for _ in range(BATCH_RECORDS + 1):  # each round adds at least the one record C stopped at
            room = BATCH_RECORDS - self.count
            position, added, stamp = _dispatch.scan_v4(buf, position, limit, room, self.queue_entries, index_keys,
                                                       _SCHEDULE_RAW, self.delay_table)
            self.count += added
            if stamp is not None:
                self.logics_timestamp = stamp
            if position >= limit or added == room:
                break
            position, stopped_by = self._scan_python(buf, position, limit, 1)
            if stopped_by is not None:
                return position, stopped_by
        return position, None

    def _scan_python(self, buf, position: int, limit: int, room: int) -> tuple[int, Blank | Corruption | None]:
        """`scan` of up to `room` records in Python, each read by the codec's `dispatch_fields`
        (one unpack for an IPv4 V1 record, no objects), which names whatever stops it."""
        fields, add = dispatch_fields, self._add
        while position < limit and room > 0:
            room -= 1
            item = fields(buf, position, limit)
            if item.__class__ is not tuple:
                return position, item
            add(*item)
            position += item[0]
        return position, None

    def _add(self, size: int, queue_id: int, queue_offset: int, physical_offset: int, sys_flag: int,
             store_timestamp: int, topic: str, text: str) -> None:
        # The three or four properties used here are looked up in the text, not parsed into a
        # dict of all of them: 0.2 against 0.66 µs a record (an `in` test first: most records
        # carry no TAGS or KEYS).
        if sys_flag & TRANSACTION_MASK in (TRANSACTION_NOT, TRANSACTION_COMMIT):
            tags = _value(text, _TAGS) if _TAGS_NAME in text else None
            code = jhash_cached(tags) if tags else 0
            if topic == SCHEDULE_TOPIC:
                level = _value(text, _DELAY)
                due = delivery_time(store_timestamp, level, self.store.delay_levels_ms) if level else None
                code = code if due is None else due
            entries = self.queue_entries.get((topic, queue_id))
            if entries is None:
                entries = self.queue_entries[topic, queue_id] = bytearray()
            entries += RUN_ENTRY.pack(queue_offset, physical_offset, size, code)
            self.logics_timestamp = store_timestamp
        if self.index_enabled and sys_flag & TRANSACTION_MASK != TRANSACTION_ROLLBACK:
            uniq_key = _value(text, _UNIQ_KEY) if _UNIQ_NAME in text else None
            keys = _value(text, _KEYS) if _KEYS_NAME in text else None
            for key in (uniq_key, *(keys.split(" ") if keys else ())):
                if key:
                    self.index_keys += INDEX_KEY.pack(index_key_hash(f"{topic}#{key}"), physical_offset,
                                                      store_timestamp)
        self.count += 1

    def apply(self) -> int:
        """Write what the batch holds; returns how many records that was."""
        store = self.store
        for (topic, queue_id), run in self.queue_entries.items():
            store.consume_queue(topic, queue_id).put_many(run)
            if self.touched is not None:
                self.touched[topic, queue_id] = RUN_ENTRY.unpack_from(run, len(run) - RUN_ENTRY.size)[0] + 1
        if self.index_keys:
            store.index.build_many(self.index_keys)
        if self.logics_timestamp:
            store.checkpoint.logics_timestamp = self.logics_timestamp
        count, self.count = self.count, 0
        self.queue_entries, self.index_keys, self.logics_timestamp = {}, bytearray(), 0
        return count


_TAGS_NAME, _KEYS_NAME, _UNIQ_NAME = (name + NAME_VALUE_SEPARATOR for name in
                                     (PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY))
_TAGS, _KEYS, _UNIQ_KEY, _DELAY = ((name + NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR + name + NAME_VALUE_SEPARATOR)
                                   for name in (PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY, PROPERTY_DELAY))


def _value(text: str, name: tuple[str, str]) -> str | None:
    """The value of the property `name` (its "NAME\x01" and "\x02NAME\x01") in a properties
    text, exactly as `parse_properties` reads it: the last pair of that name with a non-empty
    value wins (Java skips empty ones; a HashMap's put keeps the last). A value runs to the next
    pair separator, and no name or value can hold one, so a match is always a whole name."""
    first, later = name
    before = len(text)
    while before > 0:  # each round looks further left: at most one round a pair
        at = text.rfind(later, 0, before)
        if at >= 0:
            value_at = at + len(later)
        elif text.startswith(first):
            at, value_at = 0, len(first)
        else:
            return None
        end = text.find(PROPERTY_SEPARATOR, value_at)
        value = text[value_at:] if end < 0 else text[value_at:end]
        if value:
            return value
        before = at
    return None


class ReputStopped(StoreError):
    """A reput that could not write an entry (a full disk: no room for a ConsumeQueue or index
    file). Every record below `reached` has its entries (`count` of them dispatched), so its
    caller may publish that much; the rest is dispatched again later (idempotent)."""

    def __init__(self, reached: int, count: int, cause: StoreError):
        super().__init__(str(cause))
        self.reached, self.count = reached, count


def reput(store, begin: int, end: int | None = None, touched: dict | None = None,
          deadline: float | None = None) -> tuple[int, int]:
    """Dispatch every record in [begin, end) of the CommitLog; returns (next offset, records).
    With `deadline` (time.monotonic()), it returns after the first batch that ends past it, where
    that batch ended: the dispatcher's turn, which beats between turns, stays short even when
    each record makes a new queue (~1 ms each: 15,000 took 12 s, past the hang timeout).

    The core of the reput dispatcher and of recovery's catch-up. Stops early at damage (a
    record that does not decode), returning where it stopped so the caller can report it.
    `touched`, when given, receives (topic, queueId) -> the queue's new max offset. A full
    disk is ReputStopped, with how far it got: a dispatcher far behind must still publish the
    segments it finished (the clean service deletes only those, which is what makes room).
    """
    log = store.commitlog
    end = log.offset_written if end is None else end
    batch = DispatchBatch(store)
    batch.touched = touched
    offset, total = begin, 0
    applied = begin  # every record below it has its entries
    try:
        while offset < end:
            segment = log.segments.find(offset)
            if segment is None:
                break
            start = segment.offset_start
            position, limit = offset - start, min(segment.position_written, end - start)
            for _ in range(limit // 91 // BATCH_RECORDS + 2):  # each round fills a batch or stops
                position, stopped_by = batch.scan(segment.map, position, limit)
                if batch.count < BATCH_RECORDS:
                    break
                total += batch.apply()
                applied = start + position
                if deadline is not None and time.monotonic() > deadline:
                    return applied, total
            offset = start + position
            blank = isinstance(stopped_by, Blank)
            if blank:
                offset = start + stopped_by.position + stopped_by.size
            total += batch.apply()  # (a batch never spans two segments: one finished is published whole)
            applied = offset
            if not blank and (stopped_by is not None or (position < segment.size and offset < end)):
                break  # damage; or limit is the segment's written end, short of `end`: nothing more here
            if deadline is not None and time.monotonic() > deadline:
                break
        return offset, total
    except AllocationFailed as e:
        raise ReputStopped(applied, total, e) from e
