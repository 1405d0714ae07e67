"""What a node's start makes sure of before it recovers anything: a private, fresh run directory
with room on its disk, a store's disk that can hold its segments, and a free port for the gRPC
proxy. Each said plainly at once, where otherwise the services would die one after another as
they start, or the node would start and refuse every send (node.server.launcher).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import stat
import tempfile
from pathlib import Path

from shm import settings as settings_module
from shm.disk import capacity_bytes, free_bytes
from shm.store_files import StoreLock, StoreLocked

RUN_ROOM_MIN = 4 << 20  # bytes free the run directory's disk needs for a start (Ray's session, the pid files)
IPC_PATH_MAX = 100  # sun_path holds 107 bytes; the longest endpoint adds "/arrivals"
RUN_LOCK = "run.lock"  # a run directory's (or a name service's directory's) lock: not the store's, were they one
RUN_FILES = ("*.pid", "*.starts", "*.fifo", "*.ring", "injected-flush-eio", "supervision.json", "argument-*.pickle")


def prepare_run_dir(settings) -> tuple[Path, StoreLock]:
    """The run directory, private, held and fresh: created with mode 0700 (its parents too, if
    missing), refused when it exists but another user owns it or others may enter it, locked
    (its `run.lock` file, as the store by its `lock`: the caller releases it at the node's stop)
    and then emptied of an earlier run's files. Refused when another node holds it: two stores' nodes given one
    runDir (a conf both read) had the second empty the first's pid files, FIFOs and rings, and
    the first stopped answering. A default path too long for an ipc socket gives way to a new
    private temporary directory."""
    path = settings.run_dir
    if not settings.runDir and len(str(path)) > IPC_PATH_MAX:
        path = Path(tempfile.mkdtemp(prefix="mqnode-"))
        return path, hold_directory(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        info = path.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise settings_module.SettingsError(
                f"run directory {path} must be a directory of this user with mode 0700 "
                f"(it is {stat.filemode(info.st_mode)}, owner uid {info.st_uid}): remove it or choose runDir")
    lock = hold_directory(path)
    for pattern in RUN_FILES:
        for stale in path.glob(pattern):
            stale.unlink(missing_ok=True)
    return path, lock


def hold_directory(path: Path, what: str = "run directory", kind: str = "node", choice: str = "runDir") -> StoreLock:
    """`path`'s lock file taken for this process's life (the caller releases it), or SettingsError
    naming the process that holds it."""
    lock = StoreLock(path, RUN_LOCK)
    try:
        lock.acquire()
    except StoreLocked:
        raise settings_module.SettingsError(f"{what} {path} is in use by another {kind} (pid {lock.holder()}): give "
                                            f"each {kind} a {choice} of its own") from None
    return lock


def check_run_room(settings) -> None:
    """The run directory's disk must have room: Ray's workers would die one after another as they
    start, for a minute, on a disk with none (said now, plainly, instead). The store's own disk
    may be full: with the run directory elsewhere the node starts, serves reads and cleans."""
    free = free_bytes(settings.run_dir)
    if free < RUN_ROOM_MIN:
        raise settings_module.SettingsError(
            f"the run directory {settings.run_dir} is on a disk with {free} bytes free, under the {RUN_ROOM_MIN >> 20} "
            f"MiB the node's processes need to start: free space there or set runDir to a directory on another disk")


def store_disk_needs(settings, segment: int) -> int:
    """The least disk a store of `segment`-byte CommitLog segments needs, were it alone on it.

    The allocator keeps the segment after the one being written made, and neither is ever
    cleaned: two segments stand beside the entry files (an index file, and a ConsumeQueue file
    for each queue of a topic: `defaultTopicQueueNums`). They must stay under
    `diskSpaceWarningLevelRatio` (over it every send is refused, and the cleaner has nothing it
    may delete), and once the first segment fills, the next one made must still leave its
    headroom (Settings.commitlog_headroom) free, after the cleaner deleted the full one."""
    entries = settings.index_file_bytes + settings.defaultTopicQueueNums * settings.mappedFileSizeConsumeQueue
    held = 2 * segment + entries
    return max(held + settings.headroom_for(segment), math.ceil(held / settings.diskSpaceWarningLevelRatio))


def store_disk_too_small(settings, capacity: int) -> str | None:
    """Why a disk of `capacity` bytes cannot carry the store (store_disk_needs), or None. Found by
    hand: on a 1.5 GB volume the defaults' node refused its first send (CREATE_MAPEDFILE_FAILED),
    and with 546 MiB segments it took 237 MiB and then refused every send for good."""
    segment = settings.mappedFileSizeCommitLog
    need = store_disk_needs(settings, segment)
    if capacity >= need:
        return None
    largest = _largest_segment(settings, capacity)
    advice = (f"set mappedFileSizeCommitLog to at most {largest >> 20} MiB" if largest else
              f"put the store on a larger disk, or make its index files smaller (maxHashSlotNum, maxIndexNum)")
    return (f"the store's disk ({settings.commitlog_dir}) holds {capacity} bytes in all, under the {need} a store of "
            f"{segment}-byte segments needs at least (the segment written and the next, made ahead, its index and "
            f"ConsumeQueue files under diskSpaceWarningLevelRatio, and a new segment's headroom): {advice}")


def _largest_segment(settings, capacity: int) -> int:
    """The largest whole number of MiB a segment may be on `capacity` bytes (0: not even 1 MiB)."""
    low, high = 0, capacity >> 20
    while low < high:  # (store_disk_needs grows with the segment)
        middle = (low + high + 1) // 2
        if store_disk_needs(settings, middle << 20) <= capacity:
            low = middle
        else:
            high = middle - 1
    return low << 20


def check_store_disk(settings) -> None:
    """A new store on a disk too small for its segments is refused, while mappedFileSizeCommitLog
    can still be chosen; a store that has segments already is warned about and started (its
    messages can still be read and consumed)."""
    why = store_disk_too_small(settings, capacity_bytes(settings.commitlog_dir))
    if why is None:
        return
    directory = settings.commitlog_dir
    if directory.is_dir() and any(p.name.isdigit() for p in directory.iterdir()):
        logging.getLogger("mqnode").warning("%s; its sends will be refused once the disk is full", why)
        return
    raise settings_module.SettingsError(why)


def check_grpc_port(settings) -> None:
    """The gRPC proxy's port must be free: its process would die at every restart otherwise, and
    the node would never be ready (said now, plainly, instead)."""
    if not settings.grpc_port:
        return
    family = socket.AF_INET6 if ":" in settings.grpc_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as grpc: a restart's TIME_WAIT is no conflict)
        try:
            probe.bind((settings.grpc_host, settings.grpc_port))
        except OSError as e:
            raise settings_module.SettingsError(f"grpcServerPort: {settings.grpc_host}:{settings.grpc_port} cannot be bound "
                               f"({e.strerror}): set another grpcServerPort, or 0 to turn the gRPC proxy off") from None
