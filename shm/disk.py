"""A full disk, as the node's small files meet it (config files, checkpoints, pid files, the pop
log's snapshot): each is written whole or not at all, and a write that finds no room is
answered False rather than raised, the file left as it was. Its caller keeps what it meant to
write and writes it again later, or does without: a service must not die of a full disk, since
it would die again at every restart while the disk stays full. Any other failure raises, a
failed fsync included (fail-stop)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

NO_ROOM = (errno.ENOSPC, errno.EDQUOT)  # the errors of a disk (or a quota) that is full


def nearest_existing(path: Path) -> Path:
    """`path`, or (a directory not made yet) its nearest existing parent: the disk it will be on."""
    path = Path(path)
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    """Bytes this process may still write on `path`'s disk (root may use the reserved blocks);
    a directory not made yet is asked of the disk it will be on."""
    disk = os.statvfs(nearest_existing(path))
    return (disk.f_bfree if os.geteuid() == 0 else disk.f_bavail) * disk.f_frsize


def capacity_bytes(path: Path) -> int:
    """Bytes this process could hold on `path`'s disk were it empty: its size, less the blocks
    reserved for root when this process is not root."""
    disk = os.statvfs(nearest_existing(path))
    blocks = disk.f_blocks if os.geteuid() == 0 else disk.f_blocks - (disk.f_bfree - disk.f_bavail)
    return blocks * disk.f_frsize


def write_whole(path: Path, data: bytes, *, temporary: Path | None = None, sync: bool = True,
                backup: bool = False, mode: int = 0o644) -> bool:
    """`data` as `path`'s content: written to `temporary` (`<name>.tmp` beside it unless named),
    fsynced with `sync`, renamed over `path` (a new file gets `mode`); with `backup`, the previous content copied to
    `<name>.bak` first. False, `path` as it was and the temporary gone, when the disk has no room
    (even at the fsync: the temporary is dropped, never synced again)."""
    temporary = temporary or path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
    except OSError as e:
        if e.errno not in NO_ROOM:
            raise
        temporary.unlink(missing_ok=True)
        return False
    if backup and path.exists():
        bak = path.with_name(path.name + ".bak")
        try:
            shutil.copyfile(path, bak)
        except OSError as e:
            if e.errno not in NO_ROOM:
                raise
            bak.unlink(missing_ok=True)  # (a cut copy is no fallback; the new content is whole)
    os.replace(temporary, path)
    return True
