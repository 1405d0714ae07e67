"""The pop log: every change to the node's pop state, on disk (docs/storage.md "Pop state").

The pop service (actors.pop) keeps which messages each consumer group has in flight, until when,
and which it acked, as state in memory that only records change (actors.pop_core: the same
`apply` runs live and at replay). This class keeps those records durable. Files under
`<root>/pop/`:

    snapshot       one frame: {"gen": N, "state": ...}, the whole state when journal.N began
    journal.<N>    frames appended since, in order

A frame is `length u32 | crc32 u32 | payload` (big-endian; the CRC over the payload, an orjson
document). Records are appended with one write(2) per turn; `sync` fdatasyncs them (the shell
calls it before answering when the node's flushDiskType is SYNC_FLUSH, else every
`flushIntervalCommitLog` ms). A failed fdatasync raises: the process stops and its restart
recovers; it is never retried (the page cache may have dropped what failed).

Crash policy: at open the newest snapshot whose frame is whole and whose CRC holds is loaded,
then its journal's frames up to the first that is cut short or fails its CRC (the intact
prefix); the file is truncated there, so a torn append is dropped whole, never half-applied.
Compaction (`compact`): the state is written to `snapshot.tmp`, fdatasynced, renamed over
`snapshot`, the directory fsynced, and only then journal.N+1 begins and journal.N goes. A crash
anywhere in it leaves either the old snapshot with its whole journal, or the new one with an
empty or missing journal: both the same state.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import orjson

from shm.archive_manifest import fsync_dir  # (one definition of a directory's fsync)

FRAME = struct.Struct(">II")
MAX_FRAME = 1 << 30  # a length beyond this is damage, not a record


class PopLog:
    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.gen = 0
        self.fd = -1
        self.size = 0  # bytes of the journal, intact
        self.pending: list[bytes] = []  # frames of this turn, not yet written
        self.unsynced = False
        self.appended = self.syncs = self.dropped_bytes = 0

    # -- open and recover --------------------------------------------------------------------------

    def open(self) -> tuple[object | None, list]:
        """(the snapshot's state or None, the journal's records in order), after cutting a
        torn tail; the journal is then open for appends."""
        state = None
        snapshot = self._read_snapshot()
        if snapshot is not None:
            self.gen, state = snapshot["gen"], snapshot["state"]
        for stale in self.directory.glob("journal.*"):  # (older generations: a compaction's leftovers)
            if stale.name != f"journal.{self.gen}":
                stale.unlink()
        path = self.directory / f"journal.{self.gen}"
        records, intact = read_frames(path.read_bytes() if path.exists() else b"")
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        total = os.fstat(self.fd).st_size
        if intact < total:
            self.dropped_bytes = total - intact
            os.ftruncate(self.fd, intact)
            os.fdatasync(self.fd)
        os.lseek(self.fd, intact, os.SEEK_SET)
        self.size = intact
        return state, [orjson.loads(payload) for payload in records]

    def _read_snapshot(self) -> dict | None:
        path = self.directory / "snapshot"
        if not path.exists():
            return None
        frames, _ = read_frames(path.read_bytes())
        if len(frames) != 1:  # written whole then renamed: damage here is not a crash's
            raise PopLogDamaged(f"{path}: not one whole frame")
        return orjson.loads(frames[0])

    # -- append ------------------------------------------------------------------------------------

    def append(self, record) -> None:
        payload = orjson.dumps(record)
        self.pending.append(FRAME.pack(len(payload), zlib.crc32(payload)) + payload)

    def write(self) -> None:
        """This turn's records, in one write (to the page cache: a killed process keeps them)."""
        if not self.pending:
            return
        data = b"".join(self.pending)
        self.pending.clear()
        written = os.write(self.fd, data)
        assert written == len(data), (written, len(data))  # (a regular file: short only when the disk is full)
        self.size += written
        self.appended += 1
        self.unsynced = True

    def sync(self) -> None:
        if self.unsynced:
            os.fdatasync(self.fd)  # raises on failure: the caller's process stops (never a retry)
            self.unsynced = False
            self.syncs += 1

    # -- compaction --------------------------------------------------------------------------------

    def compact(self, state) -> None:
        """Start journal N+1 from `state`, the whole state now (everything appended is in it)."""
        assert not self.pending
        payload = orjson.dumps({"gen": self.gen + 1, "state": state})
        tmp = self.directory / "snapshot.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            data = FRAME.pack(len(payload), zlib.crc32(payload)) + payload
            assert os.write(fd, data) == len(data)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.directory / "snapshot")
        fsync_dir(self.directory)
        old, self.gen = self.fd, self.gen + 1
        self.fd = os.open(self.directory / f"journal.{self.gen}", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        fsync_dir(self.directory)
        os.close(old)
        (self.directory / f"journal.{self.gen - 1}").unlink(missing_ok=True)
        self.size, self.unsynced = 0, False

    def statistics(self) -> dict:
        return {"generation": self.gen, "journalBytes": self.size, "writes": self.appended, "syncs": self.syncs,
                "droppedBytesAtOpen": self.dropped_bytes}

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class PopLogDamaged(Exception):
    """A snapshot that is not whole: written then renamed, so not a crash's doing."""


def read_frames(data: bytes) -> tuple[list[bytes], int]:
    """The payloads of the whole frames at the start of `data`, and where the intact prefix ends."""
    frames, at = [], 0
    while at + FRAME.size <= len(data):
        length, crc = FRAME.unpack_from(data, at)
        end = at + FRAME.size + length
        if length > MAX_FRAME or end > len(data):
            break
        payload = data[at + FRAME.size: end]
        if zlib.crc32(payload) != crc:
            break
        frames.append(payload)
        at = end
    return frames, at

