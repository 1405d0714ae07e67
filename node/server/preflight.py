"""What a node's start makes sure of before it recovers anything: a private, fresh run directory
with room on its disk, and a free port for the gRPC proxy. Each said plainly at once, where
otherwise the services would die one after another as they start (node.server.launcher).
"""

from __future__ import annotations

import os
import socket
import stat
import tempfile
from pathlib import Path

from shm import settings as settings_module
from shm.disk import free_bytes

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
