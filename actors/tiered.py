"""Tiered reads: a pull below a queue's min offset, of data the clean service deleted, is served
from the Parquet archive (`tieredArchiveDir`, written by `scripts/pipeline archive`) as the very
records that were stored: the same bytes, the same body CRC.

The archive's manifest (shm.archive_manifest) names its files; each holds one segment's records
of one topic and one day, sorted by queue and queue offset, in row groups of at most 2,048 rows.
`TieredArchive` indexes them by two columns, `queueId` and `queueOffset`: for each (topic, queue),
runs of consecutive offsets (first offset, count, file, first row), a few per file. A read finds
the run, decodes the row groups it needs (`envelope`, `body` and `tags` only; an LRU of at most
CACHE_BYTES of them, so a consumer reading on decodes each group once) and joins each envelope
with its body (shm.codec.with_body), which checks the length, TOTALSIZE and body CRC: a record
that does not come back exactly, or not at the queue offset the index says, raises
ArchiveDamaged, which the pull answers SYSTEM_ERROR, never with other bytes. A segment whose
files cannot be read is reported and left out of the index (the others are indexed); while
one is, a read that would skip offsets (below the queue's first, or across a gap) raises too,
since they may be in it.

The index follows the manifest: looked at (a stat) at most once a REFRESH_S, and at once when a
read misses, since the clean service deletes only segments the manifest holds: a pull that finds
the store's data gone finds it here. Reads are pyarrow in the node's read path (the front, or a
pull worker), not Spark: a row group is a few milliseconds of decoding, once per 2,048 rows.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from shm import archive_manifest
from shm.codec import peek_queue_offset, with_body
from shm.reader import FOUND, NO_MATCHED_MESSAGE, OFFSET_TOO_SMALL  # the store's statuses, so a pull maps them alike

log = logging.getLogger("mqnode.tiered")

REFRESH_S = 1.0  # how stale the index may be when reads hit
CACHE_BYTES = 64 * 1024 * 1024  # decoded row groups kept (the one being read always is)
MAX_SCAN = 4096  # rows a pull looks at (a tag filter that matches little stops here, as the store's scan does)
COLUMNS = ["envelope", "body", "tags"]



class ArchiveDamaged(RuntimeError):
    """A file the manifest names is missing or unreadable, or a record did not come back whole."""


@dataclass(frozen=True)
class Run:
    first: int  # the queue offset of its first row
    count: int
    file: int  # index into TieredArchive.files
    row: int  # its first row in that file
    last_ms: int  # the store time of its last row (a queue's store times do not go back)


@dataclass
class _Queue:
    firsts: list[int] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)

    def add(self, run: Run) -> None:
        at = bisect.bisect_left(self.firsts, run.first)
        self.firsts.insert(at, run.first)
        self.runs.insert(at, run)

    def at_or_after(self, offset: int) -> tuple[Run, int] | None:
        """The run holding `offset` and `offset`, or the next run and its first offset."""
        i = bisect.bisect_right(self.firsts, offset) - 1
        if i >= 0 and offset < self.runs[i].first + self.runs[i].count:
            return self.runs[i], offset
        if i + 1 < len(self.runs):
            return self.runs[i + 1], self.runs[i + 1].first
        return None


@dataclass(frozen=True)
class _File:
    path: Path
    group_starts: list[int]  # the first row of each row group, and the row count last


@dataclass
class TieredRead:
    status: str  # FOUND, NO_MATCHED_MESSAGE (looked at rows, none matched) or OFFSET_TOO_SMALL
    records: list[bytes]
    next_begin: int
    min_offset: int


class TieredArchive:
    """The archive at `directory` as a read path; `clock` (monotonic seconds) paces the refreshes."""

    def __init__(self, directory: str | Path, *, clock=time.monotonic, cache_bytes: int = CACHE_BYTES):
        self.directory = Path(directory).expanduser()
        self.clock = clock
        self.cache_bytes = cache_bytes
        self.files: list[_File] = []
        self.queues: dict[tuple[str, int], _Queue] = {}
        self.indexed: set[str] = set()  # segment names
        self.damaged: set[str] = set()  # segments the manifest names whose files cannot be read
        self.seen: tuple[int, int] | None = None  # the manifest's (mtime_ns, size) last read
        self.next_look = 0.0
        self.cache: OrderedDict[tuple[int, int], tuple[int, list, list, list]] = OrderedDict()
        self.cached = 0
        self.reads = self.served = self.groups_decoded = self.refreshes = self.failures = 0
        self.last_error = ""

    # -- the index -------------------------------------------------------------------------------

    def refresh(self, *, force: bool = False) -> bool:
        """Index the segments the manifest gained since the last look; whether it gained any."""
        now = self.clock()
        if not force and now < self.next_look:
            return False
        self.next_look = now + REFRESH_S
        try:
            stat = (self.directory / archive_manifest.FILE).stat()
        except FileNotFoundError:
            return False
        if (stat.st_mtime_ns, stat.st_size) == self.seen and not self.damaged:  # (damaged: tried again)
            return False
        try:
            manifest = archive_manifest.read(self.directory)
        except archive_manifest.ManifestError as e:
            self.failed(str(e))
            return False
        self.seen = (stat.st_mtime_ns, stat.st_size)
        new = sorted(set(manifest["segments"]) - self.indexed)
        for name in new:
            try:
                self._index_segment([self.directory / relative for relative in manifest["segments"][name]["files"]])
            except ArchiveDamaged as e:  # reported; the others are indexed all the same
                self.failed(str(e))
                self.damaged.add(name)
                continue
            self.damaged.discard(name)
            self.indexed.add(name)
        self.refreshes += 1
        return bool(new)

    def _index_segment(self, paths: list[Path]) -> None:
        """One segment's files into the index, all of them or (ArchiveDamaged) none."""
        read = [_read_runs(path) for path in paths]
        for (path, starts, runs) in read:
            number = len(self.files)
            self.files.append(_File(path, starts))
            for key, first, count, row, last_ms in runs:
                self.queues.setdefault(key, _Queue()).add(Run(first, count, number, row, last_ms))

    # -- reads -----------------------------------------------------------------------------------

    def min_offset(self, topic: str, queue_id: int) -> int | None:
        """The archive's first offset of the queue; None when it holds none."""
        self._refresh_quietly()
        queue = self.queues.get((topic, queue_id))
        return queue.firsts[0] if queue else None

    def read(self, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int, tags: set[str] | None,
             below: int, match: Callable[[bytes], bool] | None = None) -> TieredRead | None:
        """Records of `topic`/`queue_id` from `offset` (from the archive's next offset after a gap
        in it) up to `below` (where the store's own data begins), at most `max_count` of them and,
        past the first, `max_bytes`; only `tags` (all when None) and what `match` (a SQL92
        selector's test of a record's bytes) accepts. None when the archive holds
        nothing at or past `offset` below `below`."""
        self.reads += 1
        self._refresh_quietly()
        queue = self.queues.get((topic, queue_id))
        if queue is None or queue.at_or_after(offset) is None:
            self._refresh_quietly(force=True)
            queue = self.queues.get((topic, queue_id))
        if queue is None:
            return None
        lowest = queue.firsts[0]
        found = queue.at_or_after(offset)
        if self.damaged and (offset < lowest or found is None or found[1] != offset):
            # the offset may be in a segment that cannot be read: never skip what may be there
            raise ArchiveDamaged(f"offset {offset} of {topic}/{queue_id} is not in the index, and segments "
                                 f"{', '.join(sorted(self.damaged))} of the archive cannot be read")
        if offset < lowest:
            return TieredRead(OFFSET_TOO_SMALL, [], lowest, lowest)
        if found is None or found[1] >= below:
            return None
        records, next_begin = self._collect(queue, found, max_count, max_bytes, tags, below, match)
        self.served += len(records)
        return TieredRead(FOUND if records else NO_MATCHED_MESSAGE, records, next_begin, lowest)

    def offset_by_time(self, topic: str, queue_id: int, stamp: int, below: int,
                       below_ms: int | None = None) -> int | None:
        """SEARCH_OFFSET_BY_TIMESTAMP over the archived offsets below `below` (where the store's
        data begins, its first message stored at `below_ms`): the offset whose store time is
        nearest `stamp`, the earlier on a tie, as the store answers. None when the store's
        first message is the nearest (or, without `below_ms`, when every archived one was
        stored before `stamp`): the answer is then the store's."""
        self._refresh_quietly()
        queue = self.queues.get((topic, queue_id))
        before = None  # (offset, ms) of the last archived row stored before `stamp`
        for run in queue.runs if queue else ():
            if run.first >= below:
                break
            if run.last_ms < stamp:
                before = (run.first + run.count - 1, run.last_ms)
                continue
            stamps = self._stamps(run)
            at = int(stamps.searchsorted(stamp))
            if at == run.count:  # (store times that went back: the run's last one is not its latest)
                before = (run.first + run.count - 1, run.last_ms)
                continue
            if at and run.first + at - 1 < below:
                before = (run.first + at - 1, int(stamps[at - 1]))
            if run.first + at >= below:
                break  # the first one at or after `stamp` is in the store
            after = (run.first + at, int(stamps[at]))
            return before[0] if before and stamp - before[1] <= after[1] - stamp else after[0]
        if before is None or below_ms is None:
            return None
        return before[0] if stamp - before[1] <= below_ms - stamp else None

    def _stamps(self, run: Run):
        """The store times (ms) of a run's rows, read from its file."""
        import pyarrow.parquet as pq

        starts = self.files[run.file].group_starts
        first = bisect.bisect_right(starts, run.row) - 1
        last = bisect.bisect_right(starts, run.row + run.count - 1) - 1
        path = self.files[run.file].path
        try:
            table = pq.ParquetFile(path).read_row_groups(list(range(first, last + 1)), columns=["storeTimestamp"])
        except (OSError, ValueError) as e:
            raise ArchiveDamaged(f"{path}: row groups {first}..{last} cannot be read: {e}") from e
        skip = run.row - starts[first]
        return _milliseconds(table.column("storeTimestamp"))[skip: skip + run.count]

    def _collect(self, queue: _Queue, found: tuple[Run, int], max_count: int, max_bytes: int,
                 tags: set[str] | None, below: int, match: Callable[[bytes], bool] | None = None
                 ) -> tuple[list[bytes], int]:
        run, offset = found
        records: list[bytes] = []
        size = scanned = 0
        while offset < below and len(records) < max_count and scanned < MAX_SCAN:
            if offset >= run.first + run.count:
                following = queue.at_or_after(offset)
                if following is None or following[1] >= below:
                    break
                run, offset = following
            start, envelopes, bodies, tag_values = self._group(run.file, run.row + offset - run.first)
            i = run.row + offset - run.first - start
            take = min(len(envelopes) - i, run.first + run.count - offset, below - offset, MAX_SCAN - scanned)
            for j in range(i, i + take):
                if len(records) >= max_count or (records and size + len(bodies[j]) > max_bytes):
                    return records, offset + (j - i)
                if tags is None or tag_values[j] in tags:
                    record = self._record(run.file, envelopes[j], bodies[j], offset + (j - i))
                    if match is None or match(record):
                        records.append(record)
                        size += len(record)
            offset += take
            scanned += take
        return records, offset

    def _record(self, file: int, envelope: bytes, body: bytes, offset: int) -> bytes:
        """The stored record, checked whole (with_body) and at the queue offset the index says."""
        try:
            record = with_body(envelope, body)
        except ValueError as e:
            raise ArchiveDamaged(f"{self.files[file].path}: a record does not come back whole: {e}") from e
        stored = peek_queue_offset(record)
        if stored != offset:
            raise ArchiveDamaged(f"{self.files[file].path}: the record indexed at queue offset {offset} says {stored}")
        return record

    def _group(self, file: int, row: int) -> tuple[int, list, list, list]:
        """The decoded row group of `file` holding `row`: (its first row, envelopes, bodies, tags)."""
        starts = self.files[file].group_starts
        group = bisect.bisect_right(starts, row) - 1
        key = (file, group)
        hit = self.cache.get(key)
        if hit is not None:
            self.cache.move_to_end(key)
            return hit
        import pyarrow.parquet as pq

        path = self.files[file].path
        try:
            table = pq.ParquetFile(path).read_row_group(group, columns=COLUMNS)
        except (OSError, ValueError) as e:
            raise ArchiveDamaged(f"{path}: row group {group} cannot be read: {e}") from e
        decoded = (starts[group], *(table.column(name).to_pylist() for name in COLUMNS))
        self.groups_decoded += 1
        self.cache[key] = decoded
        self.cached += _weight(decoded)
        while self.cached > self.cache_bytes and len(self.cache) > 1:
            _, evicted = self.cache.popitem(last=False)
            self.cached -= _weight(evicted)
        return decoded

    def _refresh_quietly(self, *, force: bool = False) -> None:
        """Refresh; a damaged archive is reported (statistics, the log) and its index kept as it was."""
        try:
            self.refresh(force=force)
        except ArchiveDamaged as e:
            self.failed(str(e))

    def failed(self, why: str) -> None:
        self.failures += 1
        if why != self.last_error:
            log.error("tiered archive %s: %s", self.directory, why)
        self.last_error = why

    def statistics(self) -> dict:
        return {"directory": str(self.directory), "segments": len(self.indexed), "files": len(self.files),
                "queues": len(self.queues), "damaged": sorted(self.damaged), "reads": self.reads, "served": self.served,
                "groupsDecoded": self.groups_decoded, "cachedBytes": self.cached, "refreshes": self.refreshes,
                "failures": self.failures, "lastError": self.last_error}


def _weight(decoded: tuple[int, list, list, list]) -> int:
    return sum(map(len, decoded[1])) + sum(map(len, decoded[2]))


def _read_runs(path: Path) -> tuple[Path, list[int], list[tuple[tuple[str, int], int, int, int, int]]]:
    """A file's row group starts (and its row count last) and its runs of consecutive offsets:
    ((topic, queue), first offset, count, first row, its last row's store time in ms)."""
    import numpy as np
    import pyarrow.parquet as pq

    topic = _partition(path, "topic")
    try:
        parquet = pq.ParquetFile(path)
        table = parquet.read(columns=["queueId", "queueOffset", "storeTimestamp"])
    except (OSError, ValueError) as e:
        raise ArchiveDamaged(f"{path}: named by the archive's manifest, cannot be read: {e}") from e
    starts = [0]
    for i in range(parquet.metadata.num_row_groups):
        starts.append(starts[-1] + parquet.metadata.row_group(i).num_rows)
    queues = table.column("queueId").to_numpy()
    offsets = table.column("queueOffset").to_numpy()
    stamps = _milliseconds(table.column("storeTimestamp"))
    if not len(offsets):
        return path, starts, []
    # a run ends where the queue changes or an offset is not the one before plus one
    breaks = np.flatnonzero((np.diff(queues) != 0) | (np.diff(offsets) != 1)) + 1
    bounds = [0, *breaks.tolist(), len(offsets)]
    return path, starts, [((topic, int(queues[b])), int(offsets[b]), e - b, b, int(stamps[e - 1]))
                          for b, e in zip(bounds, bounds[1:])]


def _milliseconds(column):
    """A timestamp column as epoch ms (numpy int64), whatever its unit."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.cast(pc.cast(column, pa.timestamp("ms")), pa.int64()).to_numpy()


def _partition(path: Path, name: str) -> str:
    """A hive partition's value in `path` (`topic=...`, percent-encoded by pyarrow)."""
    for part in path.parts:
        if part.startswith(name + "="):
            return unquote(part[len(name) + 1:])
    raise ArchiveDamaged(f"{path}: no {name}= partition in its path")
