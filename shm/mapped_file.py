"""One fixed-size segment file, allocated on disk and then memory-mapped.

Naming: the file is named by the global offset of its first byte, 20 decimal digits
(`00000000001073741824`). Every segment has exactly its configured size on disk.

Pre-allocation: a new file gets its blocks with posix_fallocate *before* it is mapped. A store
into a sparse page of a shared mapping on a full disk raises SIGBUS, which kills a Python
process outright; allocating first turns a full disk into an OSError(ENOSPC) at creation time,
which the owner reports (CREATE_MAPEDFILE_FAILED) instead of dying. A CommitLog segment also
keeps `keep_free` bytes free on its disk (Settings.commitlog_headroom): the reput's room for the
ConsumeQueue and index entries of the records written into it.

A file made with `blocks_ahead` (a ConsumeQueue's: thousands of queues, most holding a few
entries) has its full size but gets its blocks `blocks_ahead` bytes at a time, each range before
the first store into it (`reserve`): the same guarantee (no store into a hole; a full disk is an
AllocationFailed before the store) without 5.72 MiB of disk a queue (1,000 topics of 8 queues
held 45 GiB of blocks for a message each, counted by the clean service as used). Its holes
read as zeros, as the zeros of an allocated, never-written block do. Such a file, one of
thousands, also holds no descriptor of ours once mapped (the mapping outlives it): the
dispatcher, holding every queue, ran out of descriptors (EMFILE) at ~10,000 queues on a host
allowing 20,000 a process. `reserve` opens the file for its fallocate, `flush` is an msync, and
`is_file_at` compares the inode noted at open. Python's mmap keeps a descriptor of its own (a
dup) unless told not to (`trackfd=False`, Python 3.13 on: MAP_TRACKS_FD), so before 3.13 such a
file costs one descriptor, not two.

Positions (all relative to the file's start, one writer each, in the owning process):
`flushed <= committed <= written <= size`. Readers in other processes never trust these
fields; they read the published counters in the control block.

Flush: fdatasync on the file (which also writes pages dirtied through the mapping) or msync of
the mapping; `scripts/bench-store` measures both and `FLUSH_METHOD` keeps the faster.
"""

from __future__ import annotations

import errno
import mmap
import os
import queue
import sys
import threading
from pathlib import Path

from shm.disk import free_bytes
from shm.invariant import invariant

PWRITE_FROM = 4096  # writes of at least this many bytes go through pwrite (see MappedFile.write)
FLUSH_METHOD = "fdatasync"  # measured faster than msync on preallocated files (bench-store)
MAP_TRACKS_FD = sys.version_info < (3, 13)  # mmap dups the descriptor it maps, unless trackfd=False (3.13)


class StoreError(Exception):
    """A store that cannot be opened or written as asked; the message names what and where."""


class WrongFileSize(StoreError):
    """A file not of the size the settings give its kind; `actual`: the size it is."""

    def __init__(self, message: str, actual: int | None = None):
        super().__init__(message)
        self.actual = actual


class AllocationFailed(StoreError):
    """The disk refused the blocks for a new file (ENOSPC, EDQUOT, ...)."""


def file_name(offset: int) -> str:
    return f"{offset:020d}"


def allocate(path: Path, size: int, *, keep_free: int = 0, blocks: int | None = None) -> bool:
    """Create `path` with `size` bytes of real blocks (its first `blocks` only, the rest holes,
    when given), atomically: the blocks are allocated under a
    temporary name and linked into place, so a reader never sees a half-made segment and a
    failure (full disk) leaves nothing behind. Linking (not renaming) never replaces a file that
    another process (the allocator, or the writer) put there first: returns False in that case,
    and the caller opens that file instead. With `keep_free`, a file that would leave less than
    that free on its disk is refused (AllocationFailed) as the disk's own refusal is.
    """
    wanted = size if blocks is None else min(blocks, size)
    if keep_free and free_bytes(path.parent) - wanted < keep_free:
        # refused before any block is taken: a file made only to be dropped again would hold the
        # disk's last room meanwhile, and the dispatcher's next ConsumeQueue or index file, made
        # then, would find none (it stopped, and the cleaner waited on it)
        raise AllocationFailed(_no_headroom(size, path, keep_free))
    temporary = path.with_name(f"{path.name}.allocating.{os.getpid()}")
    fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if blocks is not None and blocks < size:
            os.ftruncate(fd, size)  # (its whole size, as RocketMQ's files have: the rest are holes)
        reserve(fd, wanted, path)
        if keep_free and free_bytes(path.parent) < keep_free:  # (the disk's own overhead, or another's file)
            raise AllocationFailed(_no_headroom(size, path, keep_free))
    except AllocationFailed:
        temporary.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    try:
        os.link(temporary, path)
        return True
    except FileExistsError:
        return False
    finally:
        temporary.unlink(missing_ok=True)


def _no_headroom(size: int, path: Path, keep_free: int) -> str:
    return (f"cannot allocate {size} bytes for {path}: it would leave less than {keep_free} bytes free for the "
            f"ConsumeQueue and index entries")


def _data_end(fd: int, size: int, extents: int) -> int:
    end = position = 0
    for _ in range(extents):
        try:
            position = os.lseek(fd, position, os.SEEK_DATA)
        except OSError as e:
            return end if e.errno == errno.ENXIO else size  # (ENXIO: no data past it)
        position = end = os.lseek(fd, position, os.SEEK_HOLE)
        if position >= size:
            return size
    return size  # (more runs than that: all of it)


def reserve(fd: int, size: int, path: Path, start: int = 0) -> None:
    """Real blocks for bytes [start, size) of the file `fd` (a store through a mapping into a
    hole on a full disk is a SIGBUS); AllocationFailed when the disk refuses them."""
    try:
        os.posix_fallocate(fd, start, size - start)
    except OSError as e:
        raise AllocationFailed(f"cannot allocate {size} bytes for {path}: {os.strerror(e.errno)}") from e


def no_read_around(mapped: mmap.mmap) -> None:
    """Fault this mapping in a page at a time (MADV_RANDOM). A fault on an uncached page
    otherwise reads around it (read_ahead_kb: 8 MiB on the project's machine). In a new file
    those are holes, so it makes that much zeroed page cache in one fault. Measured here: the
    first 20-byte entry of a new 6 MB ConsumeQueue file took p50 1.9-2.8 ms (max 13.5 ms) and
    cached the whole file; a page at a time it takes 0.1-0.15 ms. New files get it, and the
    allocator's read-ahead of the CommitLog; files read back (recovery, pull readers, queries,
    verify) keep their read-ahead."""
    try:
        mapped.madvise(mmap.MADV_RANDOM)
    except (AttributeError, OSError):
        pass  # a platform without madvise: read-around is a cost, not a fault


class MappedFile:
    """A segment file mapped into memory. `readonly` opens for other processes' readers."""

    __slots__ = ("path", "offset_start", "size", "readonly", "fd", "inode", "map", "blocks_ahead", "reserved",
                 "position_written", "position_committed", "position_flushed", "_view")

    def __init__(self, path: Path, size: int, *, create: bool = False, readonly: bool = False, keep_free: int = 0,
                 blocks_ahead: int = 0):
        self.path = Path(path)
        self.size = size
        self.readonly = readonly
        self.offset_start = int(self.path.name)
        # blocks_ahead: a file given its blocks as it fills (the module's docstring), else all at once
        self.blocks_ahead = blocks_ahead
        self.reserved = size  # bytes from the start known to have blocks (a loaded file's: none known)
        if blocks_ahead:
            invariant(blocks_ahead % mmap.PAGESIZE == 0, "blocks are reserved in whole pages")
            self.reserved = min(blocks_ahead, size) if create else 0
        if create and not self.path.exists():  # the allocator may have made it already
            try:
                allocate(self.path, size, keep_free=keep_free, blocks=blocks_ahead or None)
            except AllocationFailed:
                if not self.path.exists():
                    raise
                # the allocator's, linked while this one's blocks were refused: a disk with room
                # for one more segment has none for two made at once, and that one is whole
        actual = os.stat(self.path).st_size
        if actual != size:
            raise WrongFileSize(f"{self.path} is {actual} bytes, the configured segment size is {size}", actual)
        self.fd = os.open(self.path, os.O_RDONLY if readonly else os.O_RDWR)
        try:
            self.inode = os.fstat(self.fd).st_ino
            access = mmap.ACCESS_READ if readonly else mmap.ACCESS_WRITE
            untracked = {} if MAP_TRACKS_FD or not blocks_ahead else {"trackfd": False}
            self.map = mmap.mmap(self.fd, size, access=access, **untracked)
        except BaseException:
            os.close(self.fd)
            raise
        if blocks_ahead:  # one of thousands: no descriptor held (the module's docstring)
            os.close(self.fd)
            self.fd = -1
        if create and not readonly:
            no_read_around(self.map)
        self._view = memoryview(self.map)
        # A newly created file is empty; a loaded one is provisionally full until recovery.
        start = 0 if create else size
        self.position_written = self.position_committed = self.position_flushed = start

    @property
    def view(self) -> memoryview:
        return self._view

    @property
    def offset_end(self) -> int:
        return self.offset_start + self.size

    @property
    def space_left(self) -> int:
        return self.size - self.position_written

    def is_full(self) -> bool:
        return self.position_written == self.size

    def write(self, position: int, data) -> None:
        """Copy `data` in at `position`: through the mapping when small, with pwrite when large.

        Readers map the same page cache, so both are visible to them the moment this returns.
        A store through a shared mapping takes one write fault a page (ext4's page_mkwrite:
        journal handle, dirty accounting, mtime); pwrite copies a whole batch in one call. The
        writer's CommitLog copy was ~40% of its busy time under send_batch and ~7 µs a page;
        with pwrite, send_batch rose ~25% and the node's CPU a message fell ~30%
        (docs/performance.md). A 20-byte ConsumeQueue entry stays a plain copy:
        its page faults once per 204 entries, cheaper than a system call each."""
        size = len(data)
        invariant(not self.readonly and 0 <= position and position + size <= self.size)
        if size < PWRITE_FROM:
            self.map[position: position + size] = data
            return
        view = memoryview(data)
        while view:  # a regular file takes it all at once; a short write (a signal) goes on
            done = os.pwrite(self.fd, view, position)
            if done <= 0:  # bounds the loop even under -O; an error raises OSError by itself
                raise OSError(errno.EIO, f"pwrite wrote nothing at {position} of {self.path}")
            view, position = view[done:], position + done

    def reserve(self, end: int) -> None:
        """Blocks under [0, end) before a store into them: for a file made with `blocks_ahead`,
        the next ranges of that size (fallocate of a range that has its blocks changes nothing);
        AllocationFailed, nothing stored, when the disk refuses them."""
        if end <= self.reserved:
            return
        invariant(not self.readonly and self.blocks_ahead and end <= self.size, (end, self.size))
        upto = min(self.size, -(-end // self.blocks_ahead) * self.blocks_ahead)
        fd = os.open(self.path, os.O_RDWR)
        try:
            reserve(fd, upto, self.path, self.reserved)
        finally:
            os.close(fd)
        self.reserved = upto

    def set_written(self, position: int) -> None:
        """Move the write position (append, or truncation by recovery); commit follows it."""
        invariant(0 <= position <= self.size, (position, self.size))
        self.position_written = position
        self.position_committed = position
        self.position_flushed = min(self.position_flushed, position)

    def zero(self, start: int, end: int, chunk: int = 1 << 20) -> None:
        """Overwrite [start, end) with zeros, so truncated data cannot come back after a later
        crash lets new writes end where old, still-valid-looking records begin."""
        invariant(not self.readonly and 0 <= start <= end <= self.size)
        for position in range(start, end, chunk):
            stop = min(end, position + chunk)
            self.map[position:stop] = bytes(stop - position)

    def flush(self, method: str = FLUSH_METHOD) -> int:
        """Make everything written so far durable; returns the new flushed position."""
        target = self.position_committed
        if target > self.position_flushed and not self.readonly:
            if method == "msync" or self.fd < 0:  # (a file holding no descriptor: msync)
                start = self.position_flushed - self.position_flushed % mmap.PAGESIZE
                self.map.flush(start, target - start)
            else:
                os.fdatasync(self.fd)
            self.position_flushed = target
        invariant(self.position_flushed <= self.position_committed <= self.position_written <= self.size)
        return self.position_flushed

    def warm(self) -> None:
        """Touch every page once so the writer never takes first-touch page faults."""
        if self.readonly:
            return
        try:
            self.map.madvise(mmap.MADV_WILLNEED)
        except (AttributeError, OSError):
            pass
        page = mmap.PAGESIZE
        zero = b"\0"
        for position in range(self.position_written - self.position_written % page + page, self.size, page):
            self.map[position: position + 1] = zero

    def data(self, extents: int = 4096) -> bytes:
        """The file's bytes up to where its last data ends (SEEK_DATA / SEEK_HOLE, over at most
        `extents` runs of data; the whole file where the file system cannot say): past it every
        byte is zero (holes, or blocks allocated and never written). Read with pread, not
        through the mapping: recovery read 15,000 queue files of a few entries each whole
        through their mappings in 7 minutes (a page fault for every 4 KiB of zeros)."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            return os.pread(fd, _data_end(fd, self.size, extents), 0)
        finally:
            os.close(fd)

    def holds_nothing(self, chunk: int = 1 << 20) -> bool:
        """Whether not a byte of the file was ever written (all zeros): a segment made ahead
        that no append reached. Asks the file system for the first data first (SEEK_DATA: an
        allocated, never-written extent is no data on ext4, xfs and tmpfs), then reads the rest."""
        try:
            position = os.lseek(self.fd, 0, os.SEEK_DATA) if self.fd >= 0 else 0
        except OSError as e:
            if e.errno == errno.ENXIO:
                return True
            position = 0  # (no SEEK_DATA here: read it all)
        zero = bytes(chunk)
        for start in range(position - position % chunk, self.size, chunk):
            stop = min(self.size, start + chunk)
            if self.map[start:stop] != zero[: stop - start]:
                return False
        return True

    def close(self) -> None:
        if self.map.closed:
            return
        self._view.release()
        self.map.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def is_file_at(self, path: Path) -> bool:
        """Whether `path` names the file this mapping holds (not one made again under its name)."""
        try:
            return self.inode == os.stat(path).st_ino
        except OSError:  # gone meanwhile
            return False

    def destroy(self) -> None:
        self.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def __repr__(self) -> str:
        return f"MappedFile({self.path.name}, written={self.position_written}, flushed={self.position_flushed})"



# -- closing deleted files off the loop ----------------------------------------------------------
# munmap of a 64 MiB segment whose pages a process touched takes 1-7 ms, and CPython releases the
# GIL for it: a process that serves (the front) hands the mappings of deleted files to this thread
# instead of stalling its loop on them (bench-clean: the ack p99 while deleting).

_retired: queue.SimpleQueue = queue.SimpleQueue()
_closer: threading.Thread | None = None
_closer_lock = threading.Lock()


def _close_retired() -> None:
    while True:
        _retired.get().close()


def retire(f) -> None:
    """Close `f` soon, on a background thread: nobody may use it any more."""
    global _closer
    with _closer_lock:
        if _closer is None:
            _closer = threading.Thread(target=_close_retired, name="mqnode-unmap", daemon=True)
            _closer.start()
    _retired.put(f)
