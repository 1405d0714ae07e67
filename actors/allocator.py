"""allocator: creates (and, with `warmMapedFileEnable`, warms) the next CommitLog segment before
the writer needs it, so the writer never waits on fallocate or first-touch page faults.

No sockets but statistics: it watches the control block's `written` every few ms. Files are
made by `shm.mapped_file.allocate`, which links a fully allocated file into place and never
replaces one the writer made first. A full disk is reported in its statistics and retried
once a second; the writer answers CREATE_MAPEDFILE_FAILED if it gets there first.
"""

from __future__ import annotations

import mmap
import time

from actors.base import Actor
from shm.mapped_file import AllocationFailed, MappedFile, allocate, file_name

WATCH_MS = 20
RETRY_S = 1.0


class Allocator(Actor):
    name = "allocator"

    def open(self) -> None:
        self.segment_size = self.settings.mappedFileSizeCommitLog
        self.directory = self.settings.commitlog_dir
        self.directory.mkdir(parents=True, exist_ok=True)
        self.allocated = self.warmed = self.failures = 0
        self.last_error = ""
        self.retry_at = 0.0

    def turn(self) -> None:
        self.stopping.wait(WATCH_MS / 1000)
        if time.monotonic() < self.retry_at:
            return
        written = self.control.get("written")
        following = (written // self.segment_size + 1) * self.segment_size
        path = self.directory / file_name(following)
        if path.exists():
            return
        try:
            if allocate(path, self.segment_size):
                self.allocated += 1
                if self.settings.warmMapedFileEnable:
                    self._warm(path)
        except AllocationFailed as e:
            self.failures += 1
            self.last_error = str(e)
            self.retry_at = time.monotonic() + RETRY_S

    def _warm(self, path) -> None:
        """Read (never write: the writer may already be filling the file) one byte of every page,
        which brings the whole file into the page cache."""
        segment = MappedFile(path, self.segment_size, readonly=True)
        try:
            segment.map.madvise(mmap.MADV_WILLNEED)
            segment.map[::mmap.PAGESIZE]
            self.warmed += 1
        finally:
            segment.close()

    def statistics(self) -> dict:
        return super().statistics() | {"allocated": self.allocated, "warmed": self.warmed,
                                       "failures": self.failures, "lastError": self.last_error}
