"""StoreCheckpoint: `checkpoint`, one 4096-byte page, memory-mapped. Big-endian.

| offset | width | field                                                                  |
|--------|-------|------------------------------------------------------------------------|
| 0      | 8     | physicMsgTimestamp: store time of the last CommitLog data known flushed |
| 8      | 8     | logicsMsgTimestamp: store time of the last record put in a ConsumeQueue |
| 16     | 8     | indexMsgTimestamp: endTimestamp of the last full index file forced      |
| 24..   |       | zero                                                                   |

No checksum. Crash policy: the values only ever lag the data (each is advanced after what it
describes is durable), so abnormal recovery restarts from min(physic, logics) - 3 s and
re-dispatches from there. Single writer: the process that owns the store's flushes.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

from shm.mapped_file import WrongFileSize, allocate

FILE_SIZE = 4096
_FIELDS = struct.Struct(">qqq")
_ONE = struct.Struct(">q")
RECOVERY_MARGIN_MS = 3000


class Checkpoint:
    def __init__(self, path: Path, *, readonly: bool = False):
        self.path = Path(path)
        if not self.path.exists() and not readonly:
            allocate(self.path, FILE_SIZE)
        self.fd = os.open(self.path, os.O_RDONLY if readonly else os.O_RDWR)
        size = os.fstat(self.fd).st_size
        if size < 24:
            os.close(self.fd)
            raise WrongFileSize(f"{self.path} is {size} bytes; a checkpoint is {FILE_SIZE}")
        self.map = mmap.mmap(self.fd, size, access=mmap.ACCESS_READ if readonly else mmap.ACCESS_WRITE)
        self.physic_timestamp, self.logics_timestamp, self.index_timestamp = _FIELDS.unpack_from(self.map, 0)

    def write(self) -> None:
        """Publish the in-memory values to the mapping (not yet durable: see flush)."""
        _FIELDS.pack_into(self.map, 0, self.physic_timestamp, self.logics_timestamp, self.index_timestamp)

    def flush(self) -> None:
        self.write()
        self.map.flush()

    # Each field has its own writer on a running node (physic: flush actor; logics and index:
    # the dispatcher), so each is published alone, never from a stale copy of the others.
    def flush_physic(self, timestamp: int, *, force: bool = True) -> None:
        """`force=False` only publishes to the mapping (durable at the next force or writeback):
        the value still lags the data, which is all recovery needs."""
        self.physic_timestamp = max(self.physic_timestamp, timestamp)
        if force:
            self._force(0, self.physic_timestamp)
        else:
            _ONE.pack_into(self.map, 0, self.physic_timestamp)

    def flush_logics(self, timestamp: int) -> None:
        self.logics_timestamp = max(self.logics_timestamp, timestamp)
        self._force(8, self.logics_timestamp)

    def flush_index(self, timestamp: int) -> None:
        self.index_timestamp = max(self.index_timestamp, timestamp)
        self._force(16, self.index_timestamp)

    def _force(self, offset: int, value: int) -> None:
        _ONE.pack_into(self.map, offset, value)
        self.map.flush(0, mmap.PAGESIZE)

    @property
    def min_timestamp(self) -> int:
        """Where abnormal recovery may start: the older of the two, less a 3 s margin."""
        return max(0, min(self.physic_timestamp, self.logics_timestamp) - RECOVERY_MARGIN_MS)

    @property
    def min_timestamp_index(self) -> int:
        return min(self.min_timestamp, self.index_timestamp)

    def close(self) -> None:
        if self.fd >= 0:
            self.map.close()
            os.close(self.fd)
            self.fd = -1
