"""Whole-store consistency check, read-only (safe beside a running node; it takes no lock).

Checks, and reports each failure as a fault naming where:
  1. every CommitLog record is well formed and its body CRC matches, up to the end of data;
  2. every ConsumeQueue entry points at a record of that topic, queue and queue offset, with the
     record's size and tag code;
  3. every record that belongs in a ConsumeQueue is in it (unless cleaned from the queue head);
  4. every UNIQ_KEY and KEYS token of a record finds the record through the IndexFile.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from shm.codec import TRANSACTION_MASK, TRANSACTION_ROLLBACK, Blank, Corruption, decode
from shm.consume_queue import FILLER_SIZE
from shm.dispatch import is_queued, tags_code_of
from shm.mapped_file import StoreError
from shm.settings import Settings
from shm.store import MessageStore

FAULT_LIMIT = 1000  # stop listing after this many; the count stays exact


@dataclass
class VerifyReport:
    records: int = 0
    bytes: int = 0
    queues: int = 0
    queue_entries: int = 0
    index_keys: int = 0
    offset_min: int = 0
    offset_end: int = 0
    fault_count: int = 0
    faults: list[str] = field(default_factory=list)

    def fault(self, text: str) -> None:
        self.fault_count += 1
        if len(self.faults) < FAULT_LIMIT:
            self.faults.append(text)

    @property
    def ok(self) -> bool:
        return self.fault_count == 0

    def summary(self) -> str:
        lines = [f"CommitLog: {self.records} records, {self.bytes} bytes, offsets {self.offset_min}..{self.offset_end}",
                 f"ConsumeQueues: {self.queues} queues, {self.queue_entries} entries",
                 f"IndexFile: {self.index_keys} keys checked"]
        lines += [f"FAULT: {f}" for f in self.faults]
        if self.fault_count > len(self.faults):
            lines.append(f"... and {self.fault_count - len(self.faults)} more faults")
        lines.append("OK: no fault found" if self.ok else f"FAILED: {self.fault_count} fault(s)")
        return "\n".join(lines)


@dataclass(slots=True)
class _Seen:
    topic: str
    queue_id: int
    queue_offset: int
    size: int
    tags_code: int
    queued: bool
    in_queue: bool = False


def walk_records(store: MessageStore, start: int | None = None, *, check_crc: bool = False):
    """Records of a store opened read-only, from `start` to the end of data; yields a damaging
    Corruption as the last item if one stops the walk."""
    segments = store.commitlog.segments.files
    if not segments:
        return
    offset = store.commitlog.offset_min if start is None else start
    while True:
        segment = store.commitlog.segments.find(offset)
        if segment is None:
            return
        item = decode(segment.map, offset - segment.offset_start, check_crc=check_crc)
        if isinstance(item, Blank):
            offset = segment.offset_end
            continue
        if isinstance(item, Corruption):
            if item.is_damage:
                yield Corruption(offset, item.kind, item.detail, item.size)
            return
        object.__setattr__(item, "position", offset)
        yield item
        offset += item.total_size


def verify_store(settings: Settings) -> VerifyReport:
    report = VerifyReport()
    if not settings.commitlog_dir.is_dir():
        report.fault(f"no store at {settings.root}: {settings.commitlog_dir} does not exist")
        return report
    try:
        store = MessageStore(settings, readonly=True)
    except StoreError as e:
        report.fault(str(e))
        return report
    try:
        store.index.load()
        store.load_consume_queues()
        for queue in store.consume_queues.values():
            queue.recover()  # read-only: finds each queue's end, changes nothing on disk
        seen, keys = _check_commitlog(store, report)
        _check_queues(store, seen, report)
        if settings.messageIndexEnable:
            _check_index(store, keys, report)
    except StoreError as e:
        report.fault(str(e))
    finally:
        store.close()
    return report


def _check_commitlog(store: MessageStore, report: VerifyReport):
    seen: dict[int, _Seen] = {}
    keys: dict[tuple[str, str], list[int]] = defaultdict(list)
    report.offset_min = report.offset_end = store.commitlog.offset_min
    for item in walk_records(store, check_crc=True):
        if isinstance(item, Corruption):
            report.fault(f"CommitLog {item.kind.value} at offset {item.position}: {item.detail}")
            break
        report.records += 1
        report.bytes += item.total_size
        report.offset_end = item.position + item.total_size
        if item.physical_offset != item.position:
            report.fault(f"record at {item.position} says PHYSICALOFFSET {item.physical_offset}")
        seen[item.position] = _Seen(item.topic, item.queue_id, item.queue_offset, item.total_size,
                                    tags_code_of(item, store.delay_levels_ms), is_queued(item))
        if item.sys_flag & TRANSACTION_MASK != TRANSACTION_ROLLBACK:  # ROLLBACK records are not indexed
            for key in ([item.uniq_key] if item.uniq_key else []) + item.keys:
                keys[item.topic, key].append(item.position)
    return seen, keys


def _check_queues(store: MessageStore, seen: dict[int, _Seen], report: VerifyReport) -> None:
    queue_mins: dict[tuple[str, int], int] = {}
    for (topic, queue_id), queue in sorted(store.consume_queues.items()):
        report.queues += 1
        queue.correct_min_offset(store.commitlog.offset_min)
        queue_mins[topic, queue_id] = queue.offset_min
        offset = queue.offset_min
        while offset < queue.offset_max:
            entries = queue.entries(offset)
            if not entries:
                report.fault(f"ConsumeQueue {topic}/{queue_id}: no readable entry at offset {offset}")
                break
            for entry in entries:
                _check_entry(topic, queue_id, entry, seen, report)
            offset = entries[-1].queue_offset + 1
    dropped = store.dropped_offsets()  # "topic-queueId" -> next offset of a deleted topic's queue dropped
    for phy, record in seen.items():
        if record.queued and not record.in_queue:
            if record.queue_offset < max(queue_mins.get((record.topic, record.queue_id), 0),
                                         dropped.get(f"{record.topic}-{record.queue_id}", 0)):
                continue  # cleaned from the head of its queue, or its deleted topic's queue dropped
            report.fault(f"record at {phy} ({record.topic}/{record.queue_id} offset {record.queue_offset}) "
                         "is missing from its ConsumeQueue")


def _check_entry(topic: str, queue_id: int, entry, seen: dict[int, _Seen], report: VerifyReport) -> None:
    where = f"ConsumeQueue {topic}/{queue_id} offset {entry.queue_offset}"
    if entry.size == FILLER_SIZE and entry.physical_offset == 0:
        return
    report.queue_entries += 1
    record = seen.get(entry.physical_offset)
    if record is None:
        report.fault(f"{where} points at {entry.physical_offset}, where no record starts")
        return
    mismatches = [name for name, want, got in (
        ("topic", topic, record.topic), ("queueId", queue_id, record.queue_id),
        ("queueOffset", entry.queue_offset, record.queue_offset), ("size", entry.size, record.size),
        ("tagsCode", entry.tags_code, record.tags_code)) if want != got]
    if mismatches:
        report.fault(f"{where} -> {entry.physical_offset}: {', '.join(mismatches)} differ")
    if record.in_queue:
        report.fault(f"{where}: record {entry.physical_offset} is in its queue twice")
    record.in_queue = True


def _check_index(store: MessageStore, keys: dict[tuple[str, str], list[int]], report: VerifyReport) -> None:
    for (topic, key), offsets in keys.items():
        found = set(store.index.query_all(topic, key))
        for phy in offsets:
            report.index_keys += 1
            if phy not in found:
                report.fault(f"index: key {topic}#{key} does not lead to record {phy}")
