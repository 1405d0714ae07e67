"""The clean service's core on mock clocks and a mock disk: RocketMQ's DefaultMessageStoreCleanFilesTest
cases (time-up, space, forced, manual; 10 a pass, the first young segment ends a pass, never the
last), ConsumeQueue and index files following the min offset, and the disk-full flag. Days of
retention run in milliseconds."""

from __future__ import annotations

import os
import struct

import pytest
from helpers import small_settings

from actors.clean import DELETE_MAX_PER_PASS, CleanCore, delete_hours
from shm import archive_manifest
from shm.control_block import FLAG_DISK_FULL, ControlBlock

SEGMENT = 4096
HOUR_MS = 3600 * 1000
NOW_MS = 1_800_000_000_000


class Disk:
    """The mock disk's used ratio, and the mock clocks."""

    def __init__(self) -> None:
        self.used, self.wall, self.hour, self.monotonic = 0.5, NOW_MS, 12, 100.0
        self.free = 1 << 40

    def ratio(self, _path) -> float:
        return self.used

    def room(self, _path) -> int:
        return self.free


@pytest.fixture
def store(tmp_path):
    def make(segments=20, aged=15, **overrides):
        settings = small_settings(tmp_path / "store", runDir=str(tmp_path / "run"), mappedFileSizeCommitLog=SEGMENT,
                                  fileReservedTime=1.0, **overrides)
        settings.commitlog_dir.mkdir(parents=True, exist_ok=True)
        for i in range(segments):
            path = settings.commitlog_dir / f"{i * SEGMENT:020d}"
            path.write_bytes(bytes(SEGMENT))
            age_ms = 2 * HOUR_MS if i < aged else 0
            os.utime(path, ns=((NOW_MS - age_ms) * 1_000_000,) * 2)
        control = ControlBlock(settings.root / "control", create=True)
        end = segments * SEGMENT - 100
        control.publish_recovered(written=end, flushed=end, dispatched=end, min_offset=0)
        disk = Disk()
        core = CleanCore(settings, control, wall_ms=lambda: disk.wall, local_hour=lambda ms: disk.hour,
                         ratio=disk.ratio, room=disk.room)
        made.append(control)
        return core, control, disk, settings

    made: list = []
    yield make
    for control in made:
        control.close()


def _run(core, disk, seconds: float) -> None:
    """Run the core for `seconds` of mock time, waking when it asks to."""
    end = disk.monotonic + seconds
    while disk.monotonic < end:
        wait = core.step(disk.monotonic)
        disk.monotonic += max(wait, 0.001)


def _one_pass(core, disk) -> None:
    """Run the core until the pass it starts has ended."""
    passes = core.passes
    while core.passes == passes or core.running is not None:
        disk.monotonic += max(core.step(disk.monotonic), 0.001)


def _left(settings) -> list[int]:
    return sorted(int(p.name) for p in settings.commitlog_dir.iterdir())


def test_delete_when_parses_rocketmq_hours():
    assert delete_hours("04") == {4} and delete_hours("4; 16") == {4, 16}
    with pytest.raises(ValueError):
        delete_hours("24")


def test_time_up_deletes_the_aged_segments_ten_a_pass(store):
    core, control, disk, settings = store(deleteWhen="04")
    disk.hour = 4
    core.step(disk.monotonic)  # the first look: a pass starts
    _run(core, disk, 2.0)  # 10 deletions 100 ms apart, then the pass ends
    assert len(_left(settings)) == 10 and core.deleted_files["time"] == 10
    assert control.get("min_offset") == 10 * SEGMENT
    _run(core, disk, 10.0)  # the next pass, cleanResourceInterval later: the other 5 aged
    assert _left(settings)[0] == 15 * SEGMENT and core.deleted_files["time"] == 15
    _run(core, disk, 3600.0)  # an hour more: the young ones stay
    assert len(_left(settings)) == 5


def test_outside_delete_when_and_under_the_ratio_nothing_goes(store):
    core, _, disk, settings = store(deleteWhen="04")
    _run(core, disk, 24 * 3600.0)  # a day at hour 12 (the mock hour does not move)
    assert len(_left(settings)) == 20 and core.passes == 0


def test_space_deletes_only_aged_segments(store):
    core, _, disk, settings = store(deleteWhen="04", diskMaxUsedSpaceRatio=10)
    disk.used = 0.5  # over 10 %, under the forcible 85 %
    _run(core, disk, 30.0)
    assert len(_left(settings)) == 5 and core.deleted_files["space"] == 15


def test_over_the_forcible_ratio_age_is_ignored_but_the_last_segment_stays(store):
    core, control, disk, settings = store(aged=0)
    disk.used = 0.86
    _one_pass(core, disk)  # 10 deletions 100 ms apart
    assert len(_left(settings)) == 10 and core.deleted_files["forced"] == DELETE_MAX_PER_PASS
    _run(core, disk, 5.0)  # still over the ratio: the next pass follows at once
    assert _left(settings) == [19 * SEGMENT] and control.get("min_offset") == 19 * SEGMENT


def test_a_disk_without_room_for_another_segment_is_cleaned_at_once_whatever_its_ratio(store):
    """A small disk (or large segments): under every ratio's trigger, the log still cannot grow
    (a new segment must leave Settings.commitlog_headroom free)."""
    core, control, disk, settings = store(aged=0, deleteWhen="04")
    room = SEGMENT + settings.commitlog_headroom
    disk.used, disk.free = 0.5, room - 1
    _one_pass(core, disk)
    assert len(_left(settings)) == 10 and core.deleted_files["forced"] == DELETE_MAX_PER_PASS
    assert core.statistics()["segmentRoom"] is False
    disk.free = room  # room again: nothing more goes
    _run(core, disk, 5.0)
    assert len(_left(settings)) == 10 and core.statistics()["segmentRoom"] is True
    core, _, disk, settings = store(aged=0, deleteWhen="04", cleanFileForciblyEnable=False)
    disk.free = 0
    _run(core, disk, 5.0)
    assert len(_left(settings)) == 20  # (young, and forcing off: a space pass deletes by age only)


def test_forcing_can_be_switched_off(store):
    core, _, disk, settings = store(aged=0, cleanFileForciblyEnable=False)
    disk.used = 0.86
    _run(core, disk, 60.0)
    assert len(_left(settings)) == 20


def test_with_a_tiered_archive_only_archived_segments_go_however_full_the_disk(store, tmp_path):
    archive = tmp_path / "archive"
    core, control, disk, settings = store(aged=20, tieredArchiveDir=str(archive))
    disk.used = 0.95  # full: forced, age ignored, and still nothing the archive lacks goes
    _run(core, disk, 5.0)
    assert len(_left(settings)) == 20 and "tiered archive" in core.last_stop
    archive.mkdir()
    held = {f"{i * SEGMENT:020d}": {"size": SEGMENT, "crc": 0, "rows": 1, "crcErrors": 0, "files": []} for i in range(4)}
    held[f"{5 * SEGMENT:020d}"] = held[f"{4 * SEGMENT:020d}"] = {**held[f"{0:020d}"], "size": SEGMENT - 1}
    archive_manifest.write(archive, {"segments": held})
    _run(core, disk, 5.0)  # the first four; the fifth's archived size is not its size: a pass stops there
    assert _left(settings)[0] == 4 * SEGMENT and control.get("min_offset") == 4 * SEGMENT
    assert core.last_stop.startswith("the oldest segment is not yet in the tiered archive")


def test_nothing_past_the_flushed_or_dispatched_end_is_deleted(store):
    core, control, disk, settings = store(aged=20)
    control.set("dispatched", 3 * SEGMENT + 5)  # the dispatcher is behind
    disk.used = 0.86
    _run(core, disk, 30.0)
    assert _left(settings)[0] == 3 * SEGMENT


def test_the_disk_full_flag_is_set_over_the_warning_ratio_and_cleared_under_the_forcing_one(store):
    """RocketMQ's isSpaceToDelete: between diskSpaceCleanForciblyRatio and the warning level the
    flag stays as it was (set, it is not cleared at every look that finds the disk just under)."""
    core, control, disk, _ = store(aged=0)
    disk.used = 0.88
    core.step(disk.monotonic)
    assert not control.has_flag(FLAG_DISK_FULL) and core.clean_immediately
    disk.used = 0.91
    _run(core, disk, 11.0)
    assert control.has_flag(FLAG_DISK_FULL) and core.clean_immediately
    disk.used = 0.88
    _run(core, disk, 11.0)
    assert control.has_flag(FLAG_DISK_FULL) and core.clean_immediately
    disk.used = 0.85
    _run(core, disk, 11.0)
    assert not control.has_flag(FLAG_DISK_FULL)


def test_manual_clean_takes_expired_segments_in_passes_and_reports_them(store):
    core, _, disk, settings = store()
    core.request_manual(("client", 1, 7), force=False)
    _run(core, disk, 5.0)
    (done,) = core.finished
    assert len(done.deleted) == 15 and {d["cause"] for d in done.deleted} == {"manual"}
    assert done.deleted[0]["file"] == f"{0:020d}" and done.reply_to == ("client", 1, 7)
    assert len(_left(settings)) == 5


def test_manual_force_takes_everything_but_the_last(store):
    core, _, disk, settings = store(aged=0)
    core.request_manual(("client", 1, 7), force=True)
    _run(core, disk, 5.0)
    assert len(core.finished[0].deleted) == 19 and len(_left(settings)) == 1


def test_consume_queue_and_index_files_follow_the_min_offset(store):
    core, control, disk, settings = store(aged=12)
    queue = settings.consumequeue_dir / "T" / "0"
    queue.mkdir(parents=True)
    per_file = settings.mappedFileSizeConsumeQueue // 20
    for f in range(4):  # the last entry of file f points at segment 3f+2
        entries = b"".join(struct.pack(">qiq", (3 * f + 2) * SEGMENT + i, 10, 0) for i in range(per_file))
        (queue / f"{f * per_file * 20:020d}").write_bytes(entries)
    settings.index_dir.mkdir(parents=True, exist_ok=True)
    for f, end in enumerate((5 * SEGMENT, 9 * SEGMENT, 11 * SEGMENT, 30 * SEGMENT)):
        (settings.index_dir / f"{20240101000000000 + f}").write_bytes(struct.pack(">qqqqii", 0, 0, 0, end, 0, 0))
    disk.used = 0.86
    _one_pass(core, disk)  # 10 forced: the min offset is segment 10
    assert control.get("min_offset") == 10 * SEGMENT
    disk.used = 0.5  # no more passes
    _run(core, disk, 0.5)
    # CQ files 0..2 end in segments 2, 5, 8 (< 10): gone; file 3 is the last
    assert sorted(p.name for p in queue.iterdir()) == [f"{3 * per_file * 20:020d}"]
    assert len(list(settings.index_dir.iterdir())) == 2 and core.index_files_deleted == 2
    assert core.cq_files_deleted == 3


def test_a_disk_that_refuses_sends_or_soon_will_is_looked_at_again_within_a_fifth_of_a_second(store):
    """Sends wait on the look that finds no room for a new segment (the next one made, the writer
    needs the one after within a segment's worth of sends), and on the one after the cleaning, or
    the disk back under the forcing ratio: on a small disk at full speed a segment fills in
    seconds, so those looks come within TIGHT_CHECK_S, not cleanResourceInterval (10 s) later,
    from the moment the room falls under two segments' worth; on a roomy disk they stay 10 s apart."""
    from actors.clean import TIGHT_CHECK_S

    core, control, disk, settings = store(segments=2, aged=0, cleanResourceInterval=10_000)
    need = SEGMENT + settings.commitlog_headroom
    checks = core.checks
    _run(core, disk, 30.0)
    assert core.checks - checks <= 4  # (the first look at once, the next ones 10 s apart)
    for free in (2 * need - 1, 0):  # room for one more segment, then for none: the writer's sends refused
        disk.free = free
        _run(core, disk, 10.0)
        checks = core.checks
        _run(core, disk, 1.0)
        assert core.checks - checks >= int(1.0 / TIGHT_CHECK_S) - 1, free
    disk.free = 2 * need
    while not core.statistics()["segmentRoom"]:  # (the look that finds room, once a pass has ended)
        _run(core, disk, TIGHT_CHECK_S)
    checks = core.checks
    _run(core, disk, 30.0)
    assert core.checks - checks <= 4  # room for two: back to cleanResourceInterval (a look each 10 s)
    disk.used = 0.95  # over the warning level: the disk-full flag refuses sends
    _run(core, disk, 10.0)
    assert control.has_flag(FLAG_DISK_FULL)
    disk.used = 0.5
    _run(core, disk, 2 * TIGHT_CHECK_S)
    assert not control.has_flag(FLAG_DISK_FULL)  # taken again within a look or two
