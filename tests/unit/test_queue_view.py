"""A reader's view of a ConsumeQueue on real files, with the dispatcher's writes done by hand:
the view follows the queue into a file begun before `dispatched` was published, even when that
value then stands still (no later write anywhere to move it)."""

from __future__ import annotations

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
