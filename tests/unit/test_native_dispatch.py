"""shm._dispatch, the reput dispatcher's scan in C, against the Python scan it mirrors.

One suite over both implementations (the NATS file store's conformance idea): over any log,
well-formed or damaged, a DispatchBatch that scans with C ends exactly as one that scans in
Python: the same ConsumeQueue entries per queue, index requests, count, logics timestamp, and
the same stopping place and reason. tests/integration/test_queue_index.py holds the Python scan to the plain
per-record dispatch, and runs the byte-for-byte reput test over both.
"""

from __future__ import annotations

import os
import tracemalloc
from types import SimpleNamespace

import pytest
from hypothesis import example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from shm import dispatch
from shm.codec import (
    BLANK_MAGIC,
    SCHEDULE_TOPIC,
    TRANSACTION_COMMIT,
    TRANSACTION_PREPARED,
    TRANSACTION_ROLLBACK,
    encode,
    encode_host,
    index_key_hash,
    properties_string,
)
from shm.consume_queue import RUN_ENTRY
from shm.index_file import INDEX_KEY

pytestmark = pytest.mark.skipif(os.environ.get("MQNODE_NATIVE") == "0", reason="MQNODE_NATIVE=0")

V4, V6 = encode_host("10.0.0.1", 5), encode_host("::1", 5)
DELAY_LEVELS = [1000, 5000, 10000]
_PIECES = ["TAGS\x01", "KEYS\x01", "UNIQ_KEY\x01", "DELAY\x01", "XTAGS\x01", "a", "k1 k2", " ", "2", "\x01", "\x02",
           "é"]
_RECORD = st.fixed_dictionaries({
    "topic": st.sampled_from(["TopicA", "TopicB", "t" * 127, "é", SCHEDULE_TOPIC]),
    "properties": st.one_of(st.lists(st.sampled_from(_PIECES), max_size=8).map("".join),
                            st.sampled_from([properties_string({"UNIQ_KEY": "7F0000010000", "WAIT": "true"}),
                                             properties_string({"TAGS": "TagA", "KEYS": "k1  k2 "})])),
    "queue_id": st.integers(0, 3),
    "sys_flag": st.sampled_from([0, 0, TRANSACTION_PREPARED, TRANSACTION_COMMIT, TRANSACTION_ROLLBACK]),
    "born_host": st.sampled_from([V4, V4, V4, V6]),
    "queue_offset": st.integers(0, 2**40),
    "store_timestamp": st.sampled_from([0, 1795000000000]),
    "body": st.binary(max_size=40),
})
_SPOIL = st.one_of(st.none(), st.tuples(st.just("flip"), st.integers(0), st.integers(1, 255)),
                   st.tuples(st.just("cut"), st.integers(0)), st.tuples(st.just("blank"), st.integers(8, 64)))


def _log(records: list[dict], spoil) -> bytes:
    log = bytearray()
    for fields in records:
        log += encode(born_timestamp=1700000000000, store_host=fields["born_host"], physical_offset=len(log),
                      **fields)
    if spoil is None:
        return bytes(log)
    if spoil[0] == "flip" and log:
        log[spoil[1] % len(log)] ^= spoil[2]
    elif spoil[0] == "cut":
        del log[spoil[1] % (len(log) + 1):]
    elif spoil[0] == "blank":
        log += spoil[1].to_bytes(4, "big", signed=True) + BLANK_MAGIC.to_bytes(4, "big", signed=True)
        log += bytes(spoil[1] - 8)
    return bytes(log)


def _store(index: bool) -> SimpleNamespace:
    return SimpleNamespace(settings=SimpleNamespace(messageIndexEnable=index), delay_levels_ms=DELAY_LEVELS)


def _scan_all(log: bytes, native: bool, index: bool, start_count: int) -> tuple:
    """Scan `log` as reput does (apply left out), from a batch `start_count` short of full;
    return the batch's contents after each scan and where and why each stopped."""
    batch = dispatch.DispatchBatch(_store(index))
    batch.native = native
    batch.count = start_count
    rounds, position = [], 0
    for _ in range(len(log) // 91 + 2):
        position, stopped_by = batch.scan(log, position, len(log))
        rounds.append((position, stopped_by, batch.count, batch.logics_timestamp, batch.queue_entries,
                       batch.index_keys))
        if stopped_by is not None or position >= len(log):
            break
        batch.count, batch.queue_entries, batch.index_keys, batch.logics_timestamp = 0, {}, bytearray(), 0
    return rounds


def test_the_c_scan_is_built_and_chosen():
    """The suite must not pass by leaving C out: scripts/test installs with gcc at hand."""
    assert dispatch.NATIVE and dispatch._dispatch is not None
    assert dispatch.DispatchBatch(_store(True)).native


@hypothesis_settings(max_examples=500)
@given(st.lists(_RECORD, max_size=8), _SPOIL, st.booleans(), st.integers(0, 6))
@example([{"topic": "TopicA", "properties": "TAGS\x01a\x02TAGS\x01\x02KEYS\x01k1  k2", "queue_id": 1, "sys_flag": 0,
           "born_host": V4, "queue_offset": 9, "store_timestamp": 1, "body": b"x"}], None, True, 0)
@example([{"topic": "TopicA", "properties": "TAGS\x01a\x02UNIQ_KEY\x01u\x02TAGS\x01b\x02UNIQ_KEY\x01v", "queue_id": 1,
           "sys_flag": 0, "born_host": V4, "queue_offset": 9, "store_timestamp": 1, "body": b""}], None, True, 0)
@example([{"topic": "TopicA", "properties": "KEYS\x01!:/2##- x", "queue_id": 0, "sys_flag": 0, "born_host": V4,
           "queue_offset": 0, "store_timestamp": 1, "body": b""}], None, True, 0)
def test_c_scan_leaves_the_batch_the_python_scan_leaves(records, spoil, index, short_of_full):
    """Plain and delayed records, and every kind C leaves to Python (IPv6, non-ASCII, a schedule
    record whose DELAY is not plain digits, blanks, damage), in any order: the two scans end with the same batch, in the same place.
    (The examples: of two non-empty values of a name the last counts; an empty one is skipped;
    "TopicA#!:/2##-" hashes to Integer.MIN_VALUE, whose keyHash is 0.)"""
    log = _log(records, spoil)
    start_count = dispatch.BATCH_RECORDS - short_of_full if short_of_full else 0
    assert _scan_all(log, True, index, start_count) == _scan_all(log, False, index, start_count)


def test_c_scan_takes_the_common_record_itself(monkeypatch):
    """A log of plain records is scanned by C alone: the Python loop is never entered."""
    log = _log([{"topic": "TopicA", "properties": properties_string({"TAGS": "T", "KEYS": "a b", "UNIQ_KEY": "u"}),
                 "queue_id": i % 2, "sys_flag": 0, "born_host": V4, "queue_offset": i // 2,
                 "store_timestamp": 1795000000000 + i, "body": b"b" * i} for i in range(50)], None)
    monkeypatch.setattr(dispatch.DispatchBatch, "_scan_python", None)
    batch = dispatch.DispatchBatch(_store(True))
    assert batch.scan(log, 0, len(log)) == (len(log), None)
    assert batch.count == 50 and batch.logics_timestamp == 1795000000049
    queue_1 = list(RUN_ENTRY.iter_unpack(batch.queue_entries["TopicA", 1]))
    assert [entry[0] for entry in queue_1] == list(range(25))
    keys = list(INDEX_KEY.iter_unpack(batch.index_keys))  # record 3 is queue 1's second
    assert len(keys) == 150 and keys[3 * 3: 3 * 3 + 3] == [
        (index_key_hash(f"TopicA#{key}"), queue_1[1][1], 1795000000003) for key in ("u", "a", "b")]


def test_c_scan_takes_a_delayed_record_itself(monkeypatch):
    """A schedule-topic record with a plain-digits DELAY is C's too: its tag slot the store time
    plus the level's delay, a level beyond the last clamped to it."""
    log = _log([{"topic": SCHEDULE_TOPIC, "properties": properties_string({"DELAY": level, "REAL_TOPIC": "T"}),
                 "queue_id": 0, "sys_flag": 0, "born_host": V4, "queue_offset": i,
                 "store_timestamp": 1795000000000 + i, "body": b"d"} for i, level in enumerate(["1", "3", "17"])], None)
    monkeypatch.setattr(dispatch.DispatchBatch, "_scan_python", None)
    batch = dispatch.DispatchBatch(_store(True))
    assert batch.scan(log, 0, len(log)) == (len(log), None)
    slots = [entry[3] for entry in RUN_ENTRY.iter_unpack(batch.queue_entries[SCHEDULE_TOPIC, 0])]
    assert slots == [1795000000000 + 1000, 1795000000001 + 10000, 1795000000002 + 10000]


def test_c_scan_leaks_nothing():
    log = _log([{"topic": f"Topic{i % 11}", "properties": properties_string({"TAGS": "T", "KEYS": "a b", "UNIQ_KEY": "u"}),
                 "queue_id": i % 5, "sys_flag": 0, "born_host": V4, "queue_offset": i, "store_timestamp": 1,
                 "body": b"b"} for i in range(40)], None)

    def rounds(count: int) -> None:
        for _ in range(count):
            batch = dispatch.DispatchBatch(_store(True))
            batch.scan(log, 0, len(log))

    rounds(50)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    rounds(1000)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert grown < 64 * 1024, grown
