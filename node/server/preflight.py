"""What a node's start makes sure of before it recovers anything: a private, fresh run directory
with room on its disk, a store's disk that can hold its segments, and a free port for the gRPC
proxy. Each said plainly at once, where otherwise the services would die one after another as
they start, or the node would start and refuse every send (node.server.launcher).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import tempfile
from pathlib import Path

from shm import settings as settings_module
from shm.disk import capacity_bytes, free_bytes

RUN_ROOM_MIN = 4 << 20  # bytes free the run directory's disk needs for a start (Ray's session, the pid files)
IPC_PATH_MAX = 100  # sun_path holds 107 bytes; the longest endpoint adds "/arrivals"
RUN_FILES = ("*.pid", "*.starts", "*.fifo", "*.ring", "injected-flush-eio", "supervision.json")


def prepare_run_dir(settings) -> Path:
    """The run directory, private and fresh: created with mode 0700 (its parents too, if
    missing), refused when it exists but another user owns it or others may enter it, and
    emptied of an earlier run's files (the store lock says no other node of this store runs).
    A default path too long for an ipc socket gives way to a new private temporary directory."""
    path = settings.run_dir
    if not settings.runDir and len(str(path)) > IPC_PATH_MAX:
        return Path(tempfile.mkdtemp(prefix="mqnode-"))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        info = path.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise settings_module.SettingsError(
                f"run directory {path} must be a directory of this user with mode 0700 "
                f"(it is {stat.filemode(info.st_mode)}, owner uid {info.st_uid}): remove it or choose runDir")
    for pattern in RUN_FILES:
        for stale in path.glob(pattern):
            stale.unlink(missing_ok=True)
    return path


def check_run_room(settings) -> None:
    """The run directory's disk must have room: Ray's workers would die one after another as they
    start, for a minute, on a disk with none (said now, plainly, instead). The store's own disk
    may be full: with the run directory elsewhere the node starts, serves reads and cleans."""
    free = free_bytes(settings.run_dir)
    if free < RUN_ROOM_MIN:
        raise settings_module.SettingsError(
            f"the run directory {settings.run_dir} is on a disk with {free} bytes free, under the {RUN_ROOM_MIN >> 20} "
            f"MiB the node's processes need to start: free space there or set runDir to a directory on another disk")


def store_disk_too_small(settings, capacity: int) -> str | None:
    """Why a disk of `capacity` bytes cannot carry the store, or None. A store needs two CommitLog
    segments and the headroom a new one leaves (Settings.commitlog_headroom): the clean service
    never deletes the segment being written, so on a disk of one segment the node fills it and
    then refuses every send for good, and under one segment and its headroom it refuses the first
    (CREATE_MAPEDFILE_FAILED)."""
    segment, headroom = settings.mappedFileSizeCommitLog, settings.commitlog_headroom
    need = 2 * segment + headroom
    if capacity >= need:
        return None
    # the largest segment that fits: 2.5 segments (a large one's headroom is half of it), or two and
    # the index and ConsumeQueue files (a small one's)
    largest = max(0, min(capacity * 2 // 5, (capacity - settings.entry_files_size) // 2)) >> 20
    advice = (f"set mappedFileSizeCommitLog to at most {largest} MiB" if largest else
              f"put the store on a larger disk, or make its index files smaller (maxHashSlotNum, maxIndexNum: "
              f"{settings.entry_files_size} bytes of headroom with a ConsumeQueue file)")
    return (f"the store's disk ({settings.commitlog_dir}) holds {capacity} bytes in all, under the {need} a store of "
            f"{segment}-byte segments needs (two segments, one written while the older is cleaned, and {headroom} "
            f"bytes of headroom): {advice}")


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
