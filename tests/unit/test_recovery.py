"""Recovery: the golden store in both modes, seeded corruption, and RocketMQ's testRecover."""

import random

import pytest
from golden import GOLDEN_SETTINGS, copy_store, manifest
from helpers import close_clean, message, open_store, put, small_settings

from shm import settings as settings_module
from shm import mapped_file
from shm.codec import Record
from shm.dispatch import reput
from shm.file_queue import SegmentGap
from shm.mapped_file import StoreError, WrongFileSize
from shm.recovery import recover
from shm.store import MessageStore
from shm.store_files import abort_path
from shm.verify import verify_store


def golden_settings(root):
    return settings_module.load(None, {**GOLDEN_SETTINGS, "storePathRootDir": str(root)})


@pytest.mark.parametrize("abnormal", [False, True])
def test_golden_store_recovers_to_rocketmqs_state(tmp_path, abnormal):
    root = copy_store(tmp_path)
    if abnormal:
        abort_path(root).touch()
    store = MessageStore(golden_settings(root))
    report = recover(store)
    m = manifest()
    assert report.mode == ("abnormal" if abnormal else "normal") and report.corruption is None
    assert store.commitlog.offset_written == m["maxPhyOffset"] == m["recoveryCheck"]["recoveredMaxPhyOffset"]
    expected_queues = m["recoveryCheck"]["queues"] if abnormal else m["queues"]
    for topic, queues in expected_queues.items():
        for queue_id, bounds in queues.items():
            queue = store.consume_queue(topic, int(queue_id), create=False)
            got = (queue.offset_min, queue.offset_max) if queue else (0, 0)
            assert got == (bounds["minOffset"], bounds["maxOffset"]), (topic, queue_id)
    for query in m["queries"]:
        assert store.index.query(query["topic"], query["key"], 64, 0, 2**62) == \
            query["indexServiceQueryOffset_phyOffsets_rawOrder"]
    for entry in m["readback"]:
        e = store.consume_queue(entry["topic"], entry["queueId"]).entry(entry["queueOffset"])
        assert (e.physical_offset, e.size, e.tags_code) == (entry["cqPhyOffset"], entry["cqSize"], entry["cqTagsCode"])
    assert store.commitlog.queue_offsets["TopicA-1"] == 151
    store.close()
    assert verify_store(golden_settings(root)).ok


def test_mqnode_appends_to_a_golden_store_and_it_still_verifies(tmp_path):
    root = copy_store(tmp_path)
    store = open_store(golden_settings(root))
    put(store, [message(i) for i in range(200)], store_timestamp=1795313400000)
    close_clean(store)
    report = verify_store(golden_settings(root))
    assert report.ok, report.summary()
    assert report.records == 623 + 200


def _filled_store(root, count=400):
    settings = small_settings(root)
    store = open_store(settings)
    offsets = []
    for start in range(0, count, 40):
        result = put(store, [message(i) for i in range(start, start + 40)], store_timestamp=1795000000000 + start)
        offsets += result.physical_offsets
    return settings, store, offsets


@pytest.mark.parametrize("seed", range(12))
def test_garbage_from_a_random_position_keeps_exactly_the_intact_prefix(tmp_path, seed):
    """Kafka LogSegmentTest style: overwrite from a random position, recover, only the records
    entirely before it survive; queues and index agree. Odd seeds stop cleanly (normal recovery),
    even seeds crash (abnormal recovery)."""
    rng = random.Random(seed)
    settings, store, offsets = _filled_store(tmp_path / "s")
    segment_size = settings.mappedFileSizeCommitLog
    sizes = {r.position: r.total_size for r in store.commitlog.iterate()}
    # bytes a reader looks at: every record, and the 8-byte blank header closing each full segment
    looked_at = [(o, o + sizes[o]) for o in offsets]
    looked_at += [(f.offset_start + _blank_at(f), f.offset_start + _blank_at(f) + 8) for f in store.commitlog.segments.files[:-1]]
    end = store.commitlog.offset_written
    close_clean(store) if seed % 2 else store.close()
    position = rng.randrange(0, end)
    garbage = bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 64)))
    with open(settings.commitlog_dir / f"{position - position % segment_size:020d}", "r+b") as f:
        f.seek(position % segment_size)
        original = f.read(len(garbage))
        f.seek(position % segment_size)
        f.write(garbage)
    damaged = any(a <= position + i < b for a, b in looked_at for i, (x, y) in enumerate(zip(garbage, original, strict=True)) if x != y)
    store = MessageStore(settings)
    report = recover(store)
    recovered = [r.position for r in store.commitlog.iterate(check_crc=True)]
    queued = {e.physical_offset for q in store.consume_queues.values() for e in q.entries(q.offset_min)}
    store.close()
    if not damaged:  # the garbage fell in blank padding nobody reads: nothing is lost
        assert recovered == offsets and report.corruption is None
        assert verify_store(settings).ok
    elif position >= report.walk_start:
        survivors = [o for o in offsets if o + sizes[o] <= position]
        assert recovered == survivors, (position, report.summary())
        assert report.corruption is not None
        assert queued <= set(survivors)
        assert verify_store(settings).ok
    else:
        # Before the last three segments, which a normal recovery checks (as RocketMQ does):
        # recovery keeps the log as it is and `verify` names the damage.
        assert report.corruption is None
        assert not verify_store(settings).ok


def _overwrite(settings, offset: int, data: bytes) -> None:
    segment_size = settings.mappedFileSizeCommitLog
    with open(settings.commitlog_dir / f"{offset - offset % segment_size:020d}", "r+b") as f:
        f.seek(offset % segment_size)
        f.write(data)


def test_damage_before_the_normally_recovered_segments_is_kept_and_verify_names_it(tmp_path):
    settings, store, offsets = _filled_store(tmp_path / "s", count=600)
    assert len(store.commitlog.segments.files) > 3
    close_clean(store)
    _overwrite(settings, offsets[2] + 100, b"\xee" * 16)  # inside a body in the first segment
    store = MessageStore(settings)
    report = recover(store)
    assert report.walk_start > offsets[2] and report.corruption is None
    assert [r.position for r in store.commitlog.iterate()] == offsets
    store.close()
    result = verify_store(settings)
    assert not result.ok and f"crc mismatch at offset {offsets[2]}" in result.summary()


def test_garbage_in_blank_padding_loses_nothing(tmp_path):
    settings, store, offsets = _filled_store(tmp_path / "s")
    first = store.commitlog.segments.files[0]
    padding = first.offset_start + _blank_at(first) + 8
    assert padding < first.offset_end
    close_clean(store)
    _overwrite(settings, padding, b"\xee" * (first.offset_end - padding))
    store = MessageStore(settings)
    report = recover(store, clean=False)  # abnormal: walks every segment
    assert report.corruption is None
    assert [r.position for r in store.commitlog.iterate(check_crc=True)] == offsets
    store.close()
    assert verify_store(settings).ok


def _blank_at(segment) -> int:
    from shm.codec import scan

    return scan(segment.map, 0, segment.size, check_crc=False).end


def test_rocketmq_test_recover_scenario(tmp_path):
    """testRecover: clean restart keeps everything; a corrupted last record rolls back, in both modes."""
    settings = small_settings(tmp_path / "s", mappedFileSizeCommitLog=1024 * 1024)
    store = open_store(settings)
    put(store, [message(i, queues=1) for i in range(100)])
    written, queue_max = store.commitlog.offset_written, store.consume_queue("TopicA", 0).offset_max
    close_clean(store)
    store = open_store(settings)
    assert (store.commitlog.offset_written, store.consume_queue("TopicA", 0).offset_max) == (written, queue_max)
    for abnormal in (False, True):
        put(store, [message(i, queues=1) for i in range(100)])
        written, queue_max = store.commitlog.offset_written, store.consume_queue("TopicA", 0).offset_max
        last = put(store, [message(1000, queues=1)]).physical_offsets[0]
        record = store.commitlog.read(last)
        topic_length_at = last + record.total_size - 2 - len(record.properties_string.encode()) - len(record.topic) - 1
        close_clean(store)
        with open(settings.commitlog_dir / f"{0:020d}", "r+b") as f:
            f.seek(topic_length_at)
            f.write(bytes(16))
        if abnormal:
            abort_path(settings.root).touch()
        store = open_store(settings)
        assert store.report.mode == ("abnormal" if abnormal else "normal")
        assert store.commitlog.offset_written == written
        assert store.consume_queue("TopicA", 0).offset_max == queue_max
    put(store, [message(i, queues=1) for i in range(100)])
    close_clean(store)
    assert verify_store(settings).ok


def test_crash_with_the_dispatcher_behind_completes_queues_and_index(tmp_path):
    settings = small_settings(tmp_path / "s")
    store = open_store(settings)
    put(store, [message(i) for i in range(100)])
    put(store, [message(i) for i in range(100, 300)], dispatch=False)  # appended, never dispatched
    store.close()  # a crash: abort file stays
    store = open_store(settings)
    assert store.report.records_dispatched >= 200
    assert sum(q.offset_max for q in store.consume_queues.values()) == 300
    store.close()
    assert verify_store(settings).ok


def test_a_full_disk_stops_recoverys_dispatch_not_the_start_and_no_queue_offset_is_given_twice(tmp_path, monkeypatch):
    """Records of a new topic stored, not dispatched, then no room for its ConsumeQueue files:
    recovery says from where the queues may lack records, the queue-offset table counts them from
    the records, and a dispatch from there once there is room completes the store."""
    settings = small_settings(tmp_path / "s", messageIndexEnable=False)
    store = open_store(settings)
    put(store, [message(i) for i in range(100)])
    put(store, [message(i, topic="NewTopic") for i in range(40)], dispatch=False)
    store.close()  # a crash: abort file stays
    real = mapped_file.allocate

    def no_room(path, size, **kwargs):
        if "NewTopic" in str(path):
            raise mapped_file.AllocationFailed(f"cannot allocate {size} bytes for {path}: No space left on device")
        return real(path, size, **kwargs)

    monkeypatch.setattr(mapped_file, "allocate", no_room)
    store = open_store(settings)
    blocked = store.report.dispatch_blocked
    assert blocked is not None and "No space left" in store.report.dispatch_error and "dispatch stopped" in store.report.summary()
    assert store.commitlog.queue_offsets == {**{f"TopicA-{q}": 25 for q in range(4)}, **{f"NewTopic-{q}": 10 for q in range(4)}}
    monkeypatch.undo()
    reput(store, blocked)  # (the dispatcher, once there is room)
    store.close()
    assert verify_store(settings).ok


@pytest.mark.parametrize("index_max", range(6, 14))
def test_a_crash_keeps_every_key_of_a_record_whose_keys_straddle_two_index_files(tmp_path, index_max):
    """Small index files fill between two keys of one record (message(i) has up to three). A
    crash then deletes the files newer than the checkpoint, the full one's follower among them:
    recovery must index the rest of that record's keys, not start after it."""
    settings = small_settings(tmp_path / "s", maxIndexNum=index_max)
    store = open_store(settings)
    files = store.index.files
    for i in range(200):
        put(store, [message(i)], store_timestamp=1795000000000 + i * 1000)
        if len(files) > 1 and files[-1].begin_phy_offset == files[-2].end_phy_offset and files[-1].index_count > 1:
            break  # the newest file goes on with the record that filled the one before
    else:
        raise AssertionError("no record's keys straddled two index files")
    put(store, [message(i) for i in (199, 200)], store_timestamp=1795000000000 + 200 * 1000)  # (newer keys)
    doomed = files[-1].path.name
    store.close()  # a crash: abort file stays
    store = open_store(settings)
    assert store.report.mode == "abnormal" and doomed in store.report.deleted_index_files
    store.close()
    report = verify_store(settings)
    assert report.ok, report.faults


def test_damaged_derived_files_are_rebuilt(tmp_path):
    settings, store, offsets = _filled_store(tmp_path / "s")
    close_clean(store)
    queue_file = settings.consumequeue_dir / "TopicA" / "1" / f"{0:020d}"
    with open(queue_file, "r+b") as f:
        f.truncate(1000)  # a truncated ConsumeQueue file
    garbage = settings.consumequeue_dir / "TopicA" / "2" / f"{0:020d}"
    with open(garbage, "r+b") as f:
        f.seek(200)
        f.write(b"\xff" * 20)  # an invalid entry in the middle
    store = open_store(settings)
    assert store.report.damaged_queues and store.report.queue_entries_dropped
    close_clean(store)
    report = verify_store(settings)
    assert report.ok, report.summary()
    assert report.queue_entries == 400


def test_store_level_damage_is_a_named_error(tmp_path):
    settings, store, offsets = _filled_store(tmp_path / "s", count=600)
    close_clean(store)
    segments = sorted(settings.commitlog_dir.iterdir())
    assert len(segments) >= 4
    segments[1].rename(tmp_path / "moved")
    with pytest.raises(SegmentGap, match=segments[1].name):
        MessageStore(settings)
    (tmp_path / "moved").rename(segments[1])
    with open(segments[-1], "r+b") as f:
        f.truncate(1000)
    with pytest.raises(WrongFileSize, match="1000 bytes") as refused:
        MessageStore(settings)
    assert "made with" not in str(refused.value)  # (one file cut short: a damaged store, not another size)


def test_a_store_made_with_another_segment_size_is_refused_naming_it(tmp_path):
    """A node started with --mappedFileSizeCommitLog, then `verify` or a start without it: the
    refusal names the size the store was made with, and the store opens with it."""
    settings, store, _ = _filled_store(tmp_path / "s", count=600)
    close_clean(store)
    made = settings.mappedFileSizeCommitLog
    other = small_settings(tmp_path / "s", mappedFileSizeCommitLog=made * 2)
    with pytest.raises(WrongFileSize) as refused:
        MessageStore(other, readonly=True)
    assert f"made with mappedFileSizeCommitLog = {made} (give --mappedFileSizeCommitLog {made}" in str(refused.value)
    assert verify_store(settings).faults == []


def test_never_written_segments_after_a_missing_one_are_deleted_and_named(tmp_path):
    """A full disk refused the segment after the last written one, and the allocator before
    13a59b7 made the one after it anyway: a gap followed by blank segments. The start deletes
    those, says so, and the store goes on from its end; a gap with records after it still stops."""
    settings, store, offsets = _filled_store(tmp_path / "s", count=600)
    size = settings.mappedFileSizeCommitLog
    last = store.commitlog.segments.files[-1].offset_start
    close_clean(store)
    for start in (last + 2 * size, last + 3 * size):
        mapped_file.allocate(settings.commitlog_dir / f"{start:020d}", size)
    store = open_store(settings)
    assert store.report.blank_after_gap == [f"{last + 2 * size:020d}", f"{last + 3 * size:020d}"]
    assert "after a missing one" in store.report.summary()
    put(store, [message(i) for i in range(600, 700)], store_timestamp=1795000009000)
    close_clean(store)
    report = verify_store(settings)
    assert report.ok, report.summary()
    assert report.records == 700


def test_progress_and_phase_timings_are_reported(tmp_path):
    from shm.recovery import Recovery

    settings, store, _ = _filled_store(tmp_path / "s")
    store.close()
    store = MessageStore(settings)
    recovery = Recovery(store)
    report = recovery.run()
    assert recovery.progress.phase == "done"
    assert set(report.phases_ms) == {"load", "consume_queues", "commitlog", "dispatch", "offsets"}
    assert "recovery (abnormal)" in report.summary()
    store.close()


def test_empty_store_opens(tmp_path):
    store = open_store(small_settings(tmp_path / "s"))
    assert store.commitlog.offset_written == 0
    result = put(store, [message(0)])
    assert result.physical_offsets == [0]
    assert isinstance(store.commitlog.read(0), Record)
    close_clean(store)


def test_a_crash_rebuilds_the_index_below_the_segment_the_walk_starts_at(tmp_path):
    """An unclean stop deletes the index files newer than the checkpoint's index time (the last
    file that filled), which can end segments before the one the walk starts at (chosen by the
    CommitLog and ConsumeQueue times). The keys between must be indexed again, and before the
    walk's: once the walk has indexed newer records, the index's end is past the gap."""
    settings = small_settings(tmp_path / "s", maxIndexNum=100)
    store = open_store(settings)
    stamp = 1795000000000
    for start in range(0, 1200, 20):
        put(store, [message(i) for i in range(start, start + 20)], store_timestamp=stamp + start * 1000)
    segments, files = store.commitlog.segments.files, store.index.files
    assert len(segments) >= 4 and len(files) >= 10
    walk_from = segments[-1]
    first = next(r for r in store.commitlog.iterate() if r.position >= walk_from.offset_start)
    store.checkpoint.physic_timestamp = store.checkpoint.logics_timestamp = first.store_timestamp + 60_000
    store.checkpoint.index_timestamp = files[2].end_timestamp  # the time of an early file's filling
    store.checkpoint.write()
    store.close()  # a crash: abort file stays
    store = open_store(settings)
    report = store.report
    assert report.mode == "abnormal" and len(report.deleted_index_files) >= 7
    assert report.walk_start == walk_from.offset_start
    store.close()
    report = verify_store(settings)
    assert report.ok, report.faults


def test_a_deleted_topics_queues_go_once_their_messages_do_and_their_numbering_is_kept(tmp_path):
    """MessageStore.drop_queues_of, recovery's: a queue of a deleted topic whose every record lies
    below the CommitLog's min offset goes (its file, and the mapping every process kept); its next
    queue offset is kept, so the topic sent to again never numbers two messages alike."""
    settings = small_settings(tmp_path)
    store = open_store(settings)
    put(store, [message(i, topic="Gone", queues=2) for i in range(6)])
    put(store, [message(i, topic="Live", queues=2, size=4000) for i in range(40)])  # past the first segment
    assert store.commitlog.queue_offsets["Gone-1"] == 3
    close_clean(store)
    first = sorted(settings.commitlog_dir.iterdir())[0]
    first.unlink()  # as the clean service deletes an aged segment
    gone = lambda topic: 0 if topic == "Gone" else None  # noqa: E731 (actors.topics.deleted_topics: no floor kept)

    store = open_store(settings)
    assert sorted(store.drop_queues_of(gone)) == ["Gone/0", "Gone/1"]
    assert not (settings.consumequeue_dir / "Gone").exists() and store.drop_queues_of(gone) == []
    store.rebuild_queue_offsets()
    assert store.commitlog.queue_offsets["Gone-1"] == 3  # numbered on from where it was
    put(store, [message(7, topic="Gone", queues=2)])  # sent to again: a queue of it anew, from offset 3
    close_clean(store)

    store = open_store(settings)
    assert store.drop_queues_of(lambda topic: None) == [] and store.consume_queue("Gone", 1, create=False).offset_max == 4
    store.rebuild_queue_offsets()
    assert store.commitlog.queue_offsets["Gone-1"] == 4 and store.commitlog.queue_offsets["Gone-0"] == 3
    close_clean(store)
    (settings.consumequeue_dir / ".dropped-queue-offsets").write_text("{torn")
    with pytest.raises(StoreError, match="dropped-queue-offsets is not the JSON"):
        open_store(settings).rebuild_queue_offsets()


def test_a_deleted_topics_queues_go_at_once_below_its_deletion_floor_not_a_later_message(tmp_path):
    """MessageStore.drop_queues_of with a deletion floor (the CommitLog's end when the topic was
    deleted: actors.topics.TopicTable.delete): its queues go while every message is still stored;
    a queue with an entry at or past the floor (sent to after the deletion) stays."""
    settings = small_settings(tmp_path)
    store = open_store(settings)
    put(store, [message(i, topic="Gone", queues=2) for i in range(4)])
    floor = store.commitlog.offset_written  # deleted here
    put(store, [message(9, topic="Gone", queues=2)])  # queue 1 sent to since (a topic made again, deleted again)
    before = lambda topic: floor if topic == "Gone" else None  # noqa: E731
    assert store.drop_queues_of(before) == ["Gone/0"]
    assert not (settings.consumequeue_dir / "Gone" / "0").exists() and (settings.consumequeue_dir / "Gone" / "1").is_dir()
    assert store.dropped_offsets() == {"Gone-0": 2}
    end = store.commitlog.offset_written
    assert store.drop_queues_of(lambda topic: end if topic == "Gone" else None) == ["Gone/1"]
    assert store.dropped_offsets() == {"Gone-0": 2, "Gone-1": 3}
    close_clean(store)

