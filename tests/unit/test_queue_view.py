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


def test_a_deleted_topics_entries_below_its_floor_are_passed_over_as_below_the_min_offset(tmp_path):
    """QueueView.floor (its topic's deletion floor): the queue begins at the first entry at or past
    it, or at the CommitLog's min offset when that is higher; StoreReader.follow_floors sets it on
    every view; `archive_floor` is the lowest offset an archive read may serve: none while the
    floor bounds the queue, then the end of the deleted topic's queue dropped."""
    from helpers import small_settings

    from shm.reader import StoreReader

    settings = small_settings(tmp_path, mappedFileSizeConsumeQueue=FILE_SIZE)
    writer = ConsumeQueue(settings.consumequeue_dir, "T", 0, FILE_SIZE)
    for offset in range(6):
        writer.put(offset, 100 * offset, 100, 0)
    reader = StoreReader(settings)
    view = reader.queue("T", 0, 600)
    assert view.min_offset(0) == 0 and reader.archive_floor("T", 0) == 0
    reader.follow_floors({"T": 300})  # deleted when the CommitLog ended at 300, made again since
    assert view.min_offset(0) == 3 and view.min_offset(500) == 5 and reader.archive_floor("T", 0) is None
    assert reader.queue("U", 0, 600).floor == 0 and reader.get_message("T", 0, 0, 8, None, 600).next_begin_offset == 3
    (settings.consumequeue_dir / ".dropped-queue-offsets").write_text('{"T-0": 3}')  # (the dispatcher's)
    reader.follow_min_offset(400)  # cleaning took all below the floor: the archive's again, from 3
    assert reader.archive_floor("T", 0) == 3 and reader.archive_floor("T", 1) == 0
    reader.follow_floors({})
    assert view.min_offset(0) == 0
    writer.close()
    reader.close()


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


class TornMap:
    """A ConsumeQueue file's mapping as a reader copies it while the dispatcher writes: each
    copy returns the next of `states` (the file's bytes at that moment)."""

    def __init__(self, states: list[bytes]):
        self.states = states
        self.copies = 0

    def __getitem__(self, where: slice) -> bytes:
        state = self.states[min(self.copies, len(self.states) - 1)]
        self.copies += 1
        return state[where]


def test_a_size_copied_before_its_phy_was_written_never_passes_the_entry_off_as_one_at_offset_0(tmp_path):
    """The bench-consume failure of 2026-12-05 (a pull reply that ended inside another topic's
    first record): the scan's copy held a new entry's size beside its phy still 0. Sizes now come
    from a first copy and phys from a second, and the dispatcher stores sizes last."""
    from shm.consume_queue import ENTRY

    writer = ConsumeQueue(tmp_path, "T", 0, FILE_SIZE)
    writer.put(0, 5000, 1168, 7)
    view = QueueView(tmp_path, "T", 0, FILE_SIZE)
    view.refresh(6168)
    assert view.max_offset == 1
    segment = view.queue.files.files[0]
    first = ENTRY.pack(5000, 1168, 7)
    torn = first + ENTRY.pack(0, 1168, 0) + bytes(40)  # entry 1 as one copy may read it: size, no phy yet
    whole = first + ENTRY.pack(6168, 1168, 7) + bytes(40)
    real = segment.map
    segment.map = TornMap([torn, whole])
    view.refresh(6200)  # entry 1's record (6168 + 1168) is not dispatched: not taken, torn or not
    assert view.max_offset == 1 and segment.map.copies == 2
    segment.map = TornMap([torn, whole])
    view.refresh(7336)  # now it is: taken (what a pull reads of it is read again, whole)
    assert view.max_offset == 2
    segment.map = TornMap([whole[:20] + bytes(60), whole])  # no size in the first copy: not taken yet
    view.end, view.refreshed_at = 20, -1
    view.refresh(7336)
    assert view.max_offset == 1
    segment.map = real
    writer.close()
    view.close()


def test_the_dispatcher_stores_each_entrys_size_after_its_phy_and_tags(tmp_path, monkeypatch):
    """shm.consume_queue.write_entries, both ways: the same bytes as a plain copy; and the
    Python twin's stores in order (the C one's are fenced: shm/_dispatch.c cq_write)."""
    import shm.consume_queue as cq
    from shm.consume_queue import ENTRY

    entries = b"".join(ENTRY.pack(1000 + 100 * i, 100, i) for i in range(3))
    written = {}
    for native in (True, False):
        monkeypatch.setattr(cq, "NATIVE", native and cq.NATIVE)
        queue = ConsumeQueue(tmp_path / str(native), "T", 0, FILE_SIZE)
        segment = queue.files.last_writable(0)
        cq.write_entries(segment, 0, entries)
        written[native] = bytes(segment.map[:60])
        queue.close()
    assert written[True] == written[False] == entries

    class Recording(bytearray):
        stores: list = []

        def __setitem__(self, where, value):
            self.stores.append((where.start, where.stop))
            super().__setitem__(where, value)

    class Segment:
        readonly, size, map = False, 60, Recording(60)

        @staticmethod
        def reserve(end):  # (a file's blocks: shm.mapped_file)
            pass

    monkeypatch.setattr(cq, "NATIVE", False)
    cq.write_entries(Segment, 0, entries)
    assert bytes(Segment.map) == entries
    order = Segment.map.stores
    for i in range(3):
        size_at = order.index((20 * i + 8, 20 * i + 12))
        assert size_at > order.index((20 * i, 20 * i + 8)) and size_at > order.index((20 * i + 12, 20 * i + 20))
