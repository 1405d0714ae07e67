"""IndexFile: a hash index from `topic#key` to CommitLog offsets, one fixed-size file per period.

Files: `index/<yyyyMMddHHmmssSSS>` (creation time, local zone), each
40 + maxHashSlotNum*4 + maxIndexNum*20 bytes (420,000,040 with the defaults), allocated before
mapping. All integers big-endian.

Header (40 bytes at 0), written through to the mapping as it changes:

| offset | width | field                                                      |
|--------|-------|------------------------------------------------------------|
| 0      | 8     | beginTimestamp: store time of the first indexed message     |
| 8      | 8     | endTimestamp: store time of the last indexed message        |
| 16     | 8     | beginPhyOffset                                              |
| 24     | 8     | endPhyOffset                                                |
| 32     | 4     | hashSlotCount: slots ever used                              |
| 36     | 4     | indexCount: next entry number, from 1 (entry 0 is unused)   |

Slot s (i32 at 40 + s*4): the number of the newest entry whose keyHash % slots == s; 0 = empty.
Entry n (20 bytes at 40 + slots*4 + n*20): keyHash i32 (abs(jhash(key)), MIN_VALUE -> 0),
phyOffset i64, timeDiff i32 (seconds since beginTimestamp), prevIndex i32 (older entry of the
same slot, 0 = none). A file is full at indexCount == maxIndexNum (maxIndexNum - 1 entries).

No checksum: the index is derived. Crash policy: after an unclean stop, files whose
endTimestamp is newer than the checkpoint's indexMsgTimestamp are deleted and rebuilt by
re-dispatching the CommitLog from the newest file's endPhyOffset: keys of records below it are
skipped, and of the record at it as many as the files already hold (`indexed_through`).
A put writes each entry, then the slot naming it, then the header: a writer killed in between
(a dispatcher restarted alone keeps its files) leaves slots naming entries the header does not
count. Readers pass over such entries along their `prev`; a writer opening the file points those
slots back at their newest counted entry first (`repair_torn_slots`), or its next put would
drop their chains.
Matching is by hash only: callers re-check the real key of each returned record.

Single writer: the reput dispatcher (or start-up recovery). Readers re-read the header from the
mapping on every query. The dispatcher hands keys over already hashed (`build_many`): INDEX_KEY
records, each keyHash i32, phyOffset i64, storeTimestamp i64, little-endian.
"""

from __future__ import annotations

import functools
import mmap
import os
import struct
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from shm.codec import TRANSACTION_MASK, TRANSACTION_ROLLBACK, index_key_hash
from shm.invariant import invariant
from shm.mapped_file import WrongFileSize, allocate, no_read_around, retire
from shm.native import NATIVE, _dispatch

if TYPE_CHECKING:
    import numpy as np

HEADER_SIZE = 40
SLOT_SIZE = 4
ENTRY_SIZE = 20
_HEADER = struct.Struct(">qqqqii")
_SLOT = struct.Struct(">i")
_ENTRY = struct.Struct(">iqii")
_PHY = struct.Struct(">q")
_INT_MAX = 2**31 - 1
SMALL_BATCH = 48  # below this many keys, build_many puts them one by one
INDEX_KEY = struct.Struct("<iqq")  # keyHash, phyOffset, storeTimestamp: build_many's input


# numpy is imported where it is used, by the index's writer (the dispatcher) and its repair: the
# processes that only query or delete index files (pull, pop, clean, the front) start without it,
# ~0.1 CPU-s each.
@functools.cache
def _entry_dtype():
    import numpy as np
    return np.dtype([("hash", ">i4"), ("phy", ">i8"), ("time_diff", ">i4"), ("prev", ">i4")])


@functools.cache
def _index_key_dtype():
    import numpy as np
    return np.dtype([("hash", "<i4"), ("phy", "<i8"), ("stamp", "<i8")])


def end_phy_offset(path) -> int | None:
    """An index file's endPhyOffset, read from its header without mapping the file (the clean
    service's test of whether the whole file lies below the CommitLog's min offset); None when
    it cannot be read."""
    try:
        with open(path, "rb") as f:
            return _HEADER.unpack(os.pread(f.fileno(), HEADER_SIZE, 0))[3]
    except (OSError, struct.error):
        return None


def index_file_size(slot_count: int, index_max: int) -> int:
    return HEADER_SIZE + slot_count * SLOT_SIZE + index_max * ENTRY_SIZE


def file_name_for(timestamp_ms: int) -> str:
    seconds, millis = divmod(timestamp_ms, 1000)
    return time.strftime("%Y%m%d%H%M%S", time.localtime(seconds)) + f"{millis:03d}"


class IndexFile:
    def __init__(self, path: Path, slot_count: int, index_max: int, *, create: bool = False,
                 readonly: bool = False):
        self.path = Path(path)
        self.slot_count = slot_count
        self.index_max = index_max
        self.size = index_file_size(slot_count, index_max)
        if create:
            allocate(self.path, self.size)
        actual = os.stat(self.path).st_size
        if actual != self.size:
            raise WrongFileSize(f"{self.path} is {actual} bytes; {slot_count} slots and {index_max} entries need {self.size}")
        self.fd = os.open(self.path, os.O_RDONLY if readonly else os.O_RDWR)
        self.map = mmap.mmap(self.fd, self.size, access=mmap.ACCESS_READ if readonly else mmap.ACCESS_WRITE)
        if create:
            no_read_around(self.map)  # a new file is holes: its hash slots are touched at random
        self.readonly = readonly
        self._read_header()

    # -- header ------------------------------------------------------------------------------

    def _read_header(self) -> None:
        (self.begin_timestamp, self.end_timestamp, self.begin_phy_offset, self.end_phy_offset,
         self.hash_slot_count, self.index_count) = _HEADER.unpack_from(self.map, 0)
        if self.index_count <= 0:
            self.index_count = 1

    def repair_torn_slots(self) -> int:
        """A writer killed inside a put leaves slots naming entries the header never counted:
        entries are written before the slot that names them, the header last. Left so, the next
        put drops that slot's whole chain (an uncounted head reads as empty) and hands its
        numbers to other keys. Each such slot is pointed back at the newest counted entry of its
        chain, the `prev` an uncounted entry kept; returns how many slots were mended."""
        import numpy as np
        invariant(not self.readonly)
        slots = np.frombuffer(self.map, dtype=">i4", count=self.slot_count, offset=HEADER_SIZE)
        torn = np.flatnonzero(slots >= self.index_count).tolist()
        entries_at = HEADER_SIZE + self.slot_count * SLOT_SIZE
        for slot in torn:
            current = int(slots[slot])
            for _ in range(self.index_max):  # prev only ever goes down: at most one round an entry
                if current < self.index_count or current >= self.index_max:
                    break
                previous = _ENTRY.unpack_from(self.map, entries_at + current * ENTRY_SIZE)[3]
                current = previous if previous < current else 0
            slots[slot] = current if 0 < current < self.index_count else 0
        del slots  # (an exported buffer keeps the mapping from closing)
        return len(torn)

    def _write_header(self) -> None:
        _HEADER.pack_into(self.map, 0, self.begin_timestamp, self.end_timestamp, self.begin_phy_offset,
                          self.end_phy_offset, self.hash_slot_count, self.index_count)

    def seed(self, end_phy_offset: int, end_timestamp: int) -> None:
        """A file that follows a full one starts from that file's end (IndexService behaviour)."""
        self.begin_timestamp = self.end_timestamp = end_timestamp
        self.begin_phy_offset = self.end_phy_offset = end_phy_offset
        self._write_header()

    def is_full(self) -> bool:
        return self.index_count >= self.index_max

    def keys_at_end(self) -> tuple[int, bool]:
        """How many of the newest entries point at end_phy_offset (the keys of that record this
        file holds), and whether they are all the entries it holds (a seeded file holds none)."""
        entries_at = HEADER_SIZE + self.slot_count * SLOT_SIZE + 4  # (the phyOffset field)
        for number in range(self.index_count - 1, 0, -1):
            if _PHY.unpack_from(self.map, entries_at + number * ENTRY_SIZE)[0] != self.end_phy_offset:
                return self.index_count - 1 - number, False
        return max(self.index_count - 1, 0), True

    # -- writing -----------------------------------------------------------------------------

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """Add one key; False when the file is full (the caller rolls over)."""
        return self.put_hash(index_key_hash(key), phy_offset, store_timestamp)

    def put_hash(self, key_hash: int, phy_offset: int, store_timestamp: int) -> bool:
        """`put_key` of a key already hashed (its keyHash)."""
        if self.is_full():
            return False
        slot_at = HEADER_SIZE + (key_hash % self.slot_count) * SLOT_SIZE
        previous, = _SLOT.unpack_from(self.map, slot_at)
        if previous <= 0 or previous > self.index_count:
            previous = 0
        time_diff = int((store_timestamp - self.begin_timestamp) / 1000)  # Java truncation
        time_diff = 0 if self.begin_timestamp <= 0 else min(max(time_diff, 0), _INT_MAX)
        entry_at = HEADER_SIZE + self.slot_count * SLOT_SIZE + self.index_count * ENTRY_SIZE
        _ENTRY.pack_into(self.map, entry_at, key_hash, phy_offset, time_diff, previous)
        _SLOT.pack_into(self.map, slot_at, self.index_count)
        if self.index_count <= 1:
            self.begin_phy_offset = phy_offset
            self.begin_timestamp = store_timestamp
        if previous == 0:
            self.hash_slot_count += 1
        self.index_count += 1
        self.end_phy_offset = phy_offset
        self.end_timestamp = store_timestamp
        self._write_header()
        return True

    def put_many(self, key_hashes: np.ndarray, phy_offsets: np.ndarray, store_timestamps: np.ndarray) -> int:
        """Add keys in order, as `put_key` one by one would, byte for byte; returns how many fit.

        The batch's chains are linked with array operations: within one slot each entry points
        at the one before it in the batch, the first at the slot's old head.
        """
        import numpy as np
        count = min(len(key_hashes), self.index_max - self.index_count)
        if count <= 0:
            return 0
        hashes, phys, stamps = key_hashes[:count], phy_offsets[:count], store_timestamps[:count]
        first_number = self.index_count
        numbers = np.arange(first_number, first_number + count, dtype=np.int64)
        slots = np.frombuffer(self.map, dtype=">i4", count=self.slot_count, offset=HEADER_SIZE)
        slot_of = hashes % self.slot_count
        order = np.argsort(slot_of, kind="stable")
        sorted_slots = slot_of[order]
        starts = np.ones(count, dtype=bool)
        starts[1:] = sorted_slots[1:] != sorted_slots[:-1]
        previous = np.empty(count, dtype=np.int64)
        previous[1:] = numbers[order[:-1]]
        heads = slots[sorted_slots[starts]].astype(np.int64)
        heads[(heads <= 0) | (heads > first_number)] = 0
        previous[starts] = heads
        prev_in_order = np.empty(count, dtype=np.int64)
        prev_in_order[order] = previous
        ends = np.ones(count, dtype=bool)
        ends[:-1] = starts[1:]
        time_diffs = self._time_diffs(phys, stamps)
        entries_at = HEADER_SIZE + self.slot_count * SLOT_SIZE + first_number * ENTRY_SIZE
        entries = np.frombuffer(self.map, dtype=_entry_dtype(), count=count, offset=entries_at)
        entries["hash"], entries["phy"] = hashes, phys
        entries["time_diff"], entries["prev"] = time_diffs, prev_in_order
        slots[sorted_slots[ends]] = numbers[order[ends]]  # after the entries they name (crash policy)
        self.hash_slot_count += int(np.count_nonzero(heads == 0))
        self.index_count += count
        self.end_phy_offset, self.end_timestamp = int(phys[-1]), int(stamps[-1])
        self._write_header()
        return count

    def put_packed(self, keys: bytes | bytearray, start: int) -> tuple[int, int]:
        """put_hash for INDEX_KEY records from `start` on, in C, until the file is full. Returns
        (the record to go on from, keys added)."""
        invariant(not self.readonly)
        done = _dispatch.index_put(self.map, self.slot_count, self.index_max, keys, start)
        self._read_header()
        return done

    def _time_diffs(self, phys: np.ndarray, stamps: np.ndarray) -> np.ndarray:
        """Seconds since beginTimestamp. The first entry of a file is measured against the begin
        it had (0, or a seed), then becomes the begin for the rest: what put_key does."""
        import numpy as np
        diffs = np.empty(len(stamps), dtype=np.int64)
        begin = self.begin_timestamp
        diffs[0] = 0 if begin <= 0 else min(max(int((int(stamps[0]) - begin) / 1000), 0), _INT_MAX)
        if self.index_count <= 1:
            self.begin_phy_offset, self.begin_timestamp = int(phys[0]), int(stamps[0])
            begin = self.begin_timestamp
        if begin <= 0:
            diffs[1:] = 0
        else:
            diffs[1:] = np.minimum(np.maximum(stamps[1:] - begin, 0) // 1000, _INT_MAX)
        return diffs

    def flush(self) -> None:
        if not self.readonly:
            self.map.flush()

    # -- reading -----------------------------------------------------------------------------

    def is_time_matched(self, begin: int, end: int) -> bool:
        return ((begin < self.begin_timestamp and end > self.end_timestamp)
                or self.begin_timestamp <= begin <= self.end_timestamp
                or self.begin_timestamp <= end <= self.end_timestamp)

    def select(self, key: str, max_count: int, begin: int, end: int) -> list[int]:
        """Physical offsets whose keyHash matches `key` with time in [begin, end], newest first."""
        if self.readonly:
            self._read_header()
        key_hash = index_key_hash(key)
        found: list[int] = []
        if self.index_count <= 1:
            return found
        current, = _SLOT.unpack_from(self.map, HEADER_SIZE + (key_hash % self.slot_count) * SLOT_SIZE)
        entries_at = HEADER_SIZE + self.slot_count * SLOT_SIZE
        for _ in range(self.index_max):  # a chain is never longer than the file
            if len(found) >= max_count or current <= 0 or current >= self.index_max:
                break
            hash_read, phy, time_diff, previous = _ENTRY.unpack_from(self.map, entries_at + current * ENTRY_SIZE)
            if current < self.index_count:  # counted; one the header does not count yet is passed over
                if time_diff < 0:
                    break
                time_read = self.begin_timestamp + time_diff * 1000
                if hash_read == key_hash and begin <= time_read <= end:
                    found.append(phy)
                if time_read < begin:
                    break
            if previous >= current:  # chains only go back
                break
            current = previous
        return found

    def close(self) -> None:
        if self.fd >= 0:
            self.map.close()
            os.close(self.fd)
            self.fd = -1

    def destroy(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class IndexService:
    """The index files of a store, oldest first; builds entries and answers key queries."""

    def __init__(self, directory: Path, slot_count: int, index_max: int, *, readonly: bool = False,
                 clock: Callable[[], float] = time.time, max_query: int = 64):
        self.directory = Path(directory)
        self.slot_count = slot_count
        self.index_max = index_max
        self.readonly = readonly
        self.clock = clock
        self.max_query = max_query
        self.files: list[IndexFile] = []
        self.torn_slots = 0  # slots `load` mended (IndexFile.repair_torn_slots)
        # Called with a full file's endTimestamp once it is forced (checkpoint indexMsgTimestamp).
        self.on_file_full: Callable[[int], None] = lambda timestamp: None

    def load(self, *, last_exit_ok: bool = True, checkpoint_index_timestamp: int = 0) -> list[str]:
        """Open every index file; after an unclean stop, delete the ones newer than the
        checkpoint (they are rebuilt by re-dispatch). Returns deleted names."""
        self.close()
        if not self.readonly:
            self.directory.mkdir(parents=True, exist_ok=True)
        deleted = []
        paths = sorted(p for p in self.directory.iterdir() if p.name.isdigit()) if self.directory.is_dir() else []
        for path in paths:
            index = IndexFile(path, self.slot_count, self.index_max, readonly=self.readonly)
            if not last_exit_ok and index.end_timestamp > checkpoint_index_timestamp and not self.readonly:
                index.destroy()
                deleted.append(path.name)
                continue
            self.files.append(index)
        if self.files and not self.readonly:  # only the newest file is ever written
            self.torn_slots = self.files[-1].repair_torn_slots()
        return deleted

    def refresh(self) -> None:
        """Readers: pick up files the writer created or deleted."""
        known = {f.path.name: f for f in self.files}
        names = sorted(p.name for p in self.directory.iterdir() if p.name.isdigit()) if self.directory.is_dir() else []
        for name in set(known) - set(names):
            known.pop(name).close()
        for name in names:
            if name not in known:
                known[name] = IndexFile(self.directory / name, self.slot_count, self.index_max, readonly=True)
        self.files = [known[n] for n in sorted(known)]

    def forget_deleted_head(self) -> None:
        """Close (never delete) the oldest files the clean service deleted."""
        while self.files and not self.files[0].path.exists():
            retire(self.files.pop(0))  # off the loop: an index file's mapping is hundreds of MiB

    # -- writing -----------------------------------------------------------------------------

    def indexed_through(self) -> tuple[int, int]:
        """(endPhyOffset, how many keys of the record there are indexed): a replay skips the
        keys of records below it and that many of its own. The run is counted back across
        files: a record's keys straddle a full file and its follower when the file fills
        between them, and an unclean stop may delete the follower (crash policy above)."""
        if not self.files:
            return 0, 0
        end, done = self.files[-1].end_phy_offset, 0
        for index in reversed(self.files):
            if index.end_phy_offset != end:
                break
            run, whole = index.keys_at_end()
            done += run
            if not whole:
                break
        return end, done

    def build_index(self, topic: str, phy_offset: int, store_timestamp: int, sys_flag: int,
                    uniq_key: str | None, keys: Iterable[str]) -> None:
        """Index one dispatched record: UNIQ_KEY first, then each KEYS token (§5.6)."""
        floor, done = self.indexed_through()
        if phy_offset < floor or sys_flag & TRANSACTION_MASK == TRANSACTION_ROLLBACK:
            return  # indexed before (a re-dispatch after recovery), or never indexed
        names = [name for name in (uniq_key, *keys) if name]
        index = self._writable()
        for name in names[done:] if phy_offset == floor else names:
            index = self._put(index, index_key_hash(f"{topic}#{name}"), phy_offset, store_timestamp)

    def build_many(self, packed: bytes | bytearray) -> int:
        """`build_index` over INDEX_KEY records in CommitLog order (ROLLBACK records left out by
        the caller), linking the whole batch at once; returns keys added."""
        import numpy as np
        index = self._writable()
        start = self._first_unindexed(packed)
        if NATIVE:
            return self._build_native(index, packed, start)
        keys = np.frombuffer(packed, dtype=_index_key_dtype())[start:]
        if not len(keys):
            return 0
        if len(keys) < SMALL_BATCH:  # numpy's fixed cost outweighs it for a handful of keys
            for key_hash, phy, stamp in keys.tolist():
                index = self._put(index, key_hash, phy, stamp)
            return len(keys)
        hashes = keys["hash"].astype(np.int64)
        phys, stamps = keys["phy"].astype(np.int64), keys["stamp"].astype(np.int64)
        done = 0
        for _ in range(len(keys) + 1):  # each round fills a file or finishes
            done += index.put_many(hashes[done:], phys[done:], stamps[done:])
            if done == len(keys):
                break
            index = self._writable()
        return done

    def _first_unindexed(self, packed: bytes | bytearray) -> int:
        """The first of `packed`'s keys not indexed yet: RocketMQ skips only records below
        endPhyOffset, so indexes the one at it twice after an abnormal restart; we do not."""
        import numpy as np
        floor, done = self.indexed_through()
        phys = np.frombuffer(packed, dtype=_index_key_dtype())["phy"]
        below, through = np.searchsorted(phys, floor, "left"), np.searchsorted(phys, floor, "right")
        return int(min(below + done, through))

    def _build_native(self, index: IndexFile, packed: bytes | bytearray, start: int) -> int:
        count = len(packed) // INDEX_KEY.size
        done, added = index.put_packed(packed, start)
        for _ in range(count):  # each round fills a file or finishes
            if done == count:
                break
            index = self._writable()
            done, more = index.put_packed(packed, done)
            added += more
        invariant(done == count, "every key was placed or skipped")
        return added

    def _put(self, index: IndexFile, key_hash: int, phy_offset: int, store_timestamp: int) -> IndexFile:
        if not index.put_hash(key_hash, phy_offset, store_timestamp):
            index = self._writable()
            ok = index.put_hash(key_hash, phy_offset, store_timestamp)
            invariant(ok, "a fresh index file accepts a key")
        return index

    def _writable(self) -> IndexFile:
        last = self.files[-1] if self.files else None
        if last is not None and not last.is_full():
            return last
        name = file_name_for(int(self.clock() * 1000))
        while (self.directory / name).exists() or (last is not None and name <= last.path.name):
            name = str(int(name) + 1)
        index = IndexFile(self.directory / name, self.slot_count, self.index_max, create=True)
        if last is not None:
            index.seed(last.end_phy_offset, last.end_timestamp)
            last.flush()
            self.on_file_full(last.end_timestamp)
        self.files.append(index)
        return index

    def flush(self) -> None:
        for index in self.files:
            index.flush()

    # -- reading -----------------------------------------------------------------------------

    def query(self, topic: str, key: str, max_count: int, begin: int, end: int) -> list[int]:
        """Offsets for `topic#key` in [begin, end], newest file first (IndexService.queryOffset)."""
        max_count = min(max_count, self.max_query)
        found: list[int] = []
        full_key = f"{topic}#{key}"
        for index in reversed(self.files):
            if index.readonly:
                index._read_header()
            if index.is_time_matched(begin, end):
                found.extend(index.select(full_key, max_count - len(found), begin, end))
            if index.begin_timestamp < begin or len(found) >= max_count:
                break
        return found

    def query_all(self, topic: str, key: str) -> list[int]:
        """Every offset indexed under `topic#key`, whatever its time, across all files (verify)."""
        full_key = f"{topic}#{key}"
        found: list[int] = []
        for index in self.files:
            if index.readonly:
                index._read_header()
            found.extend(index.select(full_key, self.index_max, -(2**62), 2**62))
        return found

    def delete_before(self, phy_offset: int) -> list[str]:
        """Drop index files (never the last) that only point below `phy_offset`."""
        deleted = []
        while len(self.files) > 1 and self.files[0].end_phy_offset < phy_offset:
            index = self.files.pop(0)
            deleted.append(index.path.name)
            index.destroy()
        return deleted

    def destroy(self) -> None:
        for index in self.files:
            index.destroy()
        self.files = []

    def close(self) -> None:
        for index in self.files:
            index.close()
        self.files = []
