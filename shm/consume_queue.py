"""ConsumeQueue: the per-(topic, queueId) index of a queue's messages in the CommitLog.

Files: `consumequeue/<topic>/<queueId>/<20-digit logical byte offset of the first entry>`, each
`mappedFileSizeConsumeQueue` bytes rounded up to a multiple of 20 (default 300,000 entries).

Entry n (the queue offset) sits at logical byte n*20; 20 bytes, big-endian:

| offset | width | field                                                            |
|--------|-------|------------------------------------------------------------------|
| 0      | 8     | CommitLog physical offset of the record                          |
| 8      | 4     | record size (TOTALSIZE)                                          |
| 12     | 8     | tags code: jhash(TAGS) sign-extended; the delivery time in ms for SCHEDULE_TOPIC_XXXX |

An entry is valid when phy >= 0 and size > 0. A queue whose first message has queue offset n>0
starts with filler entries (phy 0, size 0x7FFFFFFF, tags 0) up to n, as RocketMQ writes them.

A file has its full size on disk but its blocks only as entries come, BLOCKS_AHEAD bytes at a
time, each range before the first entry into it (shm.mapped_file: `blocks_ahead`): a queue of a
few entries holds 64 KiB of disk, not 5.72 MiB, and a full disk is still an AllocationFailed
before the store (a ReputStopped for the dispatcher), never a SIGBUS. RocketMQ's files are sparse
the same way (mapped past their end), without the allocation before the store.

No checksum: the queue is derived. Crash policy: rebuilt from the CommitLog. Recovery scans the
last three files up to the first invalid entry, then entries pointing at or past the recovered
CommitLog end are truncated, and missing ones are re-dispatched from the CommitLog.

Single writer: the reput dispatcher (or start-up recovery before any actor runs). Readers
(pull workers) open the files read-only and stay below the dispatched counter: a reader finds a
queue's end by scanning its entries until one is zero or points at or past `dispatched`, so it
reads entries while they are written, and each entry's size is stored after its phy and tags
(`write_entries`): a size it sees has its phy beside it.

The dispatcher hands entries over in runs (`put_many`): RUN_ENTRY records, each a queue offset
(i64, big-endian) followed by the entry's 20 bytes as stored, so a run is written without a
Python object per entry.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from shm.file_queue import MappedFileQueue
from shm.invariant import invariant
from shm.mapped_file import StoreError
from shm.native import NATIVE, _dispatch  # put_many strips a run's queue offsets in C

ENTRY_SIZE = 20
FILLER_SIZE = 0x7FFFFFFF
ENTRY = struct.Struct(">qiq")  # commitLogOffset, size, tagsCode: the one definition of an entry
_ENTRY = ENTRY
RUN_ENTRY = struct.Struct(">qqiq")  # queue offset, then the entry as stored: put_many's input
BLOCKS_AHEAD = 64 << 10  # a file's blocks are reserved this many bytes at a time (3,276 entries)


def write_entries(segment, position: int, data) -> None:
    """Entries as stored (20 bytes each) into `segment` at `position`, past its written end,
    each one's size after its phy and tags (the module's docstring; shm/_dispatch.c cq_write)."""
    invariant(not segment.readonly and position % ENTRY_SIZE == 0 and len(data) % ENTRY_SIZE == 0
              and position + len(data) <= segment.size, "entries inside a writable file")
    segment.reserve(position + len(data))  # (their blocks first: AllocationFailed, nothing stored)
    if NATIVE:
        _dispatch.cq_write(segment.map, position, data)
        return
    view, to = memoryview(data), segment.map
    for at in range(0, len(view), ENTRY_SIZE):
        to[position + at: position + at + 8] = view[at: at + 8]
        to[position + at + 12: position + at + 20] = view[at + 12: at + 20]
    for at in range(0, len(view), ENTRY_SIZE):  # (a 4-byte aligned copy of 4 bytes: one store)
        to[position + at + 8: position + at + 12] = view[at + 8: at + 12]


def rounded_file_size(configured: int) -> int:
    return -(-configured // ENTRY_SIZE) * ENTRY_SIZE


@dataclass(frozen=True, slots=True)
class Entry:
    queue_offset: int
    physical_offset: int
    size: int
    tags_code: int


class ConsumeQueue:
    def __init__(self, root: Path, topic: str, queue_id: int, file_size: int, *, readonly: bool = False):
        self.topic = topic
        self.queue_id = queue_id
        self.file_size = rounded_file_size(file_size)
        self.directory = Path(root) / topic / str(queue_id)
        self.files = MappedFileQueue(self.directory, self.file_size, readonly=readonly, blocks_ahead=BLOCKS_AHEAD)
        self.offset_min_logical = 0  # bytes; the first live entry is offset_min_logical / 20
        self.max_physical_offset = -1  # phy + size of the last entry written (idempotence)
        if self.files.files:
            self.offset_min_logical = self.files.files[0].offset_start

    @property
    def key(self) -> str:
        return f"{self.topic}-{self.queue_id}"

    # -- positions (in entries) ------------------------------------------------------------------

    @property
    def offset_max(self) -> int:
        """Next queue offset to be written."""
        return self.files.offset_written // ENTRY_SIZE

    @property
    def offset_min(self) -> int:
        return self.offset_min_logical // ENTRY_SIZE

    # -- writing (the dispatcher) ----------------------------------------------------------------

    def put(self, queue_offset: int, physical_offset: int, size: int, tags_code: int) -> bool:
        """Write one entry; a repeat of what is already there is accepted and ignored (§4.4)."""
        invariant(size > 0 and physical_offset >= 0)
        if physical_offset + size <= self.max_physical_offset:
            return True
        expected = queue_offset * ENTRY_SIZE
        if not self.files.files and queue_offset != 0:
            # A queue that starts late (its first message has queue offset > 0).
            self._fill_to(self.files.last_writable(expected), expected)
        elif queue_offset != 0 and expected < self.files.offset_written:
            return True  # already there
        # expected > end would be a hole: RocketMQ logs it and appends at the end anyway.
        segment = self.files.last_writable(expected)
        write_entries(segment, segment.position_written, _ENTRY.pack(physical_offset, size, tags_code))
        segment.set_written(segment.position_written + ENTRY_SIZE)
        self.max_physical_offset = physical_offset + size
        return True

    def put_many(self, run: bytes | bytearray) -> None:
        """`put` for a run of RUN_ENTRY records in queue order. A run that simply continues the
        queue is written with its queue offsets cut out, in one copy per file; anything else (a
        repeat, a late start, a hole) goes through `put` one entry at a time."""
        count = len(run) // RUN_ENTRY.size
        invariant(count * RUN_ENTRY.size == len(run), "a run holds whole entries")
        if not count:
            return
        first_offset, first_phy, first_size, _ = RUN_ENTRY.unpack_from(run, 0)
        last_offset, last_phy, last_size, _ = RUN_ENTRY.unpack_from(run, len(run) - RUN_ENTRY.size)
        contiguous = (last_offset - first_offset == count - 1 and first_offset == self.offset_max
                      and first_phy + first_size > self.max_physical_offset)
        if not contiguous:
            for entry in RUN_ENTRY.iter_unpack(run):
                self.put(*entry)
            return
        data = _dispatch.cq_entries(run) if NATIVE else \
            b"".join(run[at + 8: at + RUN_ENTRY.size] for at in range(0, len(run), RUN_ENTRY.size))
        logical, done = first_offset * ENTRY_SIZE, 0
        while done < len(data):
            segment = self.files.last_writable(logical + done)
            room = min(len(data) - done, segment.size - segment.position_written)
            write_entries(segment, segment.position_written, memoryview(data)[done: done + room])
            segment.set_written(segment.position_written + room)
            done += room
        self.max_physical_offset = last_phy + last_size

    def _fill_to(self, segment, expected: int) -> None:
        filler = _ENTRY.pack(0, FILLER_SIZE, 0)
        count = (expected - segment.offset_start) // ENTRY_SIZE
        write_entries(segment, 0, filler * count)
        segment.set_written(count * ENTRY_SIZE)
        segment.position_flushed = segment.position_committed = count * ENTRY_SIZE
        self.offset_min_logical = expected

    def flush(self) -> int:
        return self.files.flush()

    # -- reading ---------------------------------------------------------------------------------

    def entry(self, queue_offset: int) -> Entry | None:
        logical = queue_offset * ENTRY_SIZE
        if queue_offset < self.offset_min or logical >= self.files.offset_written:
            return None
        segment = self.files.find(logical)
        if segment is None:
            return None
        phy, size, tags = _ENTRY.unpack_from(segment.map, logical - segment.offset_start)
        return Entry(queue_offset, phy, size, tags)

    def raw_entries(self, queue_offset: int, max_count: int, *, limit_offset: int | None = None) -> bytes:
        """`entries` as the raw 20-byte entries (readers that walk many and keep few)."""
        logical = queue_offset * ENTRY_SIZE
        segment = self.files.find(logical)
        if segment is None or queue_offset < self.offset_min:
            return b""
        end = segment.position_written
        if limit_offset is not None:
            end = min(end, limit_offset * ENTRY_SIZE - segment.offset_start)
        start = logical - segment.offset_start
        end = min(end, start + max_count * ENTRY_SIZE)
        return segment.map[start:end] if end > start else b""

    def entries(self, queue_offset: int, max_count: int | None = None, *, limit_offset: int | None = None,
                ) -> list[Entry]:
        """Entries from `queue_offset` to the end of the readable part of its file (as getMessage
        reads), at most `max_count`, never at or past `limit_offset` (a published counter).
        """
        logical = queue_offset * ENTRY_SIZE
        segment = self.files.find(logical)
        if segment is None or queue_offset < self.offset_min:
            return []
        end = segment.position_written
        if limit_offset is not None:
            end = min(end, limit_offset * ENTRY_SIZE - segment.offset_start)
        start = logical - segment.offset_start
        if max_count is not None:
            end = min(end, start + max_count * ENTRY_SIZE)
        if end <= start:
            return []
        raw = segment.map[start:end]
        return [Entry(queue_offset + i, phy, size, tags)
                for i, (phy, size, tags) in enumerate(_ENTRY.iter_unpack(raw))]

    @staticmethod
    def matching(entries: list[Entry], tags_codes: set[int] | None) -> list[Entry]:
        """The entries whose tag code is subscribed (None or an empty set: all, as `*`)."""
        if not tags_codes:
            return entries
        return [e for e in entries if e.tags_code in tags_codes]

    def offset_by_time(self, timestamp: int, store_time_of: Callable[[int, int], int | None]) -> int:
        """The queue offset whose message's store time is nearest `timestamp` (ties: the earlier),
        by binary search over the entries; `store_time_of(phy, size)` reads the CommitLog.
        """
        low, high = self.offset_min, self.offset_max - 1
        if high < low:
            return 0
        times: dict[int, int] = {}

        def time_at(offset: int) -> int:
            if offset not in times:
                e = self.entry(offset)
                t = store_time_of(e.physical_offset, e.size) if e else None
                times[offset] = -1 if t is None else t
            return times[offset]

        first, last = low, high
        while low <= high:
            middle = (low + high) // 2
            t = time_at(middle)
            if t < timestamp:
                low = middle + 1
            elif t > timestamp:
                high = middle - 1
            else:
                # the first of equal times
                while middle > first and time_at(middle - 1) == timestamp:
                    middle -= 1
                return middle
        if low > last:
            return last
        if high < first:
            return first
        # timestamp falls between high and low: the nearer wins, the earlier on a tie
        return high if timestamp - time_at(high) <= time_at(low) - timestamp else low

    # -- recovery --------------------------------------------------------------------------------

    def recover(self) -> int:
        """Find the end of valid entries in the last three files; returns entries dropped.
        Opened read-only, it only finds the end (in memory) and deletes nothing."""
        files = self.files.files
        if not files:
            return 0
        dropped = 0
        index = max(0, len(files) - 3)
        for segment in files[index:]:
            segment.set_written(segment.size)
        data = [segment.data() for segment in files[index:]]  # each one's bytes (past them: zeros)
        for at, (segment, raw) in enumerate(zip(files[index:], data)):
            valid = self._valid_prefix(raw)
            if valid < segment.size:
                dropped = self._count_dropped(raw[valid:]) + sum(map(self._count_dropped, data[at + 1:]))
                if dropped and not self.files.readonly:  # (past the last byte written all is zeros, or holes)
                    segment.zero(valid, valid + len(raw[valid:].rstrip(b"\0")))
                self.files.truncate(segment.offset_start + valid)
                break
        self._update_max_physical()
        return dropped

    @staticmethod
    def _valid_prefix(raw: bytes) -> int:
        """The end of the entries in a file's bytes `raw` (its data: zeros follow) from its
        start to the first invalid one."""
        whole = len(raw) - len(raw) % ENTRY_SIZE
        for i, (phy, size, _) in enumerate(_ENTRY.iter_unpack(memoryview(raw)[:whole])):
            if phy < 0 or size <= 0:
                return i * ENTRY_SIZE
        if whole < len(raw):  # an entry cut by the data's end: zeros follow it
            phy, size, _ = _ENTRY.unpack(raw[whole:].ljust(ENTRY_SIZE, b"\0"))
            return whole + ENTRY_SIZE if phy >= 0 and size > 0 else whole
        return whole

    @staticmethod
    def _count_dropped(raw: bytes) -> int:
        """Valid-looking entries in `raw`, bytes from an entry's start (zeros follow them)."""
        if raw == bytes(len(raw)):  # (a memcmp; strip looked at 64 KiB of zeros a byte at a time)
            return 0  # the usual case: the zeros after the last entry
        raw = raw.ljust(rounded_file_size(len(raw)), b"\0")
        return sum(1 for phy, size, _ in _ENTRY.iter_unpack(raw) if size > 0 and phy >= 0)

    def _update_max_physical(self) -> None:
        self.max_physical_offset = -1
        last = self.offset_max - 1
        entry = self.entry(last) if last >= self.offset_min else None
        if entry is not None and entry.size != FILLER_SIZE:
            self.max_physical_offset = entry.physical_offset + entry.size

    def truncate_dirty(self, physical_offset: int) -> int:
        """Drop entries pointing at or past `physical_offset` (the recovered CommitLog end)."""
        dropped = 0
        while self.files.files:
            segment = self.files.files[-1]
            entries = list(_ENTRY.iter_unpack(segment.map[: segment.position_written]))
            keep = next((i for i, (phy, size, _) in enumerate(entries)
                         if size != FILLER_SIZE and phy >= physical_offset), len(entries))
            dropped += len(entries) - keep
            if keep == 0:
                dropped_file = self.files.files.pop()
                dropped_file.close() if self.files.readonly else dropped_file.destroy()
                continue
            if not self.files.readonly:
                segment.zero(keep * ENTRY_SIZE, len(entries) * ENTRY_SIZE)
            self.files.truncate(segment.offset_start + keep * ENTRY_SIZE)
            break
        self._update_max_physical()
        return dropped

    def correct_min_offset(self, commitlog_min: int) -> None:
        """minLogicOffset = first real entry whose message is still in the CommitLog. Looked for
        past the first file too: a crash between the clean service's CommitLog and
        ConsumeQueue deletions leaves whole files of entries below the CommitLog's min."""
        if not self.files.files:
            self.offset_min_logical = 0
            return
        for segment in self.files.files:
            raw = segment.map[: segment.position_written - segment.position_written % ENTRY_SIZE]
            for i, (phy, size, _) in enumerate(_ENTRY.iter_unpack(raw)):
                if size != FILLER_SIZE and phy >= commitlog_min:
                    self.offset_min_logical = segment.offset_start + i * ENTRY_SIZE
                    return
            self.offset_min_logical = segment.offset_start + len(raw)
            if segment.position_written < segment.size:
                return

    def destroy(self) -> None:
        self.files.destroy()
        self.offset_min_logical = 0
        self.max_physical_offset = -1

    def close(self) -> None:
        self.files.close()


def entries(raw) -> list[tuple[int, int, int]]:
    """(commitLogOffset, size, tagsCode) of each whole entry in `raw` (a trailing part is left)."""
    return list(ENTRY.iter_unpack(raw[: len(raw) - len(raw) % ENTRY_SIZE]))


def last_entry_offset(path) -> int | None:
    """The commitLogOffset of a ConsumeQueue file's last entry, read without mapping it (the clean
    service's test of whether a whole file lies below the CommitLog's min offset); None when the
    file cannot be read or holds no whole entry."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < ENTRY_SIZE:
                return None
            return ENTRY.unpack(os.pread(f.fileno(), ENTRY_SIZE, size - size % ENTRY_SIZE - ENTRY_SIZE))[0]
    except (OSError, struct.error):
        return None


DROPPED_OFFSETS = ".dropped-queue-offsets"  # mqnode's, in consumequeue/: JSON {"topic-queueId": next queue offset}


def dropped_offsets(root: Path) -> dict[str, int]:
    """"topic-queueId" -> the next queue offset of each queue of a deleted topic that was dropped
    (shm.store.MessageStore.drop_queues_of), from `root`/DROPPED_OFFSETS: where the writer numbers
    the topic on, and below which a queue offset is a deleted topic's. StoreError when damaged."""
    path = Path(root) / DROPPED_OFFSETS
    try:
        kept = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except orjson.JSONDecodeError:
        kept = None
    if not isinstance(kept, dict) or not all(type(offset) is int for offset in kept.values()):
        # (written whole and renamed into place: only damage or a hand gets here)
        raise StoreError(f"{path} is not the JSON of queue offsets it should be: restore it, or delete it "
                         "(deleted topics sent to again are then numbered from 0)")
    return kept
