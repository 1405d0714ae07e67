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
Compaction (`compact`): the state is written to `snapshot.tmp`, synced, renamed over
`snapshot`, the directory fsynced, and only then journal.N+1 begins and journal.N goes. A crash
anywhere in it leaves either the old snapshot with its whole journal, or the new one with an
empty or missing journal: both the same state. A disk with no room for the snapshot leaves the
journal as it was (`compact` answers False; the caller tries again later); a journal append that
finds no room raises like any failed write (the state it records was already applied).
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import orjson

from shm.archive_manifest import fsync_dir  # (one definition of a directory's fsync)
from shm.disk import write_whole

FRAME = struct.Struct(">II")
MAX_FRAME = 1 << 30  # a length beyond this is damage, not a record
POP_REPLICA = "pop-replica"  # a slave's copy of its master's pop log, under the store root (PopReplica)


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
        try:
            return snapshot_of(path.read_bytes())
        except PopLogDamaged as e:
            raise PopLogDamaged(f"{path}: {e}") from None

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

    def compact(self, state) -> bool:
        """Start journal N+1 from `state`, the whole state now (everything appended is in it);
        False, nothing changed, when the disk has no room for the snapshot."""
        assert not self.pending
        payload = orjson.dumps({"gen": self.gen + 1, "state": state})
        if not write_whole(self.directory / "snapshot", FRAME.pack(len(payload), zlib.crc32(payload)) + payload, mode=0o600):
            return False
        fsync_dir(self.directory)
        old, self.gen = self.fd, self.gen + 1
        self.fd = os.open(self.directory / f"journal.{self.gen}", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        fsync_dir(self.directory)
        os.close(old)
        (self.directory / f"journal.{self.gen - 1}").unlink(missing_ok=True)
        self.size, self.unsynced = 0, False
        return True

    def statistics(self) -> dict:
        return {"generation": self.gen, "journalBytes": self.size, "writes": self.appended, "syncs": self.syncs,
                "droppedBytesAtOpen": self.dropped_bytes}

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class PopLogTail:
    """A master's pop log as its ha-server ships it (read only, beside the pop service that
    writes it): the snapshot's bytes and generation, and the journal's whole frames from an
    offset. Compaction renames the new snapshot in before journal N+1 begins, so a snapshot of
    generation N+1 may be read while journal N+1 does not exist yet: it is then empty."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.seen: tuple[int, int] | None = None  # the snapshot file's (mtime ns, size) when read
        self.gen, self.snapshot = 0, b""

    def current(self) -> tuple[int, bytes]:
        """(generation, the snapshot's bytes: b"" for generation 0 without one)."""
        path = self.directory / "snapshot"
        try:
            info = path.stat()
        except FileNotFoundError:
            self.seen, self.gen, self.snapshot = None, 0, b""
            return self.gen, self.snapshot
        if self.seen != (info.st_mtime_ns, info.st_size):
            data = path.read_bytes()  # (replaced whole by a rename: never read half written)
            self.gen, self.snapshot = snapshot_generation(data), data
            self.seen = (info.st_mtime_ns, info.st_size)
        return self.gen, self.snapshot

    def journal(self, gen: int, offset: int, limit: int) -> bytes:
        """Up to `limit` bytes (-1: all there is) of whole frames of journal `gen` from `offset`
        (b"": none yet, or the generation is gone)."""
        try:
            with open(self.directory / f"journal.{gen}", "rb") as f:
                f.seek(offset)
                data = f.read(limit)
        except FileNotFoundError:
            return b""
        whole = whole_frames(data)
        if whole == 0 and len(data) == limit and limit > 0:  # one frame larger than a chunk: read it whole
            length = FRAME.unpack_from(data)[0] if len(data) >= FRAME.size else 0
            return self.journal(gen, offset, FRAME.size + length) if length <= MAX_FRAME else b""
        return data[:whole]


class PopReplica:
    """A slave's copy of its master's pop log (`<store>/pop-replica/`, the same layout: a
    PopLog opens it when the slave is promoted). Written as the master ships it: a generation's
    snapshot in chunks, then its journal's bytes in order. A new generation (the master
    compacted, or a new connection) starts the copy anew. Nothing is fdatasynced but the
    snapshot: a copy lost to a crash of the host costs a promoted slave only what a copy saves
    (it starts each queue from the group's committed offset), and a new connection ships it again."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.gen = -1
        self.phase = ""  # "S": taking the snapshot, "J": appending the journal
        self.size = 0  # bytes of the part being taken
        self.taken = 0  # bytes taken since the connection began (the master's flow control)
        self.generations = self.journal_bytes = 0

    def clear(self) -> None:
        """A new connection: nothing of the copy holds until its master ships it again."""
        self._drop_files()
        self.gen, self.phase, self.size, self.taken = -1, "", 0, 0

    def _drop_files(self) -> None:
        for path in self.directory.iterdir():
            path.unlink()

    def snapshot_chunk(self, gen: int, offset: int, data: bytes) -> None:
        if offset == 0:  # a generation begins (the master compacted its log, or this connection is new)
            self._drop_files()
            self.gen, self.phase, self.size = gen, "S", 0
            self.generations += 1
        if (gen, "S", offset) != (self.gen, self.phase, self.size):
            raise ReplicaGap(f"a snapshot chunk of generation {gen} at {offset}; the copy is at {self.gen}/{self.phase}/{self.size}")
        with open(self.directory / "snapshot.tmp", "ab") as f:
            f.write(data)
        self.size += len(data)
        self.taken += len(data)

    def journal_chunk(self, gen: int, offset: int, data: bytes) -> None:
        if (self.gen, self.phase) == (gen, "S"):  # the snapshot is whole: it holds from now on
            self._seal_snapshot()
        if (gen, "J", offset) != (self.gen, self.phase, self.size) or whole_frames(data) != len(data):
            raise ReplicaGap(f"a journal chunk of generation {gen} at {offset} ({len(data)} bytes); "
                             f"the copy is at {self.gen}/{self.phase}/{self.size}")
        with open(self.directory / f"journal.{gen}", "ab") as f:
            f.write(data)
        self.size += len(data)
        self.taken += len(data)
        self.journal_bytes += len(data)

    def _seal_snapshot(self) -> None:
        tmp = self.directory / "snapshot.tmp"
        if self.size:
            try:
                shipped = snapshot_generation(tmp.read_bytes())
            except PopLogDamaged as e:
                raise ReplicaGap(f"the snapshot shipped for generation {self.gen}: {e}") from e
            if shipped != self.gen:
                raise ReplicaGap(f"the snapshot shipped for generation {self.gen} is of generation {shipped}")
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.directory / "snapshot")
        else:
            tmp.unlink(missing_ok=True)
        (self.directory / f"journal.{self.gen}").touch()
        self.phase, self.size = "J", 0

    def statistics(self) -> dict:
        return {"generation": self.gen, "phase": self.phase, "bytes": self.size, "taken": self.taken,
                "generationsTaken": self.generations, "journalBytes": self.journal_bytes}


class ReplicaGap(Exception):
    """A chunk that does not continue the copy: the link is broken (the ha-client reconnects,
    and its master ships the copy again from the snapshot)."""


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


def whole_frames(data: bytes) -> int:
    """Where the whole frames at the start of `data` end (no CRC check: for cutting a read of a
    journal being appended to at a frame's end)."""
    at = 0
    while at + FRAME.size <= len(data):
        end = at + FRAME.size + FRAME.unpack_from(data, at)[0]
        if end > len(data):
            break
        at = end
    return at


def snapshot_of(data: bytes) -> dict:
    """A snapshot file's {"gen", "state"}; PopLogDamaged unless its bytes are one whole frame
    (written whole, then renamed: damage there is not a crash's)."""
    frames, _ = read_frames(data)
    if len(frames) != 1:
        raise PopLogDamaged("not one whole frame")
    return orjson.loads(frames[0])


def snapshot_generation(data: bytes) -> int:
    """The generation a snapshot file's bytes begin (PopLogDamaged as `snapshot_of`)."""
    gen = snapshot_of(data)["gen"]
    assert isinstance(gen, int) and gen >= 0, gen  # (written by PopLog.compact only)
    return gen
