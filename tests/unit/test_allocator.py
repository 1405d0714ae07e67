"""The allocator as a plain class (no Ray): the next segment made ahead of the writer, and the
pages past the written end read ahead of it (`prefaultAheadBytes`)."""

from __future__ import annotations

import contextlib
import mmap

import pytest

from helpers import cached_pages
from nodes import node_settings

from actors import allocator as allocator_module
from actors.allocator import IDLE_WATCH_MS, WATCH_MS, Allocator
from shm.commitlog import CommitLog
from shm.control_block import ControlBlock
from shm.mapped_file import AllocationFailed, allocate

MiB = 1024 * 1024
RECLAIMED = 8  # pages the kernel may take back meanwhile (clean page cache, under memory pressure)


def test_the_allocator_reads_ahead_of_the_writer_a_bounded_step_a_turn(tmp_path):
    settings = node_settings(tmp_path / "store", mappedFileSizeCommitLog=4 * MiB, prefaultAheadBytes=10 * MiB)
    settings.root.mkdir(parents=True)
    control = ControlBlock(settings.root / "control", create=True)
    log = CommitLog(settings.commitlog_dir, settings.mappedFileSizeCommitLog)
    log.segments.last_writable(0)
    written = 100_000
    control.set("written", written)
    allocator = Allocator(settings)
    allocator.start()
    try:
        reached = []
        for _ in range(5):
            allocator.turn()
            reached.append(allocator.statistics()["prefaultedTo"])
        # a step a turn; segment 2 is not made while the writer is in segment 0: it stops there
        assert reached == [written + 2 * MiB, written + 4 * MiB, written + 6 * MiB, 8 * MiB, 8 * MiB]
        assert allocator.statistics()["allocated"] == 1
        control.set("written", 4 * MiB + 10)  # into segment 1: segment 2 is made, segment 0 let go
        allocator.turn()
        assert allocator.statistics()["prefaultedTo"] == 10 * MiB
        assert set(allocator.mapped) == {4 * MiB, 8 * MiB}
        assert allocator.statistics()["prefaultedBytes"] >= 10 * MiB - written - 4096
        # what it read is in the page cache (the unmapping after each read keeps it there); the
        # kernel may reclaim a clean page or two between the read and this look when the machine
        # is short of memory (seen at the end of the whole suite: 1022 and 1023 of 1024)
        segment_1, segment_2 = (settings.commitlog_dir / name for name in ("00000000000004194304",
                                                                           "00000000000008388608"))
        assert cached_pages(segment_1, 0, 4 * MiB) >= 4 * MiB // mmap.PAGESIZE - RECLAIMED
        assert cached_pages(segment_2, 0, 2 * MiB) >= 2 * MiB // mmap.PAGESIZE - RECLAIMED
        # and nothing past it: a page a time, no read-around (which came in 8 MiB bites here)
        assert cached_pages(segment_2, 2 * MiB, 4 * MiB) == 0
    finally:
        allocator.close()
        log.close()
        control.close()


@contextlib.contextmanager
def allocator_of_an_empty_store(tmp_path, written: int, **overrides):
    """(allocator, control block, settings) over a store with no segment, `written` at `written`."""
    settings = node_settings(tmp_path / "store", **overrides)
    settings.root.mkdir(parents=True)
    control = ControlBlock(settings.root / "control", create=True)
    control.set("written", written)
    allocator = Allocator(settings)
    allocator.start()
    try:
        yield allocator, control, settings
    finally:
        allocator.close()
        control.close()


def test_prefault_off_reads_nothing(tmp_path):
    with allocator_of_an_empty_store(tmp_path, 100_000, prefaultAheadBytes=0) as (allocator, _, settings):
        allocator.turn()
        assert allocator.statistics()["prefaultedBytes"] == 0 and not allocator.mapped
        following = settings.commitlog_dir / "00000000000001048576"  # made, and left unread
        assert following.exists() and cached_pages(following, 0, MiB) == 0


def test_an_idle_allocator_looks_less_often_and_at_once_again_when_the_writer_moves(tmp_path):
    with allocator_of_an_empty_store(tmp_path, 100) as (allocator, control, _):
        waits = []
        for written in (100, 100, 100, 100, 100, 200, 200):
            control.set("written", written)
            allocator.turn()
            waits.append(allocator.watch_ms)
        assert waits == [WATCH_MS, 2 * WATCH_MS, IDLE_WATCH_MS, IDLE_WATCH_MS, IDLE_WATCH_MS, WATCH_MS, 2 * WATCH_MS]


def test_a_segment_the_full_disk_refused_is_never_skipped_over(tmp_path, monkeypatch):
    """At a segment's end `written` stands at the start of one not made yet: its allocation
    failing (a full disk), the allocator must not make the one after it, a gap no start gets past."""
    with allocator_of_an_empty_store(tmp_path, 2 * MiB, mappedFileSizeCommitLog=MiB,
                                     prefaultAheadBytes=0) as (allocator, _, settings):
        names = [f"{start:020d}" for start in (0, MiB, 2 * MiB, 3 * MiB)]
        for name in names[:2]:
            allocate(settings.commitlog_dir / name, MiB)
        real = allocator_module.allocate

        def full_for_segment_2(path, size, **kwargs):
            if path.name == names[2]:
                raise AllocationFailed(f"cannot allocate {size} bytes for {path}: No space left on device")
            return real(path, size, **kwargs)

        monkeypatch.setattr(allocator_module, "allocate", full_for_segment_2)
        allocator.turn()
        assert sorted(p.name for p in settings.commitlog_dir.iterdir()) == names[:2]
        assert allocator.statistics()["failures"] == 1
        monkeypatch.undo()
        allocator.retry_at = 0.0  # (its retry, a second later)
        allocator.turn()
        assert sorted(p.name for p in settings.commitlog_dir.iterdir()) == names


def test_the_writer_takes_the_allocators_segment_made_while_its_own_was_refused(tmp_path, monkeypatch):
    """The writer and the allocator both making the next segment on a disk with room for one:
    the writer's blocks refused while the allocator's file is linked into place, the writer maps
    that one (whole: linked only once all its blocks were given) instead of failing the send.
    With no file there, the refusal stands."""
    from shm import mapped_file

    log = CommitLog(tmp_path / "commitlog", MiB)
    real = mapped_file.allocate

    def the_allocator_wins(path, size, **kwargs):
        real(path, size)  # (the allocator's, in the meantime)
        raise AllocationFailed(f"cannot allocate {size} bytes for {path}: No space left on device")

    monkeypatch.setattr(mapped_file, "allocate", the_allocator_wins)
    first = log.segments.create(0)
    assert first.path.stat().st_size == MiB and first.offset_start == 0

    def refused(path, size, **kwargs):
        raise AllocationFailed(f"cannot allocate {size} bytes for {path}: No space left on device")

    monkeypatch.setattr(mapped_file, "allocate", refused)
    with pytest.raises(AllocationFailed):
        log.segments.create(MiB)
    assert not (tmp_path / "commitlog" / f"{MiB:020d}").exists()
    log.close()


def test_a_file_that_would_break_the_headroom_is_refused_before_it_takes_a_block(tmp_path, monkeypatch):
    """A segment refused for the headroom never took the disk's blocks in the meantime (the
    dispatcher's next ConsumeQueue or index file, made then, would have found no room)."""
    from shm import disk, mapped_file

    taken = []
    monkeypatch.setattr(mapped_file, "reserve", lambda fd, size, path, start=0: taken.append(size))
    free = disk.free_bytes(tmp_path)
    with pytest.raises(AllocationFailed, match="would leave less than"):
        allocate(tmp_path / f"{0:020d}", MiB, keep_free=free)
    assert taken == [] and list(tmp_path.iterdir()) == []
    assert allocate(tmp_path / f"{0:020d}", MiB, keep_free=MiB) and taken == [MiB]
