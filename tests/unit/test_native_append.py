"""shm._append, the CommitLog append's per-record loop in C, against the Python loop it mirrors.

One suite over both implementations: for any batch, any span [i, j) of it, any queue table and
base offset, `shm._append.place` leaves the same bytes, the same physical and queue offsets and
the same table as `shm.commitlog.place_records`. A batch whose positions point outside its bytes
is refused by both and written by neither past its end. tests/integration/test_commitlog.py checks what the
log holds after append_batch, with whichever loop was built.
"""

from __future__ import annotations

import os
import struct
import sys
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from shm import commitlog
from shm.codec import (
    TRANSACTION_COMMIT,
    TRANSACTION_PREPARED,
    TRANSACTION_ROLLBACK,
    Record,
    decode,
)
from shm.encoded_batch import EncodedBatch
from tests.helpers import BORN, BORN_V6, STORE_HOST, STORE_V6, message

pytestmark = pytest.mark.skipif(os.environ.get("MQNODE_NATIVE") == "0", reason="MQNODE_NATIVE=0")

_append = pytest.importorskip("shm._append")
TRANSACTIONS = [0, TRANSACTION_COMMIT, TRANSACTION_PREPARED, TRANSACTION_ROLLBACK]

records = st.lists(st.tuples(st.integers(0, 500), st.sampled_from(["TopicA", "TopicB", "T"]),
                             st.sampled_from(TRANSACTIONS), st.booleans()), min_size=1, max_size=24)


def batch_of(specs, *, shared_keys: bool = False) -> EncodedBatch:
    """`shared_keys`: one str object a queue, as a client batch's keys are (the C loop counts a
    run of one key object without the table); else a fresh str a record."""
    batch = EncodedBatch()
    for i, topic, transaction, v6 in specs:
        batch.add(message(i, topic=topic, sys_flag=transaction | (0x30 if v6 else 0),
                          born=BORN_V6 if v6 else BORN, store_host=STORE_V6 if v6 else STORE_HOST))
    if shared_keys:
        batch.queue_keys = [sys.intern(key) if key else key for key in batch.queue_keys]
    return batch


def run(place, batch: EncodedBatch, i: int, j: int, table: dict, base: int, stamp: int):
    data, table = bytearray(batch.data), dict(table)
    physical, queue = [0] * len(batch), [0] * len(batch)
    place(data, batch.positions, batch.queue_keys, batch.timestamp_offsets, i, j, table, base, stamp, physical, queue)
    return bytes(data), physical, queue, table


@hypothesis_settings(max_examples=150, deadline=None)
@given(records, st.data(), st.dictionaries(st.sampled_from([f"{t}-{q}" for t in ("TopicA", "TopicB", "T")
                                                             for q in range(4)] + ["Other-0"]),
                                           st.integers(0, 2**62)),
       st.integers(0, 2**40), st.integers(0, 2**62), st.booleans())
def test_c_and_python_place_alike(specs, data, table, base, stamp, shared_keys):
    batch = batch_of(specs, shared_keys=shared_keys)
    i = data.draw(st.integers(0, len(batch)))
    j = data.draw(st.integers(i, len(batch)))
    python = run(commitlog.place_records, batch, i, j, table, base, stamp)
    assert run(_append.place, batch, i, j, table, base, stamp) == python


def test_placed_records_read_back_with_their_offsets_and_time():
    batch = batch_of([(k, "TopicA", TRANSACTIONS[k % 4], k % 3 == 0) for k in range(12)])
    base = 1 << 33
    data, physical, queue, table = run(_append.place, batch, 0, len(batch), {"TopicA-1": 7}, base, 1795000000123)
    for k, at in enumerate(batch.positions):
        record = decode(data, at)
        assert isinstance(record, Record)
        assert (record.physical_offset, record.store_timestamp) == (base + at, 1795000000123) == (physical[k], 1795000000123)
        assert record.queue_offset == queue[k]
    advancing = [k for k in range(12) if batch.queue_keys[k] is not None]
    assert [queue[k] for k in range(12) if k not in advancing] == [0] * (12 - len(advancing))
    assert sum(table.values()) == 7 + len(advancing)


@pytest.mark.parametrize("place", [commitlog.place_records, _append.place], ids=["python", "c"])
@pytest.mark.parametrize("back, stamp", [(30, 0), (60, 56)], ids=["offsets-cross", "store-time-crosses"])
def test_positions_outside_the_batch_are_refused_and_nothing_is_written_past_it(place, back, stamp):
    batch = batch_of([(1, "TopicA", 0, False), (2, "TopicA", 0, False)])
    data = bytearray(batch.data) + bytearray(64)  # a guard the loop must not reach
    end = len(batch.data)
    positions, stamps = [0, end - back], [56, stamp]  # the second record's fields cross the end
    keys, table = [sys.intern("TopicA-0")] * 2, {}
    with pytest.raises((ValueError, struct.error)):
        place(memoryview(data)[:end], positions, keys, stamps, 0, 2, table, 0, 1, [0, 0], [0, 0])
    assert data[end:] == bytearray(64)
    assert table == {"TopicA-0": 1}  # the first record was placed and counted


def test_c_place_checks_its_arguments():
    batch = batch_of([(1, "TopicA", 0, False)])
    args = [bytearray(batch.data), batch.positions, batch.queue_keys, batch.timestamp_offsets, 0, 1, {}, 0, 1, [0], [0]]
    with pytest.raises(ValueError, match="must lie in the batch"):
        _append.place(*args[:4], 0, 2, *args[6:])
    with pytest.raises(ValueError, match="must lie in the batch"):
        _append.place(*args[:9], [], [0])
    with pytest.raises(TypeError, match="a str or None"):
        _append.place(*args[:2], [b"TopicA-1"], *args[3:])
    with pytest.raises(ValueError, match="negative queue offset"):
        _append.place(*args[:6], {"TopicA-1": -1}, *args[7:])
    with pytest.raises(TypeError):
        _append.place(bytes(batch.data), *args[1:])  # read-only bytes: nothing to patch


def test_c_place_holds_no_references():
    batch = batch_of([(k, "TopicA", 0, False) for k in range(32)])
    table, physical, queue = {}, [0] * 32, [0] * 32
    data = bytearray(batch.data)
    for _ in range(200):  # warm up: interned small ints, the table's keys
        _append.place(data, batch.positions, batch.queue_keys, batch.timestamp_offsets, 0, 32, table, 0, 1,
                      physical, queue)
    here = [tracemalloc.Filter(True, __file__)]  # what place() allocates is traced to the line calling it;
    tracemalloc.start()                          # other threads of the worker process (earlier modules') are not
    try:
        before = tracemalloc.take_snapshot().filter_traces(here)
        for _ in range(2000):
            _append.place(data, batch.positions, batch.queue_keys, batch.timestamp_offsets, 0, 32, table, 1 << 40,
                          1, physical, queue)
        after = tracemalloc.take_snapshot().filter_traces(here)
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert grown < 16_000, grown  # 2000 calls x 96 ints leaked would be megabytes
