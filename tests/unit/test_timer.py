"""Timer messages without a node: the timer log on real files (the intact prefix kept after a
torn write, wholly delivered files deleted) and the wheel on a mock clock (hours of timers in
milliseconds: never early, slot by slot, a restart re-delivers what was in flight and loses
nothing), plus seeded crashes that replay."""

from __future__ import annotations

import errno
import os
import random

import pytest

from actors.schedule import PERMANENT
from actors.timer import RECALL_GRACE_MS, RECALLED, RETRY_MS, Recalls, TimerCore
from shm import timer_log
from shm.mapped_file import AllocationFailed
from shm.timer_log import ENTRY_SIZE, TimerLog, TimerLogCorrupt

HOUR = 3_600_000
T0 = 1_700_000_000_000  # epoch ms: the mock clock's start


def open_log(path, durable_end: int = 0, per_file: int = 64) -> TimerLog:
    log = TimerLog(path, entries_per_file=per_file)
    log.open(durable_end)
    return log


def open_core(path, delivered_ms: int = T0, durable_end: int = 0, per_file: int = 64) -> TimerCore:
    core = TimerCore(open_log(path, durable_end, per_file), delivered_ms, PERMANENT)
    core.rebuild()
    return core


def deliver_all(core: TimerCore, now_ms: int, room: int = 10_000) -> list[int]:
    """Hand out what is due at `now_ms` and answer every re-put PUT_OK; the phys delivered."""
    out = []
    for _ in range(10_000):
        due = core.due(now_ms, room)
        if not due:
            return out
        for index, phy, _ in due:
            out.append(phy)
            core.stored(index, "PUT_OK", now_ms)
    raise AssertionError("the wheel never ran dry")


def test_the_log_keeps_exactly_the_intact_prefix_after_a_torn_entry(tmp_path):
    log = open_log(tmp_path)
    for i in range(10):
        log.append(T0 + i, T0 + i, 1000 + i, i - 1, i, 100)
    durable = log.flush()
    for i in range(10, 20):
        log.append(T0 + i, T0 + i, 1000 + i, i - 1, i, 100)
    log.close()
    path = tmp_path / f"{0:020d}"
    raw = bytearray(path.read_bytes())
    raw[15 * ENTRY_SIZE + 17] ^= 0xFF  # entry 15 torn: its CRC no longer holds
    path.write_bytes(bytes(raw))
    log = open_log(tmp_path, durable)
    assert log.end == 15  # the flushed 10 plus the intact 10..14, nothing after the torn one
    assert [log.entry(i)[2] for i in range(15)] == [1000 + i for i in range(15)]
    log.close()


def test_a_new_log_file_has_its_blocks_and_a_full_disk_refuses_it_changing_nothing(tmp_path, monkeypatch):
    """A file mapped sparse would take a SIGBUS at the first store into it on a full disk."""
    core = open_core(tmp_path, per_file=4)
    for i in range(4):
        core.add(T0 + 1000, 100 + i, 10, i)
    assert os.stat(tmp_path / f"{0:020d}").st_blocks * 512 >= 4 * ENTRY_SIZE  # (allocated, not a hole)

    def no_room(path, size):
        raise AllocationFailed(f"cannot allocate {size} bytes for {path}: No space left on device")

    monkeypatch.setattr(timer_log, "allocate", no_room)
    before = (core.pending, core.late_adds, core.log.end, dict(core.wheel))
    with pytest.raises(AllocationFailed):
        core.add(T0 + 1000, 104, 10, 4)
    assert (core.pending, core.late_adds, core.log.end, dict(core.wheel)) == before
    monkeypatch.undo()
    core.add(T0 + 1000, 104, 10, 4)
    assert sorted(deliver_all(core, T0 + 1000)) == [100, 101, 102, 103, 104]


def test_a_sparse_file_of_the_old_code_gets_its_blocks_before_an_append(tmp_path, monkeypatch):
    """Timer log files were made by ftruncate before 738d043: holes, a SIGBUS at a store into
    one on a full disk. Opened, they get their blocks; a full disk then defers it to the first
    append into the file, which is refused (AllocationFailed) changing nothing."""
    per_file = 1024  # 48 KiB: holes of whole pages
    log = open_log(tmp_path, per_file=per_file)
    for i in range(10):
        log.append(T0 + i, T0 + i, 1000 + i, i - 1, i, 100)
    durable = log.flush()
    log.close()
    path = tmp_path / f"{0:020d}"
    raw = path.read_bytes()
    path.unlink()
    with open(path, "wb") as f:  # as the old code made it: a sparse file, its entries written
        f.truncate(per_file * ENTRY_SIZE)
        f.write(raw[: 10 * ENTRY_SIZE])
    assert os.stat(path).st_blocks * 512 < per_file * ENTRY_SIZE

    def no_room(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_room)
    log = open_log(tmp_path, durable, per_file=per_file)
    assert log.end == 10 and log.statistics()["sparse_files"] == 1
    with pytest.raises(AllocationFailed, match="No space left"):
        log.append(T0 + 10, T0 + 10, 1010, 9, 10, 100)
    assert log.end == 10
    monkeypatch.undo()
    assert log.append(T0 + 10, T0 + 10, 1010, 9, 10, 100) == 10
    assert os.stat(path).st_blocks * 512 >= per_file * ENTRY_SIZE and log.statistics()["sparse_files"] == 0
    log.close()
    path.unlink()
    with open(path, "wb") as f:
        f.truncate(per_file * ENTRY_SIZE)
        f.write(raw[: 10 * ENTRY_SIZE])
    log = open_log(tmp_path, durable, per_file=per_file)  # room: the blocks at open
    assert os.stat(path).st_blocks * 512 >= per_file * ENTRY_SIZE and log.statistics()["sparse_files"] == 0
    assert [log.entry(i)[2] for i in range(10)] == [1000 + i for i in range(10)]
    log.close()


def test_a_checkpoint_beyond_the_files_is_refused(tmp_path):
    log = open_log(tmp_path)
    log.append(T0, T0, 1, -1, 0, 10)
    log.flush()
    log.close()
    with pytest.raises(TimerLogCorrupt):
        open_log(tmp_path, durable_end=65)


def test_timers_are_never_early_and_go_slot_by_slot(tmp_path):
    core = open_core(tmp_path)
    rng = random.Random(7)
    due_times = [T0 + rng.randrange(1, 10 * HOUR // 1000) * 1000 for _ in range(500)]  # 10 hours, 1 s slots
    for phy, due in enumerate(due_times):
        core.add(due, phy, 100, phy)
    assert core.pending == 500
    delivered: list[tuple[int, int]] = []
    now = T0
    while core.pending:
        now += 60_000  # a minute a step: hours of timers in a few hundred steps
        for phy in deliver_all(core, now):
            assert due_times[phy] <= now  # never early
            delivered.append((due_times[phy], phy))
    assert sorted(p for _, p in delivered) == list(range(500))  # each once
    assert [d for d, _ in delivered] == sorted(d for d, _ in delivered)  # slot by slot
    assert core.delivered_ms == max(due_times)


def test_a_timer_taken_in_after_its_slot_fired_goes_at_once(tmp_path):
    core = open_core(tmp_path)
    core.add(T0 + 5000, 1, 10, 0)
    assert deliver_all(core, T0 + 5000) == [1]
    core.add(T0 + 4000, 2, 10, 1)  # due already, its slot long past
    assert core.late_adds == 1
    assert deliver_all(core, T0 + 5001) == [2]


def test_a_failed_reput_goes_again_and_the_next_slot_waits_for_it(tmp_path):
    core = open_core(tmp_path)
    core.add(T0 + 1000, 1, 10, 0)
    core.add(T0 + 2000, 2, 10, 1)
    (index, phy, _), = core.due(T0 + 3000, 10)
    core.stored(index, "SYSTEM_BUSY", T0 + 3000)
    assert core.due(T0 + 3000, 10) == []  # slot 2 waits for slot 1
    assert core.due(T0 + 3000 + RETRY_MS, 10) == [(index, phy, 10)]
    core.stored(index, "PUT_OK", T0 + 3100)
    assert deliver_all(core, T0 + 3100) == [2]
    assert core.delivered == 2 and core.pending == 0


def test_a_restart_redelivers_the_slot_in_flight_and_loses_nothing(tmp_path):
    core = open_core(tmp_path)
    for phy in range(30):
        core.add(T0 + 1000 * (1 + phy // 10), phy, 10, phy)  # three slots of ten
    durable = core.log.flush()
    assert sorted(deliver_all(core, T0 + 1000)) == list(range(10))
    handed = core.due(T0 + 2000, 4)  # slot 2: four of ten out when the process dies
    for index, _, _ in handed[:2]:
        core.stored(index, "PUT_OK", T0 + 2000)
    checkpoint = (core.delivered_ms, durable)
    core.log.close()
    core = open_core(tmp_path, *checkpoint)
    assert core.pending == 20  # slot 2 whole again (two may arrive twice), slot 3 untouched
    assert sorted(deliver_all(core, T0 + 5000)) == list(range(10, 30))


def test_wholly_delivered_files_are_deleted_and_a_restart_rebuilds_from_the_rest(tmp_path):
    core = open_core(tmp_path, per_file=8)
    for phy in range(40):
        core.add(T0 + 1000 * (1 + phy), phy, 10, phy)  # five files of eight
    deliver_all(core, T0 + 20_000)
    assert core.log.delete_before(core.delivered_ms) == 2  # entries 0..15 all delivered
    durable = core.log.flush()
    delivered = core.delivered_ms
    core.log.close()
    core = open_core(tmp_path, delivered, durable, per_file=8)
    assert core.pending == 20 and core.log.start == 16
    assert deliver_all(core, T0 + 60_000) == list(range(20, 40))


@pytest.mark.parametrize("seed", range(8))
def test_seeded_crashes_never_lose_a_timer_nor_deliver_one_early(tmp_path, seed):
    """A run of adds, deliveries, failed answers, checkpoints and crashes (the process gone:
    whatever was not checkpointed is forgotten) chosen by `seed`, so a failure replays."""
    rng = random.Random(seed)
    core = open_core(tmp_path, per_file=16)
    checkpoint = (core.delivered_ms, 0, 0)  # (delivered_ms, log end, taken)
    queue: list[int] = []  # the timer topic's queue: due ms per offset
    taken = 0
    now = T0
    delivered: dict[int, int] = {}
    for _ in range(400):
        now += rng.randrange(0, 3000)
        for _ in range(rng.randrange(0, 4)):
            queue.append(now + rng.randrange(-2000, 20_000))
        while taken < len(queue):  # the shell takes new queue entries in
            core.add(max(queue[taken], T0 + 1), taken, 10, taken)
            taken += 1
        for index, phy, _ in core.due(now, rng.randrange(1, 6)):
            status = rng.choice(["PUT_OK", "PUT_OK", "PUT_OK", "SYSTEM_BUSY"])
            if status == "PUT_OK":
                assert queue[phy] <= now
                delivered[phy] = delivered.get(phy, 0) + 1
            core.stored(index, status, now)
        if rng.random() < 0.2:
            checkpoint = (core.delivered_ms, core.log.flush(), taken)
            core.log.delete_before(core.delivered_ms)
        if rng.random() < 0.05:  # crash: restart from the checkpoint; the log's intact tail counts
            core.log.close()
            core = open_core(tmp_path, checkpoint[0], checkpoint[1], per_file=16)
            taken = max(checkpoint[2], core.log.entry(core.log.end - 1)[4] + 1 if core.log.end > core.log.start else 0)
    now += 60_000
    while taken < len(queue):
        core.add(queue[taken], taken, 10, taken)
        taken += 1
    for phy in deliver_all(core, now):
        delivered[phy] = delivered.get(phy, 0) + 1
    assert sorted(delivered) == list(range(len(queue)))  # every timer at least once
    assert core.pending == 0


def test_a_slots_timers_go_in_the_order_they_were_taken_in(tmp_path, monkeypatch):
    """Oldest first within a slot (those rounded up the most wait the least), also for a slot
    larger than one read of its chain."""
    import actors.timer

    monkeypatch.setattr(actors.timer, "CHAIN_READ", 7)
    core = open_core(tmp_path)
    for phy in range(20):
        core.add(T0 + 1000, phy, 10, phy)
    order = deliver_all(core, T0 + 1000, room=3)
    assert sorted(order) == list(range(20))
    chunks = [order[:7], order[7:14], order[14:]]  # newest chunk first, each oldest first
    assert chunks == [list(range(13, 20)), list(range(6, 13)), list(range(0, 6))]


@pytest.mark.parametrize("precision, ok", [(10, True), (30, True), (1000, True), (5, False), (2000, False)])
def test_timer_precision_is_checked_at_start(precision, ok):
    from shm import settings as settings_module

    values = {"storePathRootDir": "/nonexistent", "timerPrecisionMs": precision}
    if ok:
        assert settings_module.load(None, values).timerPrecisionMs == precision
    else:
        with pytest.raises(settings_module.SettingsError, match="timerPrecisionMs"):
            settings_module.load(None, values)


def test_a_recalled_entry_is_done_without_a_reput_and_counted_apart(tmp_path):
    core = open_core(tmp_path)
    core.add(T0 + 1000, 1, 10, 0)
    core.add(T0 + 1000, 2, 10, 1)
    core.add(T0 + 2000, 3, 10, 2)
    first, second = core.due(T0 + 1000, 10)
    core.stored(first[0], RECALLED, T0 + 1000)  # (never tried again, as a failed re-put would be)
    core.stored(second[0], "PUT_OK", T0 + 1000)
    assert deliver_all(core, T0 + 2000) == [3]
    assert (core.delivered, core.recalled, core.dropped, core.pending) == (2, 1, 0, 0)
    assert core.statistics(T0 + 2000)["recalled"] == 1


def test_recalls_cancel_their_topics_message_until_forgotten_and_stay_bounded(monkeypatch):
    import actors.timer as timer

    recall = {"REAL_TOPIC": "T", "TIMER_DEL_UNIQKEY": "ID1", "TIMER_OUT_MS": str(T0 + 1000)}
    key = Recalls.key_of_recall(recall)
    assert key == "T+ID1" and Recalls.key_of_recall({"REAL_TOPIC": "T", "UNIQ_KEY": "ID1"}) is None
    recalls = Recalls()
    recalls.add(key, T0 + 1000)
    assert recalls.cancels({"REAL_TOPIC": "T", "UNIQ_KEY": "ID1"})
    assert not recalls.cancels({"REAL_TOPIC": "U", "UNIQ_KEY": "ID1"})  # another topic's message of that id
    assert not recalls.cancels({"REAL_TOPIC": "T", "UNIQ_KEY": "ID2"})
    again = Recalls(recalls.snapshot())  # (through the checkpoint)
    again.prune(T0 + 1000 + RECALL_GRACE_MS)
    assert again.cancels({"REAL_TOPIC": "T", "UNIQ_KEY": "ID1"})
    again.prune(T0 + 1001 + RECALL_GRACE_MS)
    assert not again.keys
    monkeypatch.setattr(timer, "RECALLS_MAX", 2)
    for i in range(3):
        again.add(f"T+{i}", T0)
    assert len(again.keys) == 2 and again.statistics()["full"] == 1


def test_a_recall_is_a_timer_of_its_messages_time_and_refused_once_that_time_has_come():
    from actors.delays import Delays
    from shm.codec import TIMER_TOPIC, MessageIllegal
    from shm.settings import Settings

    delays = Delays(Settings(), clock=lambda: T0 / 1000)
    recall = {"TIMER_DELIVER_MS": str(T0 + 5000), "TIMER_DEL_UNIQKEY": "ID1"}
    assert delays.scheduled(recall, "T", 3) == (TIMER_TOPIC, 0) and recall["REAL_TOPIC"] == "T"
    for late in ({"TIMER_DELIVER_MS": str(T0 - 1), "TIMER_DEL_UNIQKEY": "ID1"}, {"TIMER_DEL_UNIQKEY": "ID1"},
                 {"TIMER_DELIVER_MS": str(T0 + 5000), "TIMER_DEL_UNIQKEY": "ID1", "DELAY": "3"}):
        with pytest.raises(MessageIllegal, match="recall failed"):
            delays.scheduled(late, "T", 3)
    one = [{"topic": "T", "queueId": 0, "properties": {"DELAY": "2", "TIMER_DEL_UNIQKEY": "ID1"}}]
    assert delays.scheduled_items(one) is None  # (not the short way of a plain delayed send: refused in full)
