"""The timer log: every pending timer message of the node, on disk (RocketMQ 5's timerlog,
simplified: no rolls, the wheel kept as an index rebuilt from the log at start).

Files under `<root>/timerlog/`, each named by the index of its first entry (20 digits) and
holding `entries_per_file` entries of 48 bytes, big-endian:

    link_ms   int64   the wheel slot the entry hangs under: its due time, or later when it
                      was taken in after its slot had fired
    due_ms    int64   the message's TIMER_OUT_MS
    phy       int64   CommitLog offset of the stored timer message (topic rmq_sys_wheel_timer)
    prev      int64   index of the entry before it in the same slot, -1 for the slot's first
    cq        int64   the message's offset in the timer topic's queue
    size      int32   the stored record's size
    crc       uint32  CRC32 of the 44 bytes before it

A file gets its blocks (posix_fallocate, shm.mapped_file.allocate) before it is mapped: a full
disk is an AllocationFailed at `append`, which changes nothing, never a SIGBUS in the mapping.
A file opened with fewer blocks than its size (made sparse, by ftruncate, before 738d043) gets
them at open, or, the disk being full then, before the first append into it.
Entries are appended through the mapping; `flush` writes them to disk (a failed flush raises:
the process stops and its restart recovers, never a retry). Crash policy: the checkpoint names
the entries a flush made durable; at open, the entries after it are kept up to the first whose
CRC fails (the intact prefix) and the rest are dropped, to be taken in again from the timer
topic's queue (`next_cq`). A file whose every entry hangs under a slot already delivered is
deleted whole.
"""

from __future__ import annotations

import functools
import mmap
import os
import struct
import zlib
from pathlib import Path

from shm.mapped_file import AllocationFailed, allocate, reserve

ENTRY = struct.Struct(">qqqqqiI")
ENTRY_SIZE = ENTRY.size  # 48
ENTRIES_PER_FILE = 1 << 20  # 48 MiB a file


@functools.cache
def _dtype():
    """ENTRY as numpy's record, for the rebuild's scan. numpy is imported where it is used: the
    front imports this module and never scans, and a log with nothing live is scanned without it."""
    import numpy as np
    dtype = np.dtype([("link", ">i8"), ("due", ">i8"), ("phy", ">i8"), ("prev", ">i8"), ("cq", ">i8"),
                      ("size", ">i4"), ("crc", ">u4")])
    assert dtype.itemsize == ENTRY_SIZE
    return dtype


class TimerLogCorrupt(Exception):
    """The log does not hold what its checkpoint says was made durable."""


class TimerLog:
    def __init__(self, directory: Path, entries_per_file: int = ENTRIES_PER_FILE):
        assert entries_per_file > 0
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.per_file = entries_per_file
        self.files: dict[int, tuple] = {}  # first index -> (fd, mmap)
        self.max_link: dict[int, int] = {}  # first index -> the latest slot an entry of the file hangs under
        self.start = self.end = 0  # live entries are [start, end)
        self.dirty: set[int] = set()
        self.sparse: set[int] = set()  # files whose blocks a full disk refused at open
        self.flushes = 0

    # -- open and recover --------------------------------------------------------------------------

    def open(self, durable_end: int) -> None:
        """Map the files; `end` becomes `durable_end` plus the intact entries after it."""
        firsts = sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit())
        for first in firsts:
            self._map(first)
        self.start = firsts[0] if firsts else durable_end
        if durable_end > self._mapped_end() or durable_end < self.start:
            if firsts or durable_end:
                raise TimerLogCorrupt(f"the checkpoint names {durable_end} entries; the files hold "
                                      f"[{self.start}, {self._mapped_end()})")
        self.end = durable_end
        while self.end < self._mapped_end() and self._intact(self.end):
            self.end += 1

    def _mapped_end(self) -> int:
        return max(self.files) + self.per_file if self.files else self.start

    def _intact(self, index: int) -> bool:
        raw = self._view(index)
        return raw[:8] != bytes(8) and zlib.crc32(raw[:44]) == struct.unpack_from(">I", raw, 44)[0]

    def scan(self):
        """(first index, numpy records) of each file's live part, oldest first: for the rebuild."""
        for first in sorted(self.files):
            lo, hi = max(first, self.start), min(first + self.per_file, self.end)
            if lo < hi:
                import numpy as np  # (here: see _dtype)

                m = self.files[first][1]
                yield lo, np.frombuffer(m, dtype=_dtype(), count=hi - lo, offset=(lo - first) * ENTRY_SIZE)

    def note_links(self) -> None:
        """After a rebuild's scan: each file's latest slot, for `delete_before`."""
        for lo, records in self.scan():
            first = lo - lo % self.per_file
            self.max_link[first] = max(self.max_link.get(first, -1), int(records["link"].max()))

    # -- append and read -----------------------------------------------------------------------------

    def append(self, link_ms: int, due_ms: int, phy: int, prev: int, cq: int, size: int) -> int:
        """The entry's index; AllocationFailed, nothing changed, when its file has no room."""
        index = self.end
        assert prev < index, "an entry's previous is older"
        first = index - index % self.per_file
        if first not in self.files:
            self._create(first)
        elif first in self.sparse:
            self._fill(first)
        raw = ENTRY.pack(link_ms, due_ms, phy, prev, cq, size, 0)
        m = self.files[first][1]
        at = (index - first) * ENTRY_SIZE
        m[at: at + ENTRY_SIZE] = raw[:44] + struct.pack(">I", zlib.crc32(raw[:44]))
        self.max_link[first] = max(self.max_link.get(first, -1), link_ms)
        self.dirty.add(first)
        self.end = index + 1
        return index

    def entry(self, index: int) -> tuple[int, int, int, int, int, int]:
        """(link_ms, due_ms, phy, prev, cq, size) of a live entry."""
        assert self.start <= index < self.end, f"timer log entry {index} is outside [{self.start}, {self.end})"
        return ENTRY.unpack_from(self._view(index))[:6]

    def _view(self, index: int) -> memoryview:
        first = index - index % self.per_file
        at = (index - first) * ENTRY_SIZE
        return memoryview(self.files[first][1])[at: at + ENTRY_SIZE]

    # -- durability and deletion -----------------------------------------------------------------

    def flush(self) -> int:
        """Write the appended entries to disk; returns the durable end. An error propagates."""
        for first in sorted(self.dirty):
            self.files[first][1].flush()
        self.dirty.clear()
        self.flushes += 1
        return self.end

    def delete_before(self, delivered_ms: int) -> int:
        """Delete the files (not the one being appended to) whose entries all hang under slots
        up to `delivered_ms`; returns how many."""
        deleted = 0
        for first in sorted(self.files):
            if first + self.per_file > self.end or self.max_link.get(first, -1) > delivered_ms:
                break
            fd, m = self.files.pop(first)
            m.close()
            os.close(fd)
            (self.directory / f"{first:020d}").unlink()
            self.max_link.pop(first, None)
            self.dirty.discard(first)
            self.sparse.discard(first)
            self.start = first + self.per_file
            deleted += 1
        return deleted

    def _create(self, first: int) -> None:
        allocate(self.directory / f"{first:020d}", self.per_file * ENTRY_SIZE)  # (False: a crash left it there)
        self._map(first)

    def _map(self, first: int) -> None:
        fd = os.open(self.directory / f"{first:020d}", os.O_RDWR)
        size = os.fstat(fd).st_size
        if size != self.per_file * ENTRY_SIZE:
            os.close(fd)
            raise TimerLogCorrupt(f"timer log file {first:020d} is {size} bytes, not {self.per_file * ENTRY_SIZE}")
        self.files[first] = (fd, mmap.mmap(fd, size))
        if os.fstat(fd).st_blocks * 512 < size:
            self.sparse.add(first)
            try:
                self._fill(first)
            except AllocationFailed:
                pass  # read as it is; `append` asks again before it stores into the file

    def _fill(self, first: int) -> None:
        """Give a sparse file all its blocks (a store into a hole on a full disk is a SIGBUS)."""
        reserve(self.files[first][0], self.per_file * ENTRY_SIZE, self.directory / f"{first:020d}")
        self.sparse.discard(first)

    def statistics(self) -> dict:
        return {"files": len(self.files), "start": self.start, "end": self.end, "flushes": self.flushes,
                "sparse_files": len(self.sparse)}

    def close(self) -> None:
        for fd, m in self.files.values():
            m.close()
            os.close(fd)
        self.files.clear()
