"""ConsumeQueueTest, IndexFileTest, StoreCheckpointTest and DefaultMessageStoreTest read scenarios."""

import errno
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import message, open_store, put, small_settings
from hypothesis import example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from shm import index_file as index_file_module
from shm import mapped_file
from shm.checkpoint import Checkpoint
from shm.codec import decode, index_key_hash, parse_properties, tags_code
from shm.consume_queue import FILLER_SIZE, ConsumeQueue
from shm.control_block import FLAG_DISK_FULL, ControlBlock
from shm.dispatch import ReputStopped, reput
from shm.index_file import INDEX_KEY, IndexFile, IndexService, index_file_size
from shm.mapped_file import AllocationFailed
from shm.store import MessageStore
from shm.store_files import StoreLock, StoreLocked


def test_queue_put_read_rollover_and_repeat(tmp_path):
    queue = ConsumeQueue(tmp_path, "T", 0, 200)  # 10 entries a file
    for i in range(25):
        assert queue.put(i, 1000 + i * 100, 100, i % 3)
    assert (queue.offset_min, queue.offset_max) == (0, 25)
    assert [f.path.name for f in queue.files.files] == ["00000000000000000000", "00000000000000000200",
                                                        "00000000000000000400"]
    assert queue.put(3, 1300, 100, 0)  # a repeat is accepted and changes nothing
    assert queue.offset_max == 25 and queue.entry(3).physical_offset == 1300
    entries = queue.entries(7)
    assert [e.queue_offset for e in entries] == [7, 8, 9]  # to the end of that file, as getMessage reads
    assert [e.queue_offset for e in ConsumeQueue.matching(queue.entries(10), {1})] == [10, 13, 16, 19]
    assert queue.entries(25) == [] and queue.entry(30) is None


def test_queue_that_starts_late_is_filled_like_rocketmq(tmp_path):
    queue = ConsumeQueue(tmp_path, "T", 1, 200)
    queue.put(13, 5000, 50, 0)
    assert (queue.offset_min, queue.offset_max) == (13, 14)
    raw = queue.files.files[0].map[:80]
    assert raw[:20] == (0).to_bytes(8, "big") + FILLER_SIZE.to_bytes(4, "big") + bytes(8)
    reopened = ConsumeQueue(tmp_path, "T", 1, 200)
    reopened.recover()
    reopened.correct_min_offset(0)
    assert (reopened.offset_min, reopened.offset_max) == (13, 14)


def test_queue_truncate_dirty_and_recover(tmp_path):
    queue = ConsumeQueue(tmp_path, "T", 0, 200)
    for i in range(25):
        queue.put(i, i * 100, 100, 0)
    assert queue.truncate_dirty(1250) == 12
    assert queue.offset_max == 13 and queue.max_physical_offset == 1300
    assert len(queue.files.files) == 2
    queue.close()
    reopened = ConsumeQueue(tmp_path, "T", 0, 200)
    assert reopened.recover() == 0 and reopened.offset_max == 13


def _blocks(path) -> int:
    return os.stat(path).st_blocks * 512


def test_a_queue_file_gets_its_blocks_as_its_entries_come(tmp_path):
    """A ConsumeQueue file has its whole size (RocketMQ's) but only the blocks its entries
    reached, BLOCKS_AHEAD at a time: thousands of queues of a few messages each held 5.72 MiB of
    disk each (1,000 topics of 8 queues: 45 GiB), which the clean service counted as used."""
    from shm.consume_queue import BLOCKS_AHEAD, ENTRY_SIZE

    size = 300_000 * ENTRY_SIZE  # RocketMQ's default file
    queue = ConsumeQueue(tmp_path, "T", 0, size)
    queue.put(0, 0, 100, 0)
    path = queue.files.files[0].path
    assert os.stat(path).st_size == size and _blocks(path) <= BLOCKS_AHEAD
    per_range = BLOCKS_AHEAD // ENTRY_SIZE + 1  # entries past the first range
    for i in range(1, per_range + 1):
        queue.put(i, i * 100, 100, 0)
    assert BLOCKS_AHEAD < _blocks(path) <= 2 * BLOCKS_AHEAD
    queue.close()
    reopened = ConsumeQueue(tmp_path, "T", 0, size)
    assert reopened.recover() == 0 and reopened.offset_max == per_range + 1
    assert [e.physical_offset for e in reopened.entries(per_range - 1, 2)] == [(per_range - 1) * 100, per_range * 100]
    reopened.put(per_range + 1, (per_range + 1) * 100, 100, 0)  # (a loaded file: its next range asked for again)
    assert reopened.entry(per_range + 1).physical_offset == (per_range + 1) * 100
    assert _blocks(path) <= 2 * BLOCKS_AHEAD
    reopened.close()


def test_a_full_disk_refuses_a_queue_s_next_range_before_any_entry_is_stored(tmp_path, monkeypatch):
    """No store into a hole (a SIGBUS on a full disk): the next range's blocks are asked for
    first, and a refusal is an AllocationFailed with nothing stored; once there is room the
    entries follow on."""
    from shm.consume_queue import BLOCKS_AHEAD, ENTRY_SIZE

    queue = ConsumeQueue(tmp_path / "cq", "T", 0, 300_000 * ENTRY_SIZE)
    disk = SmallDisk(tmp_path / "cq", monkeypatch)
    first = BLOCKS_AHEAD // ENTRY_SIZE  # whole entries in the first range
    for i in range(first):
        queue.put(i, i * 100, 100, 0)
    disk.size = disk.used()  # not a block more
    with pytest.raises(AllocationFailed):
        queue.put(first, first * 100, 100, 0)  # (its 20 bytes straddle the first range's end)
    assert queue.offset_max == first and queue.files.files[0].map[first * ENTRY_SIZE: (first + 2) * ENTRY_SIZE] == bytes(40)
    disk.size = 2**62
    queue.put(first, first * 100, 100, 0)
    assert queue.offset_max == first + 1 and queue.entry(first).physical_offset == first * 100
    queue.close()


def test_a_queue_holds_no_descriptor_and_still_flushes_and_knows_its_file(tmp_path):
    """The dispatcher holds every queue of the node: with a descriptor each, it ran out of them
    (EMFILE) at ~20,000 queues where a process may have 20,000, and died again at every restart.
    A queue's files hold their mappings only; flush is an msync, the file's identity its inode.
    (Python's mmap keeps a descriptor of its own before 3.13: one a file, not two.)"""
    from shm.consume_queue import ENTRY_SIZE
    from shm.mapped_file import MAP_TRACKS_FD

    def descriptors() -> int:
        """This process's descriptors of the queues' files (not all of them: the worker's other
        objects, collected by a GC this test's allocations set off, close theirs meanwhile)."""
        found = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                found += os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path))
            except OSError:
                continue  # (the listing's own, closed since)
        return found

    before = descriptors()
    readers = [ConsumeQueue(tmp_path, f"T{i}", 0, 300_000 * ENTRY_SIZE, readonly=True) for i in range(200)]
    queues = [ConsumeQueue(tmp_path, f"T{i}", 0, 300_000 * ENTRY_SIZE) for i in range(200)]
    for queue in queues:
        queue.put(0, 0, 100, 0)
    assert descriptors() - before == (len(queues) if MAP_TRACKS_FD else 0)
    assert all(queue.flush() == ENTRY_SIZE for queue in queues)
    segment = queues[0].files.files[0]
    assert segment.is_file_at(segment.path)
    for reader in readers:  # (a pull worker's view finds the files made since by refresh)
        reader.files.refresh()
        assert reader.entry(0).physical_offset == 0
    assert descriptors() - before == (2 * len(queues) if MAP_TRACKS_FD else 0)
    for queue in queues + readers:
        queue.close()
    assert descriptors() == before


def test_recovery_zeros_a_sparse_queue_file_s_dropped_tail_and_no_more(tmp_path):
    """Entries after a damaged one are dropped and zeroed; the holes past the last byte written
    stay holes (zeroing to the file's end gave every queue recovered its whole 5.72 MiB)."""
    from shm.consume_queue import BLOCKS_AHEAD, ENTRY_SIZE

    queue = ConsumeQueue(tmp_path, "T", 0, 300_000 * ENTRY_SIZE)
    for i in range(10):
        queue.put(i, i * 100, 100, 0)
    segment = queue.files.files[0]
    segment.map[5 * ENTRY_SIZE: 6 * ENTRY_SIZE] = bytes(ENTRY_SIZE)  # entry 5 lost: 6-9 are dropped
    queue.close()
    reopened = ConsumeQueue(tmp_path, "T", 0, 300_000 * ENTRY_SIZE)
    assert reopened.recover() == 4 and reopened.offset_max == 5
    assert reopened.files.files[0].map[5 * ENTRY_SIZE: 10 * ENTRY_SIZE] == bytes(5 * ENTRY_SIZE)
    assert _blocks(reopened.files.files[0].path) <= BLOCKS_AHEAD
    reopened.close()


def test_a_queue_file_is_read_to_its_data_s_end_and_every_queue_opened_is_told(tmp_path):
    """Recovery reads a queue file up to where its data ends (pread, not the mapping): a dispatcher
    restarted over 15,000 queues of an entry each read 5.72 MiB of zeros a queue through page
    faults (7 minutes; killed as hung after 10 s, again at every restart). Opening them all
    calls `progress` after each, so the service opening them beats meanwhile."""
    from shm.consume_queue import BLOCKS_AHEAD

    settings = small_settings(tmp_path / "store", mappedFileSizeConsumeQueue=300_000 * 20)
    store = open_store(settings)
    for i in range(3):
        put(store, [message(i, queues=3)])
    store.close()
    reopened = MessageStore(settings, lock=False)
    opened = []
    reopened.load_consume_queues(progress=lambda: opened.append(1))
    assert len(opened) == len(reopened.consume_queues) == 3
    for queue in reopened.consume_queues.values():
        assert len(queue.files.files[0].data()) <= BLOCKS_AHEAD
        assert queue.recover() == 0 and queue.offset_max == 1
    reopened.close()


def test_a_reput_with_a_deadline_returns_after_a_batch_and_goes_on_from_there(tmp_path):
    """The dispatcher's turn is bounded in time (it beats between turns): a reput past its
    deadline returns where its batch ended, and the next one dispatches the rest, once."""
    from shm.dispatch import BATCH_RECORDS

    settings = small_settings(tmp_path / "store", mappedFileSizeCommitLog=8 << 20)  # (one segment holds them)
    store = open_store(settings)
    sent = range(BATCH_RECORDS + 500)
    for i in range(0, len(sent), 100):
        put(store, [message(j, queues=4) for j in sent[i: i + 100]], dispatch=False)
    end = store.commitlog.offset_written
    reached, count = reput(store, 0, end, deadline=time.monotonic() - 1)
    assert count == BATCH_RECORDS and reached < end
    reached, rest = reput(store, reached, end, deadline=time.monotonic() + 60)
    assert reached == end and count + rest == len(sent) == _entries(store)
    store.close()


def test_offset_by_time(tmp_path):
    """testGetOffsetInQueueByTime and its skewing cases."""
    settings = small_settings(tmp_path / "s")
    store = open_store(settings)
    for i in range(10):
        put(store, [message(i, queues=1)], store_timestamp=1795000000000 + i * 10)
    queue = store.consume_queue("TopicA", 0)

    def store_time(phy, size):
        return store.commitlog.read(phy).store_timestamp

    for i in range(10):
        t = 1795000000000 + i * 10
        assert queue.offset_by_time(t, store_time) == i
        assert queue.offset_by_time(t + 2, store_time) == i
        assert queue.offset_by_time(t - 2, store_time) == i
    assert queue.offset_by_time(1795000000000 + 20000, store_time) == 9
    assert queue.offset_by_time(1795000000000 - 20000, store_time) == 0
    assert ConsumeQueue(tmp_path / "none", "X", 0, 200).offset_by_time(5, store_time) == 0
    store.close()


def test_index_file_capacity_and_select(tmp_path):
    """IndexFileTest: 400 entries hold 399 keys; key "60" is found once."""
    index = IndexFile(tmp_path / "20260101000000000", 100, 400, create=True)
    assert index.size == index_file_size(100, 400)
    for i in range(399):
        assert index.put_key(str(i), i, 1795000000000)
    assert not index.put_key("399", 399, 1795000000000)
    assert index.select("60", 10, 0, 2**62) == [60]


def test_index_worked_example_bytes(tmp_path):
    index = IndexFile(tmp_path / "20260101000000000", 5_000_000 // 1000, 2000, create=True)
    for key in ("TopicTest#7F00000130391B6D358647B760000000", "TopicTest#k1", "TopicTest#k2"):
        index.put_key(key, 1024, 1700000000123)
    assert (index.begin_timestamp, index.end_timestamp, index.begin_phy_offset, index.end_phy_offset,
            index.hash_slot_count, index.index_count) == (1700000000123, 1700000000123, 1024, 1024, 3, 4)
    entries_at = 40 + index.slot_count * 4
    assert bytes(index.map[entries_at + 20: entries_at + 40]).hex() == "2f07e886" + "0000000000000400" + "0" * 16


@pytest.mark.skipif(not index_file_module.NATIVE, reason="shm._dispatch was not built")
@given(st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 3), st.integers(-3000, 3000)), max_size=60),
       st.integers(0, 4), st.sampled_from([0, 1795000000000]))
@example([(5, 1, 10)] * 40, 0, 0)  # one slot, a file filled mid-message
def test_index_links_in_c_the_bytes_put_hash_writes(tmp_path_factory, steps, seed_phy, seed):
    """shm._dispatch.index_put against put_hash key by key, over files that fill up (and go on
    in a fresh one), keys sharing slots and messages, stamps before the file's begin, and a
    file seeded from a full one. (What a replay skips: the straddle test below.)"""
    root = tmp_path_factory.mktemp("index")
    keys, phy, stamp = bytearray(), 0, 1795000000000
    for key_hash, phy_step, stamp_step in steps:
        phy, stamp = phy + phy_step, stamp + stamp_step
        keys += INDEX_KEY.pack(key_hash, phy, stamp)
    files = {}
    for mode in ("put_hash", "c"):
        index = IndexFile(root / f"{mode}-0", 7, 16, create=True)
        if seed:
            index.seed(seed_phy, seed)
        done, added, n = 0, 0, 0
        while done < len(steps):
            if mode == "c":
                done, more = index.put_packed(keys, done)
                added += more
            else:
                key_hash, key_phy, key_stamp = INDEX_KEY.unpack_from(keys, done * INDEX_KEY.size)
                if index.put_hash(key_hash, key_phy, key_stamp):
                    done, added = done + 1, added + 1
                    continue
            if done < len(steps) and index.is_full():
                n += 1
                index = IndexFile(root / f"{mode}-{n}", 7, 16, create=True)
        files[mode] = (added, [(root / f"{mode}-{i}").read_bytes() for i in range(n + 1)])
    assert files["c"] == files["put_hash"]


KEY_NAMES = [f"T#k{i}" for i in range(12)]


@hypothesis_settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from(KEY_NAMES), min_size=1, max_size=12), min_size=3, max_size=6),
       st.integers(0, 5), st.booleans())
def test_a_put_killed_before_its_header_loses_no_chain(tmp_path_factory, batches, torn_at, native):
    """A dispatcher killed inside a put leaves entries and slots the header does not count (its
    last write). Readers still find every counted key; the restarted writer mends the slots,
    replays the torn batch and goes on, and every key leads to each of its records."""
    path = tmp_path_factory.mktemp("torn") / "20260101000000000"
    index = IndexFile(path, 7, 200, create=True)
    torn_at = min(torn_at, len(batches) - 1)
    expected: dict[str, list[int]] = {name: [] for name in KEY_NAMES}
    phy, counted = 0, {}
    for number, batch in enumerate(batches):
        packed = bytearray()
        for name in batch:
            phy += 100
            packed += INDEX_KEY.pack(index_key_hash(name), phy, 1795000000000 + phy)
            expected[name].append(phy)
        if number == torn_at:
            counted = {name: list(found) for name, found in expected.items()}
            for name in batch:
                counted[name] = [p for p in counted[name] if p < phy - 100 * (len(batch) - 1)]
            header = bytes(index.map[:40])
            _put(index, packed, native)
            index.map[:40] = header  # killed before the header
            index.close()
            reader = IndexFile(path, 7, 200, readonly=True)
            assert {n: sorted(reader.select(n, 999, 0, 2**62)) for n in KEY_NAMES} == counted
            reader.close()
            restarted = IndexService(path.parent, 7, 200)  # the restart: a dispatcher's load
            restarted.load()
            index = restarted.files[-1]
        _put(index, packed, native)
    assert {n: sorted(index.select(n, 999, 0, 2**62)) for n in KEY_NAMES} == expected


def _put(index: IndexFile, packed: bytearray, native: bool) -> None:
    if native and index_file_module.NATIVE:
        index.put_packed(packed, 0)
        return
    keys = np.frombuffer(bytes(packed), dtype=index_file_module._index_key_dtype())
    index.put_many(keys["hash"].astype(np.int64), keys["phy"].astype(np.int64), keys["stamp"].astype(np.int64))


@hypothesis_settings(max_examples=60, deadline=None)  # (file creation and mapping: slow on a loaded machine)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=40), st.lists(st.integers(1, 9), max_size=8),
       st.integers(0, 40), st.sampled_from(["c", "numpy", "one-by-one"]))
@example([2] * 6, [], 3, "c")  # a 6-entry file fills between a record's two keys
def test_an_unclean_stop_replays_a_record_whose_keys_straddle_two_files(tmp_path_factory, keys_per_record, batches,
                                                                          stop_at, path):
    """Records of 1-4 keys each, dispatched in batches into 6-entry files, so a file often fills
    between two keys of one record. At an unclean stop recovery deletes the files newer than
    the checkpoint and replays from the newest survivor's endPhyOffset (shm.recovery): every
    key then leads to its record exactly once, whichever file holds it."""
    if path == "c" and not index_file_module.NATIVE:
        return
    records = [(number * 100, 1795000000000 + number * 1000, [f"k{number}-{k}" for k in range(count)])
               for number, count in enumerate(keys_per_record)]
    directory = tmp_path_factory.mktemp("straddle") / "index"
    checkpoint = [0]
    stop_at = min(stop_at, len(records))
    native = index_file_module.NATIVE
    index_file_module.NATIVE = path == "c"
    try:
        service = _index_service(directory, checkpoint)
        _dispatch_in_batches(service, records[:stop_at], batches, path)
        service.close()
        service = _index_service(directory, checkpoint, last_exit_ok=False)  # the restart after kill -9
        floor = service.files[-1].end_phy_offset if service.files else 0
        _dispatch_in_batches(service, [r for r in records if r[0] >= floor], batches, path)
    finally:
        index_file_module.NATIVE = native
    for phy, _, names in records:
        for name in names:
            assert service.query_all("T", name) == [phy], name


def _index_service(directory, checkpoint: list[int], *, last_exit_ok: bool = True) -> IndexService:
    clock = iter(range(1795000000, 1795100000)).__next__
    service = IndexService(directory, 5, 7, clock=lambda: clock())
    service.on_file_full = lambda stamp: checkpoint.__setitem__(0, max(checkpoint[0], stamp))
    service.load(last_exit_ok=last_exit_ok, checkpoint_index_timestamp=checkpoint[0])
    return service


def _dispatch_in_batches(service: IndexService, records: list, batches: list[int], path: str) -> None:
    at = 0
    for size in [*batches, len(records)]:
        batch, at = records[at: at + size], at + size
        if path == "one-by-one":
            for phy, stamp, names in batch:
                service.build_index("T", phy, stamp, 0, None, names)
            continue
        packed = bytearray()
        for phy, stamp, names in batch:
            for name in names:
                packed += INDEX_KEY.pack(index_key_hash(f"T#{name}"), phy, stamp)
        if packed:
            service.build_many(packed)


def test_index_service_rolls_over_and_queries_across_files(tmp_path):
    clock = iter(range(1795000000, 1795100000)).__next__
    service = IndexService(tmp_path / "index", 50, 20, clock=lambda: clock())
    service.load()
    for i in range(100):
        service.build_index("T", i * 100, 1795000000000 + i * 1000, 0, None, [f"k{i % 7}", "all"])
    assert len(service.files) > 5
    found = service.query("T", "k3", 64, 0, 2**62)
    assert sorted(found) == [i * 100 for i in range(100) if i % 7 == 3]
    assert len(service.query("T", "all", 64, 0, 2**62)) == 64  # capped at maxMsgsNumBatch
    assert sorted(service.query_all("T", "all")) == [i * 100 for i in range(100)]
    in_range = service.query("T", "all", 64, 1795000010000, 1795000019000)
    assert sorted(in_range) == [i * 100 for i in range(10, 20)]


def test_checkpoint_round_trip(tmp_path):
    """StoreCheckpointTest.testWriteAndRead."""
    checkpoint = Checkpoint(tmp_path / "checkpoint")
    checkpoint.physic_timestamp, checkpoint.logics_timestamp = 0xAABB, 0xCCDD
    checkpoint.flush()
    assert checkpoint.min_timestamp == 0xAABB - 3000
    checkpoint.close()
    again = Checkpoint(tmp_path / "checkpoint")
    assert (again.physic_timestamp, again.logics_timestamp) == (0xAABB, 0xCCDD)
    assert (tmp_path / "checkpoint").stat().st_size == 4096


def test_store_lock_refuses_a_second_opener_in_this_and_another_process(tmp_path):
    """DefaultMessageStoreTest.test_repeat_restart."""
    settings = small_settings(tmp_path)
    store = MessageStore(settings)
    with pytest.raises(StoreLocked, match="already"):
        MessageStore(settings)
    code = ("import sys; from shm.store_files import StoreLock, StoreLocked\n"
            "try:\n StoreLock(sys.argv[1]).acquire(); print('got it')\n"
            "except StoreLocked as e: print(e)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert f"the store is in use by process {os.getpid()} (MQ already started" in out.stdout, out.stdout
    # who holds it, as another process (`mqnode stop`) asks it, and as the holder itself does
    ask = "import sys; from shm.store_files import StoreLock; print(StoreLock(sys.argv[1]).holder())"
    holder = subprocess.run([sys.executable, "-c", ask, str(tmp_path)], capture_output=True, text=True, check=True)
    assert holder.stdout.strip() == str(os.getpid()) == str(StoreLock(tmp_path).holder())
    holder = subprocess.run([sys.executable, "-c", ask, str(tmp_path)], capture_output=True, text=True, check=True)
    assert holder.stdout.strip() == str(os.getpid())  # (asking did not drop it)
    assert (tmp_path / "lock").read_bytes() == b"lock"  # (last: a close of any descriptor drops the process's lock)
    store.close()
    holder = subprocess.run([sys.executable, "-c", ask, str(tmp_path)], capture_output=True, text=True, check=True)
    assert holder.stdout.strip() == "None"
    assert StoreLock(tmp_path / "nowhere").holder() is None
    with StoreLock(tmp_path):
        pass


def test_control_block_counters_are_shared_between_processes(tmp_path):
    block = ControlBlock(tmp_path / "control", create=True)
    block.publish_recovered(written=100, flushed=50, dispatched=100, min_offset=0)
    block.set_flag(FLAG_DISK_FULL, True)
    block.heartbeat(3, 12345)
    code = ("import sys; from shm.control_block import ControlBlock, FLAG_DISK_FULL\n"
            "b = ControlBlock(sys.argv[1]); print(b.get('written'), b.get('flushed'), b.has_flag(FLAG_DISK_FULL), "
            "b.heartbeat_of(3)); b.advance('flushed', 100)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "control")], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["100", "50", "True", "12345"]
    assert block.get("flushed") == 100
    block.check()
    with pytest.raises(AssertionError):
        block.advance("written", 10)


def test_rebuilt_queues_and_index_equal_the_incremental_ones(tmp_path):
    """Derived structures rebuilt from the CommitLog are byte-identical to those built as records arrived."""
    import shutil

    from shm.recovery import recover
    from shm.store_files import mark_clean_exit

    settings = small_settings(tmp_path / "s")
    store = open_store(settings)
    for start in range(0, 600, 50):
        put(store, [message(i, topic=("TopicA", "TopicB")[i % 2]) for i in range(start, start + 50)],
            store_timestamp=1795000000000 + start)
    store.flush_all()
    before = {p.relative_to(settings.root): p.read_bytes() for p in settings.consumequeue_dir.rglob("0*") if p.is_file()}
    index_before = [p.read_bytes() for p in sorted(settings.index_dir.iterdir())]
    store.close()
    mark_clean_exit(settings.root)
    shutil.rmtree(settings.consumequeue_dir)
    shutil.rmtree(settings.index_dir)
    store = MessageStore(settings, clock=lambda: 1795000000.0)
    report = recover(store)
    assert report.records_dispatched == 600
    store.flush_all()
    after = {p.relative_to(settings.root): p.read_bytes() for p in settings.consumequeue_dir.rglob("0*") if p.is_file()}
    assert after == before
    assert [p.read_bytes() for p in sorted(settings.index_dir.iterdir())] == index_before
    store.close()


def test_pull_size_scenario(tmp_path):
    """testPullSize: 32 messages in one queue, read 32, 20 and 10 at a time."""
    store = open_store(small_settings(tmp_path, mappedFileSizeConsumeQueue=20 * 1000))
    put(store, [message(i, queues=1) for i in range(32)])
    queue = store.consume_queue("TopicA", 0)
    for count in (32, 20, 10):
        entries = queue.entries(0, count)
        assert len(entries) == count
        records = [decode(store.commitlog.read_bytes(e.physical_offset, e.size)) for e in entries]
        assert [r.queue_offset for r in records] == list(range(count))
        assert all(tags_code(r.tags) == e.tags_code for r, e in zip(records, entries, strict=True))
    store.close()


def _derived_files(root):
    """Every ConsumeQueue and IndexFile of a store, by relative path, with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes()
            for d in ("consumequeue", "index") for p in sorted((root / d).rglob("*")) if p.is_file()}


@pytest.mark.parametrize("native", [True, False], ids=["c-scan", "python-scan"])
@pytest.mark.parametrize("batch_records", [1, 7, 4096])
def test_batched_reput_writes_the_bytes_of_per_record_dispatch(tmp_path, monkeypatch, batch_records, native):
    """The batch path (one unpack per record, per-queue packing, numpy hashing and chain
    linking), its scan in C or in Python, against the plain one, over everything that takes a
    different branch: IPv6 hosts, delayed messages, PREPARED and ROLLBACK records, late-starting
    queues, CQ and index rollover."""
    from helpers import BORN_V6, STORE_V6

    from shm import consume_queue as consume_queue_module
    from shm import dispatch as dispatch_module
    from shm import index_file as index_file_module
    from shm.codec import SCHEDULE_TOPIC, TRANSACTION_PREPARED, TRANSACTION_ROLLBACK

    def records():
        for i in range(700):
            if i % 50 == 7:
                yield message(i, born=BORN_V6, store_host=STORE_V6)
            elif i % 40 == 3:
                yield message(i, topic=SCHEDULE_TOPIC, queues=2, delay=1 + i % 20)
            elif i % 30 == 11:
                yield message(i, sys_flag=(TRANSACTION_PREPARED, TRANSACTION_ROLLBACK)[i % 2])
            else:
                yield message(i, topic=("TopicA", "TopicB")[i % 2], queues=3)

    def clock():  # index file names must not depend on when the test ran
        return 1795000000.0

    stores = {}
    for mode in ("plain", "batched"):
        settings = small_settings(tmp_path / mode, maxIndexNum=150)
        store = open_store(settings, clock=clock)
        for n, record in enumerate(records()):
            put(store, [record], store_timestamp=1795000000000 + n * 900, dispatch=False)
        if mode == "plain":
            for record in store.commitlog.iterate(0, read_body=False):
                dispatch_module.dispatch(store, record)
        else:
            monkeypatch.setattr(dispatch_module, "BATCH_RECORDS", batch_records)
            monkeypatch.setattr(dispatch_module, "NATIVE", native and dispatch_module.NATIVE)
            monkeypatch.setattr(index_file_module, "NATIVE", native and index_file_module.NATIVE)
            monkeypatch.setattr(consume_queue_module, "NATIVE", native and consume_queue_module.NATIVE)
            assert dispatch_module.reput(store, 0) == (store.commitlog.offset_written, 700)
        store.flush_all()
        stores[mode] = _derived_files(settings.root)
        assert len([name for name in stores[mode] if name.startswith("index")]) > 2
        store.close()
    assert stores["plain"].keys() == stores["batched"].keys()
    for name in stores["plain"]:
        assert stores["plain"][name] == stores["batched"][name], name


def test_reader_returns_exactly_the_named_records_reading_runs_within_segments(tmp_path):
    """get_message reads records lying back to back as one run, never across a CommitLog
    segment: at any offset, count and tag filter, a pull returns exactly the records its
    ConsumeQueue entries name, in order (here 64 KiB segments, runs of one queue and interleaved)."""
    from shm.reader import FOUND, StoreReader

    settings = small_settings(tmp_path, mappedFileSizeConsumeQueue=1000 * 20)
    store = open_store(settings)
    for start in range(0, 900, 60):
        put(store, [message(i, queues=1 if start % 120 else 3) for i in range(start, start + 60)])
    store.flush_all()
    assert len(store.commitlog.segments.files) >= 4
    reader = StoreReader(settings)
    dispatched = store.commitlog.offset_written
    for queue_id in range(3):
        queue = store.consume_queue("TopicA", queue_id)
        for offset in range(0, queue.offset_max, 7):
            for count, tags in ((32, None), (5, None), (32, {tags_code("TagA")}), (1, {tags_code("TagB")})):
                result = reader.get_message("TopicA", queue_id, offset, count, tags, dispatched)
                chosen = [e for e in queue.entries(offset, result.next_begin_offset - offset)
                          if tags is None or e.tags_code in tags]
                assert result.count == len(chosen) <= count
                assert b"".join(result.records) == b"".join(
                    store.commitlog.read_bytes(e.physical_offset, e.size) for e in chosen)
                assert result.status == (FOUND if chosen else "NO_MATCHED_MESSAGE")
    one_queue = reader.get_message("TopicA", 0, 20, 32, None, dispatched)  # from the batch of 60 to queue 0
    assert one_queue.count == 32 and len(one_queue.records) <= 2  # one run (two, where a segment ends)
    reader.close()
    store.close()


@given(st.lists(st.sampled_from(["TAGS\x01", "KEYS\x01", "UNIQ_KEY\x01", "DELAY\x01", "XTAGS\x01", "a", "k1 k2",
                                 "\x01", "\x02", "é"]), max_size=10).map("".join))
@example("TAGS\x01a\x02TAGS\x01")  # the last pair is empty: Java keeps the earlier one
@example("XTAGS\x01a\x02KEYS\x01\x02UNIQ_KEY\x01u\x01v")
def test_dispatch_reads_a_property_as_parsing_them_all_would(text):
    """The reput fast path looks up TAGS, KEYS, UNIQ_KEY and DELAY in the text instead of parsing
    every pair; for any text, even odd ones (a name twice, empty values, a name inside another,
    pairs without a separator) it finds what Java's rules do."""
    from shm import dispatch

    parsed = parse_properties(text)
    for name, marker in (("TAGS", dispatch._TAGS), ("KEYS", dispatch._KEYS), ("UNIQ_KEY", dispatch._UNIQ_KEY),
                         ("DELAY", dispatch._DELAY)):
        assert dispatch._value(text, marker) == parsed.get(name), name


class SmallDisk:
    """A disk of `size` bytes for the store under `root`, in this process: posix_fallocate
    refuses (ENOSPC) what would pass it and the allocator's free_bytes answers what is left, the
    store's files' blocks being what is used (exact, where a small tmpfs needs root)."""

    def __init__(self, root, monkeypatch):
        self.root, self.size = root, 2**62
        fallocate = os.posix_fallocate

        def bounded(fd, offset, length):
            if self.used() + length > self.size:
                raise OSError(errno.ENOSPC, "No space left on device")
            fallocate(fd, offset, length)

        monkeypatch.setattr(os, "posix_fallocate", bounded)
        monkeypatch.setattr(mapped_file, "free_bytes", lambda path: self.size - self.used())

    def used(self) -> int:
        return sum(p.stat().st_blocks * 512 for p in self.root.rglob("*") if p.is_file())


def _fill(store) -> list[int]:
    """Records into the log until it may not take another segment; their physical offsets."""
    offsets, i = [], 0
    with pytest.raises(AllocationFailed, match="free for the ConsumeQueue and index entries"):
        while True:
            offsets += put(store, [message(i)], dispatch=False).physical_offsets
            i += 1
    return offsets


def _entries(store) -> int:
    return sum(queue.offset_max for queue in store.consume_queues.values())


def test_a_log_that_fills_its_disk_leaves_the_reput_room_for_its_oldest_segment(tmp_path, monkeypatch):
    """A new segment leaves Settings.commitlog_headroom free. Without it the log took four
    segments of this disk and left 8 KiB, not the room the oldest segment's entries need (a
    ConsumeQueue file a queue, an index file): the reput could not finish it, the clean service
    (which deletes only segments dispatched whole) could not delete it, and a slave catching up
    on a small disk waited for ever."""
    settings = small_settings(tmp_path / "store")
    store = open_store(settings)
    disk = SmallDisk(settings.root, monkeypatch)
    segment = settings.mappedFileSizeCommitLog
    disk.size = disk.used() + 4 * segment + 8192
    offsets = _fill(store)
    assert len(store.commitlog.segments.files) == 3  # a fourth would leave less than the headroom
    assert settings.commitlog_headroom == max(segment // 2, index_file_size(settings.maxHashSlotNum, settings.maxIndexNum)
                                              + settings.mappedFileSizeConsumeQueue)
    assert disk.size - disk.used() >= settings.commitlog_headroom
    reached, count = reput(store, 0, store.commitlog.offset_written)
    assert reached == store.commitlog.offset_written and count == len(offsets) == _entries(store)
    store.close()


def test_a_reput_that_runs_out_of_room_says_how_far_every_record_has_its_entries(tmp_path, monkeypatch):
    """ReputStopped: each segment it got through is whole (a batch never spans two), so the
    dispatcher publishes that much and the clean service may delete it; the rest follows once
    there is room, and nothing is entered twice."""
    settings = small_settings(tmp_path / "store")
    store = open_store(settings)
    disk = SmallDisk(settings.root, monkeypatch)
    placed = []  # (physical offset, queue id, queue offset) of each record
    for i in range(900):
        result = put(store, [message(i)], dispatch=False)
        placed.append((result.physical_offsets[0], i % 4, result.queue_offsets[0]))
    segment = settings.mappedFileSizeCommitLog
    assert store.commitlog.offset_written > 5 * segment
    disk.size = disk.used() + 40 * 1024  # the first segments' files, not all of them
    with pytest.raises(ReputStopped) as stopped:
        reput(store, 0, store.commitlog.offset_written)
    reached = stopped.value.reached
    assert segment <= reached < store.commitlog.offset_written
    below = [(phy, queue_id, queue_offset) for phy, queue_id, queue_offset in placed if phy < reached]
    assert stopped.value.count == len(below)
    for phy, queue_id, queue_offset in below:  # every record below `reached` is in its queue
        assert store.consume_queue("TopicA", queue_id).entry(queue_offset).physical_offset == phy
    disk.size = 2**62
    reached, _ = reput(store, reached, store.commitlog.offset_written)
    assert reached == store.commitlog.offset_written and _entries(store) == len(placed)
    store.close()
