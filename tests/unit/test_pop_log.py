"""shm.pop_log: records come back in order; a torn or damaged tail is cut to the intact prefix;
a compaction interrupted anywhere leaves the same state."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shm.pop_log import FRAME, PopLog, PopLogDamaged, read_frames


def written(directory, records, *, per_turn=3) -> PopLog:
    log = PopLog(directory)
    log.open()
    for i, record in enumerate(records):
        log.append(record)
        if i % per_turn == per_turn - 1:
            log.write()
    log.write()
    log.sync()
    return log


def test_records_come_back_in_order_across_reopens(tmp_path):
    written(tmp_path, [["A", i] for i in range(10)]).close()
    log = PopLog(tmp_path)
    state, records = log.open()
    assert state is None and records == [["A", i] for i in range(10)]
    log.append(["A", 10])
    log.write()
    log.close()
    assert PopLog(tmp_path).open()[1][-1] == ["A", 10]


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 20), st.data())
def test_a_cut_or_damaged_tail_keeps_exactly_the_intact_prefix(tmp_path_factory, count, data):
    directory = tmp_path_factory.mktemp("pop")
    records = [["P", "g", "T", i, list(range(i % 5))] for i in range(count)]
    written(directory, records).close()
    path = directory / "journal.0"
    raw = bytearray(path.read_bytes())
    ends = [end for _, end in _frame_bounds(bytes(raw))]
    cut = data.draw(st.integers(0, len(raw)))
    damage = data.draw(st.booleans())
    if damage and cut < len(raw):
        raw[cut] ^= 0xFF  # a flipped byte: its frame and everything after goes
        path.write_bytes(bytes(raw))
    else:
        path.write_bytes(bytes(raw[:cut]))
    intact = sum(1 for end in ends if end <= cut)
    log = PopLog(directory)
    _, back = log.open()
    assert back == records[:intact]
    assert path.stat().st_size == (ends[intact - 1] if intact else 0)
    log.append(["after"])
    log.write()
    log.close()
    assert PopLog(directory).open()[1] == records[:intact] + [["after"]]


def _frame_bounds(data: bytes):
    at = 0
    while at < len(data):
        length, _ = FRAME.unpack_from(data, at)
        yield at, at + FRAME.size + length
        at += FRAME.size + length


def test_compaction_starts_the_next_journal_from_the_snapshot(tmp_path):
    log = written(tmp_path, [["A", i] for i in range(5)])
    log.compact({"nextCk": 9})
    log.append(["A", 5])
    log.write()
    log.close()
    state, records = PopLog(tmp_path).open()
    assert state == {"nextCk": 9} and records == [["A", 5]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal.1", "snapshot"]


@pytest.mark.parametrize("crash", ["before-rename", "after-rename", "after-new-journal"])
def test_a_compaction_interrupted_anywhere_leaves_the_same_state(tmp_path, crash):
    """The state is [the snapshot's, then the journal's records]: the same at each crash point."""
    records = [["A", i] for i in range(5)]
    written(tmp_path, records).close()
    full = {"all": records}
    if crash == "before-rename":
        (tmp_path / "snapshot.tmp").write_bytes(b"half")
        expected = (None, records)
    else:
        log = PopLog(tmp_path)
        log.open()
        log.compact(full)
        log.close()
        if crash == "after-rename":  # journal.1 not made yet, journal.0 not gone yet
            (tmp_path / "journal.1").unlink()
            (tmp_path / "journal.0").write_bytes(b"")
        expected = (full, [])
    assert PopLog(tmp_path).open() == expected


def test_a_compaction_the_full_disk_refuses_changes_nothing(tmp_path):
    """/dev/full answers every write ENOSPC: the snapshot's temporary made a link to it."""
    records = [["A", i] for i in range(3)]
    log = written(tmp_path, records)
    (tmp_path / "snapshot.tmp").symlink_to("/dev/full")
    assert log.compact({"all": records}) is False
    assert not (tmp_path / "snapshot.tmp").is_symlink()
    log.append(["A", 3])  # (the journal goes on)
    log.write()
    assert log.compact({"all": records + [["A", 3]]}) is True
    log.close()
    assert PopLog(tmp_path).open() == ({"all": records + [["A", 3]]}, [])


def test_a_snapshot_that_is_not_whole_is_damage_not_a_crash(tmp_path):
    log = written(tmp_path, [["A", 1]])
    log.compact({"x": 1})
    log.close()
    raw = (tmp_path / "snapshot").read_bytes()
    (tmp_path / "snapshot").write_bytes(raw[:-1])
    with pytest.raises(PopLogDamaged):
        PopLog(tmp_path).open()


def test_a_failed_sync_raises_and_is_not_retried(tmp_path, monkeypatch):
    log = written(tmp_path, [])
    log.append(["A", 1])
    log.write()
    calls = []

    def failing(fd):
        calls.append(fd)
        raise OSError(5, "EIO")

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(OSError):
        log.sync()
    assert len(calls) == 1


def test_frames_read_back_stop_at_a_length_beyond_the_data():
    assert read_frames(FRAME.pack(100, 0) + b"x") == ([], 0)


def _ship(shipper, replica, peer="slave") -> int:
    """What the ha-server would send `peer` until it has nothing more, taken as the ha-client takes it."""
    from actors import ha_link

    items = 0
    while True:
        batch = shipper.items_for(peer)
        if not batch:
            return items
        for item in batch:
            part, gen, offset, data = ha_link.parse_pop(memoryview(item)[1:])
            (replica.snapshot_chunk if part == ha_link.POP_SNAPSHOT else replica.journal_chunk)(gen, offset, data)
        items += len(batch)


@pytest.mark.parametrize("seed", range(6))
def test_a_slaves_copy_of_the_pop_log_is_the_masters_byte_for_byte(tmp_path, seed):
    """PopShipper (the ha-server's) tails a pop log that is appended and compacted at random,
    in chunks smaller than some frames; PopReplica (the ha-client's) writes what it ships. After
    each catch-up the copy holds the master's snapshot and journal byte for byte, a frame half
    written is never shipped, and the copy opens as a PopLog to the master's state."""
    import random

    from actors.ha_config import PopShipper
    from shm.pop_log import PopReplica

    rng = random.Random(seed)
    master, copy = tmp_path / "pop", tmp_path / "pop-replica"
    log = PopLog(master)
    log.open()
    shipper, replica = PopShipper(master), PopReplica(copy)
    shipper.CHUNK = 300
    state = []
    for turn in range(40):
        for _ in range(rng.randint(1, 4)):
            record = ["A", "g", "T", turn, "x" * rng.choice([10, 50, 400])]
            log.append(record)
            state.append(record)
        log.write()
        if rng.random() < 0.15:
            log.compact({"records": list(state)})
            state = []
        if rng.random() < 0.5:
            torn = master / f"journal.{log.gen}"
            whole = torn.read_bytes()
            with open(torn, "ab") as f:  # a write the pop service is making this moment: half a frame
                f.write(FRAME.pack(100, 0) + b"y" * 30)
            _ship(shipper, replica)
            assert (copy / f"journal.{log.gen}").read_bytes() == whole
            os.truncate(torn, len(whole))
            continue
        _ship(shipper, replica)
        assert (copy / f"journal.{log.gen}").read_bytes() == (master / f"journal.{log.gen}").read_bytes()
        assert ((copy / "snapshot").read_bytes() if log.gen else None) == \
               ((master / "snapshot").read_bytes() if log.gen else None)
    _ship(shipper, replica)
    log.close()
    assert PopLog(copy).open() == PopLog(master).open()


def test_a_chunk_that_does_not_continue_the_copy_is_refused(tmp_path):
    from shm.pop_log import PopReplica, ReplicaGap

    replica = PopReplica(tmp_path)
    replica.snapshot_chunk(0, 0, b"")
    payload = b'["A"]'
    frame = FRAME.pack(len(payload), __import__("zlib").crc32(payload)) + payload
    replica.journal_chunk(0, 0, frame)
    with pytest.raises(ReplicaGap):
        replica.journal_chunk(0, len(frame) + 1, frame)  # a gap
    with pytest.raises(ReplicaGap):
        replica.journal_chunk(0, len(frame), frame[:-1])  # half a frame
    with pytest.raises(ReplicaGap):
        replica.journal_chunk(1, 0, frame)  # another generation, without its snapshot
    replica.snapshot_chunk(3, 0, b"garbage")
    with pytest.raises(ReplicaGap):
        replica.journal_chunk(3, 0, b"")  # a snapshot that is not one


def test_a_slave_that_takes_nothing_is_shipped_at_most_a_window(tmp_path):
    """PopShipper's flow control: past WINDOW bytes the slave has not said it took, nothing more
    goes (the link's socket would queue it without bound); its b"T" report opens the window."""
    from actors.ha_config import PopShipper
    from actors.ha_link import LinkError

    log = PopLog(tmp_path)
    log.open()
    for turn in range(50):
        log.append(["A", "x" * 1000])
        log.write()
    shipper = PopShipper(tmp_path)
    shipper.CHUNK, shipper.WINDOW = 4096, 10_000
    shipped = sum(len(item) - 18 for _ in range(20) for item in shipper.items_for("slave"))
    assert 10_000 <= shipped < 10_000 + 4096 and shipper.statistics()["popHeldBack"] > 0
    for _ in range(20):  # a slave that reports what it took gets the rest
        shipper.took("slave", shipped)
        shipped += sum(len(item) - 18 for item in shipper.items_for("slave"))
    assert shipped == log.size
    with pytest.raises(LinkError):
        shipper.took("slave", log.size + 1)  # more than was shipped: not a slave of this master's
