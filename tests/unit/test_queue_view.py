"""A reader's view of a ConsumeQueue on real files, with the dispatcher's writes done by hand:
the view follows the queue into a file begun before `dispatched` was published, even when that
value then stands still (no later write anywhere to move it). And the reader's count of a queue's
committed records in a CommitLog range, on a small store."""

from __future__ import annotations

from collections import Counter

from shm.consume_queue import ConsumeQueue
from shm.reader import QueueView

ENTRIES_A_FILE = 4
FILE_SIZE = 20 * ENTRIES_A_FILE


def test_the_view_follows_the_queue_into_a_file_begun_since_its_last_look(tmp_path):
    writer = ConsumeQueue(tmp_path, "T", 0, FILE_SIZE)
    view = QueueView(tmp_path, "T", 0, FILE_SIZE)
    for offset in range(3):
        writer.put(offset, 100 * offset, 100, 0)
    view.refresh(300)
    assert view.max_offset == 3
    for offset in range(3, 7):  # the first file fills, the second begins; then `dispatched` moves once
        writer.put(offset, 100 * offset, 100, 0)
    dispatched = 700
    view.refresh(dispatched)
    assert view.max_offset == 7  # not 4: the look that saw the first file full looked for the next
    view.refresh(dispatched)  # and nothing else is there to find
    assert view.max_offset == 7
    writer.close()
    view.close()


def test_the_committed_records_of_a_queue_in_a_commitlog_range_are_counted_by_their_half(tmp_path):
    """shm.reader.commits_stored, over queue files of 4 entries (the bisection crosses files)."""
    from helpers import BORN, STORE_HOST, open_store, put, small_settings

    from shm.codec import TRANSACTION_COMMIT, TRANSACTION_PREPARED, encode
    from shm.reader import StoreReader

    settings = small_settings(tmp_path, mappedFileSizeConsumeQueue=FILE_SIZE)
    kinds = [(0, 0), (TRANSACTION_COMMIT, 10), (TRANSACTION_PREPARED, 0), (TRANSACTION_COMMIT, 10),
             (TRANSACTION_COMMIT, 20), (0, 0), (TRANSACTION_COMMIT, 30), (TRANSACTION_COMMIT, 10), (0, 0)]
    store = open_store(settings)
    result = put(store, [encode(topic="T", body=b"b" * (40 + i), queue_id=0, born_timestamp=i, born_host=BORN,
                                store_host=STORE_HOST, sys_flag=flag, prepared_transaction_offset=half)
                         for i, (flag, half) in enumerate(kinds)]
                 + [encode(topic="U", body=b"u", queue_id=0, born_timestamp=0, born_host=BORN, store_host=STORE_HOST,
                           sys_flag=TRANSACTION_COMMIT, prepared_transaction_offset=10)])
    end = store.commitlog.offset_written
    store.close()
    at = result.physical_offsets
    reader = StoreReader(settings)
    assert reader.commits_stored("T", 0, 0, end, end) == ({10: 3, 20: 1, 30: 1}, end, 8)  # (a half: no entry)
    assert reader.commits_stored("T", 0, at[3], at[7], end) == ({10: 1, 20: 1, 30: 1}, at[7], 4)  # [low, high)
    assert reader.commits_stored("T", 0, at[3] + 1, end, end) == ({20: 1, 30: 1, 10: 1}, end, 5)
    assert reader.commits_stored("T", 0, end, end, end) == ({}, end, 0)
    assert reader.commits_stored("V", 3, 0, end, end) == ({}, end, 0)  # (no such queue)
    total, low, calls = Counter(), 0, 0
    while low < end:  # three entries a call: each call goes on where the last stopped
        found, low, read = reader.commits_stored("T", 0, low, end, end, limit=3)
        total, calls = total + found, calls + 1
        assert read == (3 if calls < 3 else 2)
    assert total == {10: 3, 20: 1, 30: 1} and calls == 3
    reader.close()
