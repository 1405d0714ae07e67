"""Reading a running store from another process: RocketMQ's getMessage over read-only mappings.

A `StoreReader` opens the CommitLog and ConsumeQueues read-only and trusts nothing past the
`dispatched` counter it is handed (from the control block): every ConsumeQueue entry for a
record below it is in place, and every record it points at is whole. Files the writer and the
dispatcher create later are picked up on demand (`refresh`).

`get_message` follows spec §10.1: the queue bounds decide NO_MESSAGE_IN_QUEUE, OFFSET_TOO_SMALL,
OFFSET_OVERFLOW_ONE, OFFSET_OVERFLOW_BADLY; otherwise a scan of that ConsumeQueue file from the
offset (at most max(16000, maxMsgNums*20) bytes) filters by tag code, stops at the transfer
limits (hot: 32 messages / 256 KiB; cold: 8 / 64 KiB) and returns the raw records, with
nextBeginOffset = offset + entries scanned.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from shm.codec import (
    MIN_RECORD_SIZE, TRANSACTION_COMMIT, TRANSACTION_HEAD_BYTES, Record, decode, peek_transaction,
)
from shm.commitlog import CommitLog
from shm.consume_queue import ConsumeQueue, ENTRY, ENTRY_SIZE, FILLER_SIZE, dropped_offsets
from shm.mapped_file import StoreError
from shm.ring import FENCED, fence

_ENTRY = ENTRY  # (shm.consume_queue's: the one definition of an entry)
SCAN_CHUNK = 4096 * ENTRY_SIZE  # bytes of ConsumeQueue looked at per step when finding its end

FOUND = "FOUND"
NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"


@dataclass
class GetResult:
    status: str
    next_begin_offset: int
    min_offset: int
    max_offset: int
    records: list[bytes] = field(default_factory=list)  # runs of whole records, back to back
    count: int = 0  # records in them
    suggest_pulling_from_slave: bool = False


MAX_NEW_FILES_A_LOOK = 64  # ConsumeQueue files a refresh may find new (a bound on the loop)


class QueueView:
    """A ConsumeQueue as a reader sees it: its end found by scanning forward from the last
    known end, never past an entry whose record is not yet dispatched."""

    def __init__(self, root: Path, topic: str, queue_id: int, file_size: int):
        self.queue = ConsumeQueue(root, topic, queue_id, file_size, readonly=True)
        self.end = 0  # logical bytes known valid
        self.min_cache: tuple[object, int, int] | None = None  # (first file, bound, min offset)
        self.refreshed_at = -1  # the `dispatched` of the last refresh
        self.floor = 0  # its topic's deletion floor: its entries below it are a deleted topic's

    def refresh(self, dispatched: int) -> None:
        """Advance the known end over entries written since, a chunk at a time; list the
        directory only when the end reaches the last file known. Nothing to do while
        `dispatched` stands still: the dispatcher publishes it after the entries below it are
        in place, so the last look at this value saw them all (a look cost ~10% of a pull)."""
        if dispatched == self.refreshed_at:
            return
        self.refreshed_at = dispatched
        files = self.queue.files
        if not files.files or self.end >= files.files[-1].offset_end:
            files.refresh()
            if not files.files:
                self.end = 0
                return
            for segment in files.files:
                segment.position_written = min(segment.size, max(0, self.end - segment.offset_start))
            self.queue.offset_min_logical = files.files[0].offset_start  # bounds entry() and offset_by_time
        self.end = max(self.end, files.files[0].offset_start)
        for _ in range(MAX_NEW_FILES_A_LOOK):
            known = len(files.files)
            for segment in files.files:
                if segment.offset_end <= self.end:
                    continue
                if not self._advance(segment, dispatched):
                    return
            # every known file is full: the dispatcher may have begun the next one before it
            # published `dispatched` (this look would otherwise be the last for that value, and
            # a reader would stay at this file's end until the next write anywhere)
            files.refresh()
            if len(files.files) == known:
                return

    def _advance(self, segment, dispatched: int) -> bool:
        """Scan `segment` from the known end; True when it is full (go on to the next file).

        The scan reads entries the dispatcher may be writing this moment. It stores an entry's
        size after its phy and tags (shm.consume_queue.write_entries), so the sizes are taken
        from a first copy and the rest from a second: a size seen in the first has its phy in
        the second. (One copy could hold a new size beside a phy not yet written, 0, and the
        entry passed for a record at CommitLog offset 0.)"""
        position = max(0, self.end - segment.offset_start)
        chunk = 64 * ENTRY_SIZE  # small first: usually only a few entries are new
        for _ in range(segment.size // ENTRY_SIZE + 1):
            stop = min(segment.size, position + chunk)
            stop -= (stop - position) % ENTRY_SIZE
            sizes = segment.map[position: stop]
            if FENCED:
                fence()  # (x86 keeps loads in order anyway; other CPUs need telling)
            raw = segment.map[position: stop]
            chunk = min(chunk * 4, SCAN_CHUNK)
            count = 0
            for (_, size, _), (phy, _, _) in zip(_ENTRY.iter_unpack(sizes), _ENTRY.iter_unpack(raw)):
                if size <= 0 or phy < 0 or (size != FILLER_SIZE and phy + size > dispatched):
                    break
                count += 1
            position += count * ENTRY_SIZE
            segment.position_written = position
            self.end = segment.offset_start + position
            if count * ENTRY_SIZE < len(raw) or position >= segment.size:
                break
        return position >= segment.size

    @property
    def max_offset(self) -> int:
        return self.end // ENTRY_SIZE

    def min_offset(self, commitlog_min: int = 0) -> int:
        """The first entry that is no filler and whose record is still stored (at or above the
        CommitLog's `commitlog_min`: RocketMQ's correctMinOffset) and not a deleted topic's (at
        or above `floor`). Entries point forward in the CommitLog, so it is found by bisection;
        cached per first file and bound (this used to copy the whole first file on every pull,
        a third of a pull worker's time)."""
        files = self.queue.files.files
        if not files:
            return 0
        first, bound = files[0], max(commitlog_min, self.floor)
        if self.min_cache is not None and self.min_cache[0] is first and self.min_cache[1] == bound:
            return self.min_cache[2]
        found = self.first_at_or_past(bound)
        if found is None:
            return self.end // ENTRY_SIZE  # nothing stored (yet): not cached
        self.min_cache = (first, bound, found)
        return found

    def first_at_or_past(self, physical: int) -> int | None:
        """The first entry that is no filler and points at or past CommitLog offset `physical`
        (None: none does). Entries point forward in the CommitLog: a bisection a file."""
        for segment in self.queue.files.files:
            count = segment.position_written // ENTRY_SIZE
            view = segment.map
            low, high = 0, count
            while low < high:
                middle = (low + high) // 2
                phy, size, _ = _ENTRY.unpack_from(view, middle * ENTRY_SIZE)
                if size != FILLER_SIZE and phy >= physical:
                    high = middle
                else:
                    low = middle + 1
            if low < count:
                return (segment.offset_start + low * ENTRY_SIZE) // ENTRY_SIZE
            if segment.position_written < segment.size:
                break
        return None

    def end_before(self, physical: int) -> int:
        """The queue's next offset as it was when the CommitLog ended at `physical` (its entries
        point forward: the first one at or past it, else the end known now, which must lie at
        or past `physical`: refreshed with a `dispatched` at or past it)."""
        found = self.first_at_or_past(physical)
        return self.end // ENTRY_SIZE if found is None else found

    def close(self) -> None:
        self.queue.close()


class StoreReader:
    def __init__(self, settings):
        self.settings = settings
        self.commitlog = CommitLog(settings.commitlog_dir, settings.mappedFileSizeCommitLog, readonly=True)
        self.commitlog.segments.load()
        self.queues: dict[tuple[str, int], QueueView] = {}
        self.commitlog_min = 0  # the control block's min_offset, as last followed
        self.floors: dict[str, int] = {}  # topic -> its deletion floor (actors.topics.deletion_floors)
        self.dropped: dict[str, int] = {}  # "topic-queueId" -> where a deleted topic's dropped queue ended
        self._read_dropped()
        self.hot_bytes = psutil.virtual_memory().total * settings.accessMessageInMemoryMaxRatio // 100

    def queue(self, topic: str, queue_id: int, dispatched: int) -> QueueView:
        view = self.queues.get((topic, queue_id))
        if view is None:
            view = self.queues[topic, queue_id] = QueueView(
                self.settings.consumequeue_dir, topic, queue_id, self.settings.mappedFileSizeConsumeQueue)
            view.floor = self.floors.get(topic, 0)
        view.refresh(dispatched)
        return view

    def follow_floors(self, floors: dict[str, int]) -> None:
        """Topics deleted (or the floors cleaning passed forgotten): each queue's entries below
        its topic's floor are passed over from now on, as below the CommitLog's min offset."""
        self.floors = floors
        for (topic, _), view in self.queues.items():
            view.floor = floors.get(topic, 0)

    def archive_floor(self, topic: str, queue_id: int) -> int | None:
        """The lowest queue offset of the queue an archive read may serve (below: a deleted
        topic's messages); None for none at all, while the queue begins at its topic's deletion
        floor rather than where cleaning left it."""
        if self.floors.get(topic, 0) > self.commitlog_min:
            return None
        return self.dropped.get(f"{topic}-{queue_id}", 0)

    def _read_dropped(self) -> None:
        try:
            self.dropped = dropped_offsets(self.settings.consumequeue_dir)
        except StoreError:
            pass  # (damaged by a hand: the dispatcher's start says so; this reader keeps what it knew)

    def follow_min_offset(self, min_offset: int) -> None:
        """The clean service deleted files below `min_offset`: drop their mappings, and bound
        every queue by it from now on."""
        self.commitlog_min = min_offset
        self._read_dropped()  # (or the dispatcher dropped a deleted topic's queues)
        self.commitlog.segments.forget_deleted_head()
        for key, view in list(self.queues.items()):
            files = view.queue.files
            if files.forget_deleted_head() and files.files:
                view.queue.offset_min_logical = files.files[0].offset_start
                view.end = max(view.end, files.files[0].offset_start)
            elif not files.files:  # (a queue the dispatcher dropped, or none yet: a read makes it anew)
                del self.queues[key]

    def record_at(self, offset: int, end: int) -> bytes | None:
        """The whole, well-formed record that starts at `offset`, below the published `end`, or None."""
        if not 0 <= offset < end:
            return None
        head = self.record_bytes(offset, 8)
        if head is None:
            return None
        size = int.from_bytes(head[:4], "big", signed=True)
        raw = self.record_bytes(offset, size) if 0 < size else None
        return raw if raw is not None and isinstance(decode(raw, check_crc=False), Record) else None

    def record_bytes(self, offset: int, size: int) -> bytes | None:
        raw = self.commitlog.read_bytes(offset, size)
        if raw is None:
            self.commitlog.segments.refresh()
            raw = self.commitlog.read_bytes(offset, size)
        return raw

    def commits_stored(self, topic: str, queue_id: int, low: int, high: int, dispatched: int,
                       limit: int = 1 << 62) -> tuple[Counter, int, int]:
        """The committed records (sysFlag COMMIT) of a queue stored at CommitLog offsets in [low,
        high), counted by their PREPAREDTRANSACTIONOFFSET (the half each one commits), reading at
        most `limit` entries: (counts, where to go on from: `high` once the range is read, entries
        read). A queue's entries are in CommitLog order, so the first at or past `low` is found by
        bisection; only each record's head is read, not its body."""
        view = self.queue(topic, queue_id, dispatched)
        first = view.first_at_or_past(max(low, self.commitlog_min))
        found: Counter = Counter()
        if first is None:
            return found, high, 0
        begun = first
        end = min(view.max_offset, first + limit)
        while first < end:
            raw = view.queue.raw_entries(first, end - first, limit_offset=end)
            if not raw:  # (nothing readable there: the queue's rest is gone)
                return found, high, first - begun
            for i, (phy, size, _) in enumerate(ENTRY.iter_unpack(raw)):
                if size == FILLER_SIZE:
                    continue
                if phy >= high:
                    return found, high, first + i - begun
                head = self.record_bytes(phy, min(size, TRANSACTION_HEAD_BYTES)) if size > 0 else None
                if head is not None and len(head) >= MIN_RECORD_SIZE:
                    transaction, prepared = peek_transaction(head)
                    if transaction == TRANSACTION_COMMIT:
                        found[prepared] += 1
            first += len(raw) // ENTRY_SIZE
        if first >= view.max_offset:
            return found, high, first - begun
        entry = view.queue.entry(first)  # (the limit stopped the read: the next entry is where it goes on)
        return found, high if entry is None else min(high, entry.physical_offset), first - begun

    def get_message(self, topic: str, queue_id: int, offset: int, max_count: int, tags_codes: set[int] | None,
                    dispatched: int, match: Callable[[bytes], bool] | None = None) -> GetResult:
        """Up to `max_count` messages of a queue from `offset`: those whose tag hash is in
        `tags_codes` (None: any) and, with `match` (a SQL92 selector's test of a record's bytes),
        those it accepts; the others are passed over as RocketMQ's filters pass them."""
        view = self.queue(topic, queue_id, dispatched)
        low, high = view.min_offset(self.commitlog_min), view.max_offset
        if high == 0:
            return GetResult(NO_MESSAGE_IN_QUEUE, 0, low, high)
        if offset < low:
            return GetResult(OFFSET_TOO_SMALL, low, low, high)
        if offset == high:
            return GetResult(OFFSET_OVERFLOW_ONE, offset, low, high)
        if offset > high:
            return GetResult(OFFSET_OVERFLOW_BADLY, high, low, high)
        limit = max(16000 // ENTRY_SIZE, max_count)
        entries = view.queue.raw_entries(offset, limit, limit_offset=high)
        if not entries:
            per_file = view.queue.file_size // ENTRY_SIZE
            return GetResult(OFFSET_FOUND_NULL, offset + per_file - offset % per_file, low, high)
        return self._scan(entries, offset, max_count, tags_codes, dispatched, low, high, match)

    def _scan(self, entries, offset: int, max_count: int, tags_codes, dispatched: int, low: int,
              high: int, match: Callable[[bytes], bool] | None = None) -> GetResult:
        """Choose the entries to send (tag filter, transfer limits), then read them as runs:
        records of one queue written together lie back to back in the CommitLog, and one slice
        per run costs a third of a slice per record (the pull worker's largest cost)."""
        s = self.settings
        result = GetResult(NO_MATCHED_MESSAGE, offset, low, high)
        total_bytes, chosen, scanned, last_phy = 0, 0, 0, None
        runs: list[tuple[int, int, int]] = []  # (start, end, records) of back-to-back chosen records
        run_start = run_end = run_count = 0
        segment_size = s.mappedFileSizeCommitLog
        # RocketMQ's transfer limits, per entry by where the record lies: in memory (hot) or not
        cold_below = dispatched - self.hot_bytes
        hot_count, hot_bytes = min(max_count, s.maxTransferCountOnMessageInMemory), s.maxTransferBytesOnMessageInMemory
        cold_count, cold_bytes = min(max_count, s.maxTransferCountOnMessageInDisk), s.maxTransferBytesOnMessageInDisk
        for phy, size, tags in _ENTRY.iter_unpack(entries):
            if size == FILLER_SIZE:
                scanned += 1
                continue
            if chosen and (chosen >= cold_count or total_bytes + size > cold_bytes if phy < cold_below
                           else chosen >= hot_count or total_bytes + size > hot_bytes):
                break
            scanned += 1
            last_phy = phy
            if tags_codes and tags not in tags_codes:
                continue
            if match is not None and not self._matches(match, phy, size):
                continue
            chosen += 1
            total_bytes += size
            if run_count and run_end == phy and phy % segment_size:  # a run stays in one segment
                run_end += size
                run_count += 1
            else:
                if run_count:
                    runs.append((run_start, run_end, run_count))
                run_start, run_end, run_count = phy, phy + size, 1
        if run_count:
            runs.append((run_start, run_end, run_count))
        result.next_begin_offset = offset + scanned
        if last_phy is not None:
            result.suggest_pulling_from_slave = dispatched - last_phy > self.hot_bytes
        for start, end, count in runs:
            raw = self.record_bytes(start, end - start)
            if raw is not None:
                result.records.append(raw)
                result.count += count
            elif not result.records:  # its segment is gone (expired files deleted meanwhile)
                result.status = MESSAGE_WAS_REMOVING
        if result.records:
            result.status = FOUND
        return result

    def _matches(self, match, phy: int, size: int) -> bool:
        """`match` on the record at `phy`; a record whose segment is gone is kept (its read
        below finds it gone and says so)."""
        raw = self.record_bytes(phy, size)
        return raw is None or match(raw)

    def close(self) -> None:
        self.commitlog.close()
        for view in self.queues.values():
            view.close()
        self.queues.clear()
