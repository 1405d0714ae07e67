"""allocator: creates (and, with `warmMapedFileEnable`, warms) the next CommitLog segment before
the writer needs it, so the writer never waits on fallocate or first-touch page faults.

It also reads one byte of every page from the written end to `prefaultAheadBytes` past it,
whatever `warmMapedFileEnable` says: a page the writer first touches must be allocated and
zeroed in the page cache inside the writer's fault, and on the project's virtual machines that costs ~2.5 ms
of system time a MiB (fresh guest memory faults in the host; ext4's large folios take it in
~10-20 ms bites). In the front that was a 15-25 ms stall about every 1.4 s at 5k sends/s
(traced with getrusage per call), and ~2.5 µs of every 1 KiB message's append. Read here, the
pages are in the cache before the writer gets there, and the writer's fault only marks them
dirty (A/B: send_batch and single sends ~10% faster). Reading never changes the file, so it is
safe while the writer fills it.

No sockets but statistics: it watches the control block's `written` every few ms. Files are
made by `shm.mapped_file.allocate`, which links a fully allocated file into place and never
replaces one the writer made first. A full disk is reported in its statistics and retried
once a second; the writer answers CREATE_MAPEDFILE_FAILED if it gets there first and its own
file is refused too (but takes this one's, when it was linked meanwhile: a disk with room for
one more segment has none for two made at once).
"""

from __future__ import annotations

import mmap
import time

from actors.base import Actor, give_way
from shm.control_block import ROLE_CODES
from shm.mapped_file import (
    AllocationFailed,
    MappedFile,
    StoreError,
    allocate,
    file_name,
    no_read_around,
)

WATCH_MS = 20
IDLE_WATCH_MS = 80  # while `written` stands: a burst meets prefaultAheadBytes (32 MiB) already read, 80 ms at 400 MB/s
RETRY_S = 1.0
NICENESS = 10
PREFAULT_STEP = 2 * 1024 * 1024  # bytes read a turn at most: short bursts, prompt stop()


class Allocator(Actor):
    name = "allocator"

    def __init__(self, settings, **kwargs):
        super().__init__(settings, **kwargs)
        self.segment_size = settings.mappedFileSizeCommitLog
        self.directory = settings.commitlog_dir
        self.allocated = self.warmed = self.failures = 0
        self.last_error = ""
        self.retry_at = 0.0
        self.prefaulted = self.prefaulted_bytes = 0  # read up to this offset; bytes read so far
        self.mapped: dict[int, MappedFile] = {}  # segments being read ahead, by start offset
        self.following = -1  # the start of the segment after `written`'s, once it exists: no stat a turn
        self.watch_ms, self.last_written = WATCH_MS, -1

    def open(self) -> None:
        give_way(NICENESS)  # background work: the front and the clients go first on a busy CPU
        self.directory.mkdir(parents=True, exist_ok=True)

    def turn(self) -> None:
        self.stopping.wait(self.watch_ms / 1000)
        written = self.control.get("written")
        # every wake-up costs (~0.1 ms here, whatever the turn does): an idle node's allocator
        # looks less often, doubling its wait up to IDLE_WATCH_MS, and at once again when it moves
        self.watch_ms = WATCH_MS if written != self.last_written else min(2 * self.watch_ms, IDLE_WATCH_MS)
        self.last_written = written
        if written == 0 and self.control.get("role") == ROLE_CODES["SLAVE"]:
            return  # an empty slave's log begins where its master's first transfer lands (actors.ha_client)
        if time.monotonic() >= self.retry_at:
            self._allocate_following(written)
        self._prefault(written)

    def _allocate_following(self, written: int) -> None:
        """The segment after `written`'s, and first `written`'s own when it is missing: at a
        segment's end `written` stands at the start of one the writer has not made (its
        allocation failed on a full disk, say), and a segment made past it would be a gap in the
        log, which no start gets past (shm.file_queue.SegmentGap)."""
        following = (written // self.segment_size + 1) * self.segment_size
        if following == self.following:
            return  # (an idle node's turns did little else: ~15 ms of CPU a second)
        for start in (following - self.segment_size, following):  # in order: never one past a missing one
            path = self.directory / file_name(start)
            if path.exists():
                continue
            try:
                if allocate(path, self.segment_size, keep_free=self.settings.commitlog_headroom):
                    self.allocated += 1
                    if self.settings.warmMapedFileEnable:
                        self._warm(path)
            except AllocationFailed as e:
                self.failures += 1
                self.last_error = str(e)
                self.retry_at = time.monotonic() + RETRY_S
                return
        self.following = following

    def _prefault(self, written: int) -> None:
        """Read one byte a page of [written, written + prefaultAheadBytes), what is not read yet,
        at most PREFAULT_STEP a turn; a segment not made yet waits for a later turn."""
        begin = max(self.prefaulted, written)
        end = min(written + self.settings.prefaultAheadBytes, begin + PREFAULT_STEP)
        if begin >= end:
            return  # read ahead as far as it goes
        for start in [start for start, segment in self.mapped.items() if segment.offset_end <= written]:
            self.mapped.pop(start).close()
        while begin < end:
            segment = self._segment_at(begin)
            if segment is None:
                break
            low = (begin - segment.offset_start) // mmap.PAGESIZE * mmap.PAGESIZE
            high = min(end, segment.offset_end) - segment.offset_start
            _read_pages(segment, low, high)
            self.prefaulted_bytes += high - low
            begin = segment.offset_start + high
        self.prefaulted = begin

    def _segment_at(self, offset: int) -> MappedFile | None:
        start = offset // self.segment_size * self.segment_size
        if start not in self.mapped:
            try:
                self.mapped[start] = MappedFile(self.directory / file_name(start), self.segment_size, readonly=True)
            except (FileNotFoundError, StoreError):
                return None
        return self.mapped[start]

    def _warm(self, path) -> None:
        """Read (never write: the writer may already be filling the file) one byte of every page,
        which brings the whole file into the page cache."""
        segment = MappedFile(path, self.segment_size, readonly=True)
        try:
            _read_pages(segment, 0, segment.size)
            self.warmed += 1
        finally:
            segment.close()

    def statistics(self) -> dict:
        return super().statistics() | {"allocated": self.allocated, "warmed": self.warmed,
                                       "failures": self.failures, "lastError": self.last_error,
                                       "prefaultedTo": self.prefaulted, "prefaultedBytes": self.prefaulted_bytes}

    def close(self) -> None:
        for segment in self.mapped.values():
            segment.close()
        super().close()


def _read_pages(segment: MappedFile, low: int, high: int) -> None:
    """Read one byte of every page of [low, high) (page-aligned `low`), which puts the pages in
    the page cache, then unmap them here again (the page cache keeps them): else the allocator's
    RSS grows to the whole segment, and the node's memory figure with it.

    A page at a time (`no_read_around`): read-around made 8 MiB of page cache in one fault
    here, which held the allocator's CPU ~20 ms every ~8 MiB written while nothing else ran on
    it (a pinned probe saw the same gaps), and the sends and pulls queued there made the latency
    tails."""
    no_read_around(segment.map)  # the whole mapping, so its VMA is not split
    segment.map[low:high:mmap.PAGESIZE]
    segment.map.madvise(mmap.MADV_DONTNEED, low, high - low)
