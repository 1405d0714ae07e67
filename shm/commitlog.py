"""The CommitLog: every message of every topic, appended to one log of fixed-size segments.

Files: `commitlog/<20-digit start offset>`, each exactly `mappedFileSizeCommitLog` bytes,
allocated before mapping. Record layout: see `shm.codec`. A segment ends with a BLANK record
(8 bytes written; the rest of the file is whatever the allocation held, zeros) when the next
record does not fit with 8 bytes to spare; the record then starts the next segment. A new
segment must leave `keep_free` bytes free on its disk (Settings.commitlog_headroom: the writer's
and the ha-client's logs), else AllocationFailed as if the disk had refused it.

Checksums: each record carries the CRC-32 of its body; recovery checks it (checkCRCOnRecover).

Positions (global offsets), with their single writer — the process that opened the log
writable (the append writer; on a slave, the HA client):
    offset_min <= offset_flushed <= offset_committed <= offset_written
Other processes open the log `readonly` and read only below the written offset published in
the control block; a record's bytes are in place before that counter moves past them.

Crash policy: the log is the truth. Start-up recovery (shm.recovery) walks it, keeps the longest
prefix of valid records and truncates the rest; ConsumeQueue and IndexFile are derived from it.
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from shm.codec import (
    BLANK_MAGIC,
    END_FILE_MIN_BLANK_LENGTH,
    MESSAGE_MAGIC,
    Blank,
    Corruption,
    Record,
    decode,
    encode_blank,
)
from shm.encoded_batch import EncodedBatch
from shm.file_queue import MappedFileQueue
from shm.invariant import invariant
from shm.mapped_file import StoreError

try:
    from shm import _append
except ImportError:  # pragma: no cover - built wherever gcc and the Python headers are
    _append = None

NATIVE = _append is not None and os.environ.get("MQNODE_NATIVE", "1") != "0"
_QUEUE_AND_PHYSICAL = struct.Struct(">qq")
_TIMESTAMP = struct.Struct(">q")
_HEADER = struct.Struct(">ii")


class RecordTooLarge(StoreError):
    pass


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where each record of a batch landed, in batch order."""

    physical_offsets: list[int]
    queue_offsets: list[int]
    store_timestamp: int
    offset_written: int  # the log's end after this batch


class CommitLog:
    def __init__(self, directory: Path, segment_size: int, *, readonly: bool = False, keep_free: int = 0):
        self.segments = MappedFileQueue(directory, segment_size, readonly=readonly, drop_blank_after_gap=True,
                                        keep_free=keep_free)
        self.segment_size = segment_size
        # "topic-queueId" -> next queue offset; rebuilt from the ConsumeQueues after recovery.
        self.queue_offsets: dict[str, int] = {}

    # -- positions -------------------------------------------------------------------------------

    @property
    def offset_min(self) -> int:
        return self.segments.offset_min

    @property
    def offset_written(self) -> int:
        return self.segments.offset_written

    @property
    def offset_flushed(self) -> int:
        return self.segments.offset_flushed

    def check_positions(self) -> None:
        flushed, written = self.offset_flushed, self.offset_written
        invariant(self.offset_min <= flushed <= written, (self.offset_min, flushed, written))

    # -- writing ---------------------------------------------------------------------------------

    def append_batch(self, batch: EncodedBatch, store_timestamp: int, *, atomic: bool = False) -> AppendResult:
        """Place a batch at the end of the log: one copy per segment touched and, per record,
        the queue and physical offsets and the store time patched in. Records never straddle a
        segment; when the next one does not fit (with 8 bytes to spare) the segment is closed
        with a blank record and the rest goes on in the next one. `atomic` keeps the whole batch
        in one segment, as RocketMQ stores a client's MessageExtBatch.
        """
        invariant(not self.segments.readonly)
        n = len(batch)
        physical = [0] * n
        queue = [0] * n
        i = 0
        while i < n:
            segment = self.segments.last_writable(self.offset_written)
            j = self._fitting(batch, i, segment.space_left)
            if atomic and j < n:
                if segment.position_written == 0:
                    raise RecordTooLarge(f"a batch of {batch.size_bytes} bytes cannot fit a segment of {self.segment_size}")
                j = i
            if j == i:
                self._close_segment(segment, batch.sizes[i])
                continue
            self._place(batch, i, j, segment, store_timestamp, physical, queue)
            i = j
        return AppendResult(physical, queue, store_timestamp, self.offset_written)

    def _fitting(self, batch: EncodedBatch, i: int, space: int) -> int:
        """Index just past the last record from i on that fits in `space` with 8 bytes spare."""
        start = batch.positions[i]
        limit = start + space - END_FILE_MIN_BLANK_LENGTH
        if len(batch.data) <= limit:
            return len(batch)
        # Record k ends where record k+1 starts; find the first start beyond the limit.
        return max(i, bisect_right(batch.positions, limit, i + 1, len(batch)) - 1)

    def _close_segment(self, segment, next_size: int) -> None:
        if segment.position_written == 0:
            raise RecordTooLarge(f"a record of {next_size} bytes cannot fit a segment of {self.segment_size}")
        segment.write(segment.position_written, encode_blank(segment.space_left))
        segment.set_written(segment.size)

    def _place(self, batch: EncodedBatch, i: int, j: int, segment, store_timestamp: int,
               physical: list[int], queue: list[int]) -> None:
        data, positions = batch.data, batch.positions
        start = positions[i]
        end = positions[j] if j < len(batch) else len(data)
        base = segment.offset_start + segment.position_written - start
        _place_records(data, positions, batch.queue_keys, batch.timestamp_offsets, i, j, self.queue_offsets, base,
                       store_timestamp, physical, queue)
        # Disk boundary check: what goes in starts with a well-formed record header.
        invariant(_HEADER.unpack_from(data, start) == (batch.sizes[i], MESSAGE_MAGIC))
        segment.write(segment.position_written, memoryview(data)[start:end])
        segment.set_written(segment.position_written + end - start)

    def flush(self) -> int:
        flushed = self.segments.flush()
        self.check_positions()
        return flushed

    def discard_after(self, offset: int) -> int:
        """Zero the records (and blank) a writer placed past `offset` without publishing them: a
        failed append, or a killed predecessor. Left in place, new records could end exactly where
        a stale, valid-looking one begins, and a later recovery would bring it back. Later
        segments are zeroed too, never deleted: readers in other processes (the dispatcher, the
        pulls) may have them mapped, and a segment deleted and made again would leave them reading
        the deleted file's pages for good (seen: a dispatcher stalled at the segment boundary
        after the writer was killed). Returns the bytes zeroed."""
        zeroed = 0
        for segment in self.segments.files:
            if segment.offset_end <= offset:
                continue
            start = max(0, offset - segment.offset_start)
            end = min(segment.size, _record_run_end(segment.map, start, segment.size) + 4096)
            segment.zero(start, end)
            zeroed += end - start
        return zeroed

    def truncate(self, offset: int) -> list[str]:
        """Cut the log at `offset` (recovery): later segments are deleted."""
        return self.segments.truncate(offset)

    # -- reading ---------------------------------------------------------------------------------

    def read(self, offset: int, *, limit: int | None = None, check_crc: bool = False,
             read_body: bool = True) -> Record | Blank | Corruption | None:
        """The record at global `offset`, or None when the offset holds no readable data."""
        limit = self.offset_written if limit is None else limit
        segment = self.segments.find(offset)
        if segment is None or offset >= limit:
            return None
        end = min(segment.position_written, limit - segment.offset_start)
        item = decode(segment.map, offset - segment.offset_start, check_crc=check_crc, limit=end,
                      read_body=read_body)
        return _globalise(item, segment.offset_start)

    def read_bytes(self, offset: int, size: int) -> bytes | None:
        """Raw bytes of one record (a pull reply carries these)."""
        segment = self.segments.find(offset)
        if segment is None or offset + size > segment.offset_start + segment.position_written:
            return None
        position = offset - segment.offset_start
        return segment.map[position: position + size]

    def iterate(self, offset: int | None = None, *, limit: int | None = None, check_crc: bool = False,
                read_body: bool = True) -> Iterator[Record | Corruption]:
        """Records from `offset` to the end, skipping segment padding; stops after a corruption."""
        offset = self.offset_min if offset is None else offset
        limit = self.offset_written if limit is None else limit
        while offset < limit:
            item = self.read(offset, limit=limit, check_crc=check_crc, read_body=read_body)
            if item is None:
                return
            if isinstance(item, Blank):
                offset = item.position + item.size
                continue
            yield item
            if isinstance(item, Corruption):
                return
            offset += item.total_size

    def close(self) -> None:
        self.segments.close()


def place_records(data: bytearray, positions: list[int], keys: list[str | None], stamps: list[int], i: int, j: int,
                  table: dict[str, int], base: int, store_timestamp: int, physical: list[int],
                  queue: list[int]) -> None:
    """Records [i, j) of a batch whose first byte lands at global offset `base`: each takes its
    queue's next offset from `table` (None keys take 0 and advance nothing), gets its queue and
    physical offsets and the store time patched in, and its offsets noted in `physical`/`queue`.
    The reference for its C twin (`shm._append.place`, chosen when built)."""
    pack_offsets, pack_timestamp = _QUEUE_AND_PHYSICAL.pack_into, _TIMESTAMP.pack_into
    for k in range(i, j):
        at = positions[k]
        key = keys[k]
        queue_offset = 0 if key is None else table.get(key, 0)
        pack_offsets(data, at + 20, queue_offset, base + at)
        pack_timestamp(data, at + stamps[k], store_timestamp)
        if key is not None:  # counted once patched, as in C: a failed patch leaves its queue as it was
            table[key] = queue_offset + 1
        physical[k] = base + at
        queue[k] = queue_offset


_place_records = _append.place if NATIVE else place_records


def _record_run_end(buf, position: int, limit: int) -> int:
    """End of the run of record-shaped entries (message or blank headers) from `position`."""
    for _ in range(limit // 8 + 1):  # each step moves forward by at least 8 bytes
        if limit - position < 8:
            return limit
        size, magic = _HEADER.unpack_from(buf, position)
        if magic not in (MESSAGE_MAGIC, BLANK_MAGIC) or size < 8:
            return position
        position = min(limit, position + size)
    return limit


def _globalise(item, start: int):
    """Positions inside a segment, turned into global offsets."""
    if isinstance(item, Record):
        object.__setattr__(item, "position", start + item.position)
        return item
    if isinstance(item, Blank):
        return Blank(start + item.position, item.size)
    return Corruption(start + item.position, item.kind, item.detail, item.size)
