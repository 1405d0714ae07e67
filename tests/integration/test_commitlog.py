"""MappedFileQueueTest, AppendCallbackTest and CommitLog behaviour."""

import struct

import pytest
from helpers import BORN, BORN_V6, STORE_HOST, STORE_V6, cached_pages, message

from shm.codec import BLANK_MAGIC, Blank, Record, decode, encode
from shm.commitlog import CommitLog, RecordTooLarge
from shm.encoded_batch import EncodedBatch
from shm.file_queue import MappedFileQueue, SegmentGap
from shm.mapped_file import AllocationFailed, MappedFile, WrongFileSize, allocate


def batch_of(records):
    batch = EncodedBatch()
    for r in records:
        batch.add(r)
    return batch


def test_queue_rolls_across_files_and_finds_by_offset(tmp_path):
    queue = MappedFileQueue(tmp_path / "q", 1024)
    for i in range(1024):
        f = queue.last_writable()
        f.write(f.position_written, struct.pack(">i", i))
        f.set_written(f.position_written + 4)
    assert [f.offset_start for f in queue.files] == [0, 1024, 2048, 3072]
    for offset, start in [(0, 0), (100, 0), (1024, 1024), (1124, 1024), (2048, 2048), (2148, 2048)]:
        assert queue.find(offset).offset_start == start
    assert queue.find(4096) is None and queue.find(4196) is None
    assert queue.offset_written == 4096
    assert queue.flush() == 4096


def test_queue_starting_at_nonzero_offset(tmp_path):
    queue = MappedFileQueue(tmp_path / "q", 1024)
    queue.create(1024)
    assert queue.find(1025).offset_start == 1024
    assert queue.find(0) is None and queue.find(123) is None
    assert queue.find(0, first_if_missing=True).offset_start == 1024


def test_truncate_and_delete_head(tmp_path):
    queue = MappedFileQueue(tmp_path / "q", 1024)
    for _ in range(4):
        f = queue.last_writable()
        f.set_written(1024)
    assert queue.truncate(1500) == ["00000000000000002048", "00000000000000003072"]
    assert queue.offset_written == 1500
    assert queue.delete_head(5) == ["00000000000000000000"]  # never the last file
    assert queue.offset_min == 1024


def test_load_refuses_wrong_sizes_and_gaps(tmp_path):
    directory = tmp_path / "q"
    directory.mkdir()
    for start in (0, 1024, 3072):
        allocate(directory / f"{start:020d}", 1024)
    with open(directory / f"{3072:020d}", "r+b") as f:
        f.seek(1000)
        f.write(b"\x01")  # one byte written after the gap
    with pytest.raises(SegmentGap, match="00000000000000002048"):
        MappedFileQueue(directory, 1024, drop_blank_after_gap=True)  # (data after the gap: refused)
    (directory / f"{3072:020d}").unlink()
    with open(directory / f"{2048:020d}", "wb") as f:
        f.write(b"x" * 100)
    with pytest.raises(WrongFileSize, match="100 bytes"):
        MappedFileQueue(directory, 1024)


def test_a_writer_deletes_never_written_segments_after_a_gap(tmp_path):
    """The allocator before 13a59b7 could make the segment after the one a full disk refused:
    the store then had a gap followed by blank segments, and no start got past it."""
    directory = tmp_path / "q"
    directory.mkdir()
    for start in (0, 1024, 3072, 4096):
        allocate(directory / f"{start:020d}", 1024)
    with open(directory / f"{1024:020d}", "r+b") as f:
        f.write(b"\x07" * 300)
    with pytest.raises(SegmentGap, match="00000000000000002048"):
        MappedFileQueue(directory, 1024, readonly=True, drop_blank_after_gap=True)  # a reader never deletes
    with pytest.raises(SegmentGap, match="00000000000000002048"):
        MappedFileQueue(directory, 1024)  # (a ConsumeQueue's: rebuilt whole by its store)
    queue = MappedFileQueue(directory, 1024, drop_blank_after_gap=True)
    assert queue.dropped_after_gap == [f"{3072:020d}", f"{4096:020d}"]
    assert [f.offset_start for f in queue.files] == [0, 1024]
    assert sorted(p.name for p in directory.iterdir()) == [f"{0:020d}", f"{1024:020d}"]
    assert queue.create(2048).offset_start == 2048  # appends go on where the log ends
    queue.close()


def test_holds_nothing_finds_a_byte_anywhere(tmp_path):
    path = tmp_path / f"{0:020d}"
    allocate(path, 3 << 20)
    for at in (None, 0, (1 << 20) - 1, 1 << 20, (3 << 20) - 1):
        if at is not None:
            with open(path, "r+b") as f:
                f.seek(at)
                f.write(b"\x01")
        mapped = MappedFile(path, 3 << 20)
        assert mapped.holds_nothing() is (at is None), at
        mapped.close()
        with open(path, "r+b") as f:
            f.seek(at or 0)
            f.write(b"\x00")


def test_a_reader_skips_a_head_segment_deleted_while_it_loads(tmp_path, monkeypatch):
    """The clean service deletes from the head while a service opens its read-only view: a file
    listed a moment ago may be gone when it is opened (a restart mid-clean hit this)."""
    directory = tmp_path / "q"
    directory.mkdir()
    for start in (1024, 2048):
        allocate(directory / f"{start:020d}", 1024)
    listed = [directory / f"{0:020d}", *sorted(p for p in directory.iterdir())]  # 0 was just deleted
    monkeypatch.setattr(MappedFileQueue, "segment_paths", lambda self: listed)
    reader = MappedFileQueue(directory, 1024, readonly=True)
    assert [f.offset_start for f in reader.files] == [1024, 2048]
    reader.close()
    with pytest.raises(FileNotFoundError):
        MappedFileQueue(directory, 1024)  # the writer's own load: a vanished file is not normal


def test_full_disk_is_an_error_not_a_crash(tmp_path, monkeypatch):
    import errno
    import os

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(AllocationFailed, match="No space left"):
        MappedFile(tmp_path / f"{0:020d}", 4096, create=True)
    assert list(tmp_path.iterdir()) == []


def test_append_patches_offsets_and_pads_segment_ends(tmp_path):
    log = CommitLog(tmp_path / "commitlog", 8192)
    records = [message(i) for i in range(60)]
    result = log.append_batch(batch_of(records), 1795000000000)
    items = list(log.iterate(check_crc=True))
    assert [r.position for r in items] == result.physical_offsets
    assert all(isinstance(r, Record) and r.physical_offset == r.position for r in items)
    assert [r.queue_offset for r in items] == result.queue_offsets == [i // 4 for i in range(60)]
    assert {r.store_timestamp for r in items} == {1795000000000}
    assert [r.body for r in items] == [decode(b).body for b in records]
    for segment in log.segments.files[:-1]:
        end = segment.position_written
        blank = next(x for x in _walk(segment) if isinstance(x, Blank))
        assert blank.position + blank.size == end == segment.size
        size, magic = struct.unpack_from(">ii", segment.map, blank.position)
        assert magic == BLANK_MAGIC and size >= 8


def _walk(segment):
    from shm.codec import decode

    position = 0
    while True:
        item = decode(segment.map, position)
        yield item
        if not isinstance(item, Record):
            return
        position += item.total_size


def test_batch_that_does_not_fit_leaves_only_an_8_byte_blank(tmp_path):
    """AppendCallbackTest.testAppendMessageBatchEndOfFile: 1000 bytes left, a bigger batch."""
    log = CommitLog(tmp_path / "commitlog", 4096)
    filler = encode(topic="T", body=b"f" * (4096 - 1000 - 91 - 1), queue_id=0, born_timestamp=1,
                    born_host=BORN, store_host=STORE_HOST)
    log.append_batch(batch_of([filler]), 1)
    assert log.segments.files[0].space_left == 1000
    big = [encode(topic="T", body=b"b" * 200, queue_id=0, born_timestamp=1, born_host=BORN_V6, store_host=STORE_V6)
           for _ in range(10)]
    result = log.append_batch(batch_of(big), 2, atomic=True)
    first = log.segments.files[0]
    assert struct.unpack_from(">ii", first.map, 3096) == (1000, BLANK_MAGIC)
    assert first.map[3104:4096] == bytes(992)  # nothing beyond the 8 bytes was written
    assert result.physical_offsets == [4096 + 316 * k for k in range(10)]
    assert result.queue_offsets == list(range(1, 11))


def test_a_writer_batch_splits_at_record_boundaries(tmp_path):
    log = CommitLog(tmp_path / "commitlog", 4096)
    records = [encode(topic="T", body=b"b" * 931, queue_id=0, born_timestamp=1, born_host=BORN, store_host=STORE_HOST)
               for _ in range(6)]  # 1023 bytes each: a fourth would need 4092 + 8 spare > 4096
    result = log.append_batch(batch_of(records), 1)
    assert result.physical_offsets == [0, 1023, 2046, 4096, 5119, 6142]
    assert [r.position for r in log.iterate(check_crc=True)] == result.physical_offsets


def test_ipv6_batch_gives_56_char_msg_ids(tmp_path):
    log = CommitLog(tmp_path / "commitlog", 64 * 1024)
    records = [message(i, born=BORN_V6, store_host=STORE_V6, queues=1) for i in range(10)]
    result = log.append_batch(batch_of(records), 7)
    items = list(log.iterate())
    assert [len(r.msg_id) for r in items] == [56] * 10
    assert result.queue_offsets == list(range(10))
    assert all(r.sys_flag & 0x30 == 0x30 for r in items)


def test_record_larger_than_a_segment_is_refused(tmp_path):
    log = CommitLog(tmp_path / "commitlog", 4096)
    with pytest.raises(RecordTooLarge):
        log.append_batch(batch_of([message(1, size=5000)]), 1)


def test_prepared_and_rollback_do_not_advance_queue_offsets(tmp_path):
    log = CommitLog(tmp_path / "commitlog", 64 * 1024)
    records = [message(0, queues=1), message(1, queues=1, sys_flag=0x4), message(2, queues=1, sys_flag=0xC),
               message(3, queues=1, sys_flag=0x8)]
    assert log.append_batch(batch_of(records), 1).queue_offsets == [0, 0, 0, 1]


def test_readonly_reader_in_another_process_sees_appends(tmp_path):
    import subprocess
    import sys

    log = CommitLog(tmp_path / "commitlog", 64 * 1024)
    log.append_batch(batch_of([message(i) for i in range(300)]), 5)
    written = log.offset_written
    code = ("import sys; from shm.commitlog import CommitLog; "
            f"log = CommitLog(sys.argv[1], {64 * 1024}, readonly=True); "
            f"print(sum(1 for _ in log.iterate(0, limit={written}, check_crc=True)))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "commitlog")], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "300"


def test_records_placed_past_the_published_end_are_discarded(tmp_path):
    """A failed append or a killed writer leaves records past `written`: discard_after zeroes
    them, so new records that happen to end where a stale one began cannot revive it. Later
    segments stay in place (zeroed, not deleted): a reader that mapped them before the discard
    reads what the writer appends next through the same mapping."""
    from helpers import message


    log = CommitLog(tmp_path / "commitlog", 64 * 1024)
    first = EncodedBatch()
    for i in range(5):
        first.add(message(i, size=100))
    end = log.append_batch(first, 1795000000000).offset_written
    stale = EncodedBatch()
    for i in range(5, 400):  # rolls into a third segment
        stale.add(message(i, size=300))
    log.append_batch(stale, 1795000000001)
    assert len(log.segments.files) >= 3
    reader = CommitLog(tmp_path / "commitlog", 64 * 1024, readonly=True)  # maps every segment now
    names = sorted(p.name for p in (tmp_path / "commitlog").iterdir())
    zeroed = log.discard_after(end)
    assert zeroed >= log.segments.files[0].size - end
    assert not log.segments.files[0].map[end:].strip(b"\0")
    assert all(not f.map[:8192].strip(b"\0") for f in log.segments.files[1:])
    assert sorted(p.name for p in (tmp_path / "commitlog").iterdir()) == names
    log.segments.resume_at(end)
    assert sum(1 for _ in log.iterate(0)) == 5
    again = EncodedBatch()
    for i in range(5, 400):
        again.add(message(i, size=300))
    written = log.append_batch(again, 1795000000002).offset_written
    assert sum(1 for _ in reader.iterate(0, limit=written, check_crc=True)) == 400
    reader.close()


def test_a_reader_refresh_maps_a_segment_made_again_under_its_name(tmp_path):
    """Readers map a segment once. Should one ever be deleted and made again under its name,
    refresh() maps the new file (the dispatcher refreshes when it stalls below `written`)."""
    log = CommitLog(tmp_path / "commitlog", 64 * 1024)
    log.append_batch(batch_of([message(i) for i in range(10)]), 5)
    reader = CommitLog(tmp_path / "commitlog", 64 * 1024, readonly=True)
    old = reader.segments.files[0]
    log.segments.files[0].destroy()
    log.segments.files.clear()
    written = log.append_batch(batch_of([message(i) for i in range(20)]), 6).offset_written
    stale = list(reader.iterate(0, limit=written))  # the deleted file's pages: 10, then zeros
    assert sum(isinstance(r, Record) for r in stale) == 10 and not isinstance(stale[-1], Record)
    reader.segments.refresh()
    assert reader.segments.files[0] is not old
    assert sum(1 for _ in reader.iterate(0, limit=written, check_crc=True)) == 20
    reader.close()


def test_a_new_file_is_faulted_in_a_page_at_a_time(tmp_path):
    """The first entry written to a new file caches its page, not the read-around of holes
    (the whole 6 MB ConsumeQueue file on the project's machine, 2-13 ms); new IndexFiles too."""
    from shm.index_file import IndexFile

    queue_file = MappedFile(tmp_path / f"{0:020d}", 6_000_000, create=True)
    index = IndexFile(tmp_path / "20261123000000000", 5000, 20000, create=True)
    try:
        queue_file.write(0, b"q" * 20)
        index.map[40 + 4 * 4321: 40 + 4 * 4322] = b"\x00\x00\x00\x01"  # one hash slot
        assert cached_pages(queue_file.path, 0, 6_000_000 // 4096 * 4096) <= 2
        assert cached_pages(index.path, 0, index.size // 4096 * 4096) <= 2
    finally:
        queue_file.close()
        index.close()


def test_small_and_large_writes_land_alike_for_every_mapping(tmp_path):
    """Below PWRITE_FROM a write copies through the mapping, from it on through pwrite: the
    writer's own mapping and a reader's see the same bytes either way, up to the file's end."""
    from shm.mapped_file import PWRITE_FROM

    size = 4 * PWRITE_FROM
    path = tmp_path / f"{0:020d}"
    writer = MappedFile(path, size, create=True)
    reader = MappedFile(path, size, readonly=True)
    try:
        small, large = b"s" * (PWRITE_FROM - 1), bytes(range(256)) * (2 * PWRITE_FROM // 256) + b"!"
        tail = b"t" * (size - len(small) - len(large))
        writer.write(0, small)
        writer.write(len(small), memoryview(bytearray(large)))
        writer.write(len(small) + len(large), tail)
        assert len(tail) >= PWRITE_FROM  # the last write goes through pwrite and ends the file
        expected = small + large + tail
        assert writer.map[:] == expected and reader.map[:] == expected
        with pytest.raises(AssertionError):
            writer.write(size - 10, b"x" * PWRITE_FROM)  # never past the end, either way
        assert reader.map[:] == expected
    finally:
        reader.close()
        writer.close()
