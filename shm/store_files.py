"""The `lock` and `abort` files at the store root.

`lock`: the running broker holds an exclusive POSIX record lock (fcntl, as Java's
FileChannel.tryLock) on byte 0 and writes the 4 bytes `lock`. A second broker on the same store
fails at once with StoreLocked. POSIX locks do not conflict within one process, so this module
also refuses a second lock of the same store from the process that holds it.

`abort`: an empty file that exists while the store is open for writing; removed by a clean
shutdown (writable store, nothing left to dispatch). Found at start => the last stop was not
clean => abnormal recovery.
"""

from __future__ import annotations

import fcntl
import os
import struct
from pathlib import Path

from shm.mapped_file import StoreError


class StoreLocked(StoreError):
    pass


# Linux's struct flock: l_type, l_whence (short), l_start, l_len (off_t), l_pid (pid_t); 32 bytes
# with its padding on 64-bit Linux, which the buffer given to F_GETLK must hold
_FLOCK, _FLOCK_SIZE = "hhqqi", 32
_held: dict[str, int] = {}  # resolved lock path -> fd, for this process


class StoreLock:
    """`root`'s lock file (`name`: the store's is `lock`, RocketMQ's), held with a POSIX lock."""

    def __init__(self, root: Path, name: str = "lock"):
        self.path = Path(root) / name
        self.fd = -1

    def acquire(self) -> None:
        key = str(self.path.resolve())
        if key in _held:
            raise StoreLocked(f"{self.path}: this process already has the store open (lock overlapping)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError as e:
            os.close(fd)
            holder = self.holder()
            who = f"process {holder}" if holder else "another process"
            raise StoreLocked(f"{self.path}: the store is in use by {who} (MQ already started; if it is a "
                              f"node, `mqnode stop --store {self.path.parent}` stops it)") from e
        os.pwrite(fd, b"lock", 0)
        self.fd = fd
        _held[key] = fd

    def release(self) -> None:
        if self.fd < 0:
            return
        _held.pop(str(self.path.resolve()), None)
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 0)
        os.close(self.fd)
        self.fd = -1

    def holder(self) -> int | None:
        """The pid of the process that holds this store's lock (F_GETLK, as `lsof` would find it),
        None when no process does; 0 for one in another PID namespace. In the holding process,
        its own pid without opening the file: closing any descriptor of a file drops every
        POSIX lock the process has on it."""
        if str(self.path.resolve()) in _held:
            return os.getpid()
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            asked = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0).ljust(_FLOCK_SIZE, b"\0")
            kind, _, _, _, pid = struct.unpack_from(_FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, asked))
        finally:
            os.close(fd)
        return None if kind == fcntl.F_UNLCK else pid

    def __enter__(self) -> "StoreLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def abort_path(root: Path) -> Path:
    return Path(root) / "abort"


def last_exit_ok(root: Path) -> bool:
    return not abort_path(root).exists()


def mark_running(root: Path) -> None:
    path = abort_path(root)
    path.touch()
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def mark_clean_exit(root: Path) -> None:
    abort_path(root).unlink(missing_ok=True)
