"""Start-up recovery: from whatever a crash left, a store whose every part agrees.

Design note. The CommitLog is the only truth; ConsumeQueue and IndexFile are derived. Recovery
therefore (1) finds the longest prefix of valid CommitLog records — a torn or corrupt tail is cut
off, never skipped over, so no record after a hole can be mistaken for intact — and (2) makes
the derived structures match that prefix exactly: entries pointing past it are removed, entries
missing from it are rebuilt by dispatching the records again (dispatch is idempotent).

Modes, chosen by the `abort` file (present => the last stop was not clean):
  normal:   walk the last three segments with CRC checks; nothing is dispatched by the walk.
  abnormal: delete index files newer than the checkpoint's index time, start the walk at the
            newest segment whose first record is older than the checkpoint (less 3 s), and
            dispatch every valid record on the way, after what the index still lacks below
            that segment (its remaining files can end segments earlier: the index skips any
            key below its end, so the gap is filled first or never).
Then, in both: truncate the CommitLog at the end of the valid prefix, truncate ConsumeQueues at
it, dispatch whatever the ConsumeQueues or index still lack, rebuild the queue-offset table.

A full disk (no room for a new ConsumeQueue or index file) stops the dispatching, not the start:
`dispatch_blocked` says from where the derived structures may lack records; the node publishes it
as `dispatched`, its dispatcher goes on from there once there is room, and the queue-offset table
takes those records' offsets from the records themselves.

Progress (phase, bytes done of bytes to do) is readable from another thread while it runs, and
the report says what was dropped and how long each phase took.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from shm.codec import Corruption, peek_store_timestamp, scan
from shm.dispatch import ReputStopped, reput
from shm.mapped_file import StoreError
from shm.store import MessageStore
from shm.store_files import last_exit_ok


@dataclass
class RecoveryReport:
    mode: str = "normal"
    walk_start: int = 0
    recovered_offset: int = 0  # end of the valid CommitLog prefix
    corruption: str | None = None  # what stopped the walk, if not a clean end of data
    deleted_segments: list[str] = field(default_factory=list)
    blank_after_gap: list[str] = field(default_factory=list)  # never-written segments past a missing one
    deleted_index_files: list[str] = field(default_factory=list)
    damaged_queues: list[str] = field(default_factory=list)
    queue_entries_dropped: int = 0
    records_walked: int = 0
    records_dispatched: int = 0
    dispatch_start: int = 0
    dispatch_blocked: int | None = None  # the derived structures may lack the records from here (a full disk)
    dispatch_error: str = ""
    phases_ms: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        lines = [f"recovery ({self.mode}): CommitLog valid to offset {self.recovered_offset}, "
                 f"{self.records_walked} records checked, {self.records_dispatched} dispatched"]
        if self.corruption:
            lines.append(f"  truncated at {self.recovered_offset}: {self.corruption}")
        if self.deleted_segments:
            lines.append(f"  deleted CommitLog segments after it: {', '.join(self.deleted_segments)}")
        if self.blank_after_gap:
            lines.append(f"  deleted never-written CommitLog segments after a missing one: {', '.join(self.blank_after_gap)}")
        if self.queue_entries_dropped:
            lines.append(f"  ConsumeQueue entries dropped: {self.queue_entries_dropped}")
        for damaged in self.damaged_queues:
            lines.append(f"  ConsumeQueue rebuilt: {damaged}")
        if self.deleted_index_files:
            lines.append(f"  index files rebuilt: {', '.join(self.deleted_index_files)}")
        if self.dispatch_blocked is not None:
            lines.append(f"  dispatch stopped at {self.dispatch_blocked}: {self.dispatch_error} (the dispatcher goes on "
                         f"from there once there is room)")
        lines.append("  phases: " + ", ".join(f"{k} {v:.1f} ms" for k, v in self.phases_ms.items()))
        return "\n".join(lines)


@dataclass
class Progress:
    phase: str = "idle"
    done_bytes: int = 0
    total_bytes: int = 0


class Recovery:
    def __init__(self, store: MessageStore, *, clean: bool | None = None):
        self.store = store
        self.clean = last_exit_ok(store.root) if clean is None else clean
        self.report = RecoveryReport(mode="normal" if self.clean else "abnormal")
        self.progress = Progress()

    def run(self) -> RecoveryReport:
        store = self.store
        checkpoint = store.checkpoint
        self.report.blank_after_gap = list(store.commitlog.segments.dropped_after_gap)
        with self._phase("load"):
            deleted = store.index.load(last_exit_ok=self.clean, checkpoint_index_timestamp=checkpoint.index_timestamp)
            self.report.deleted_index_files = deleted
            store.load_consume_queues()
            self.report.damaged_queues = list(store.damaged_queues)
        with self._phase("consume_queues"):
            lagging = self._recover_queues()
        if not store.commitlog.segments.files:
            with self._phase("commitlog"):
                store.destroy_logics()
                store.rebuild_queue_offsets()
            return self.report
        with self._phase("commitlog"):
            end = self._walk(lagging)
            self._truncate(end)
        with self._phase("dispatch"):
            self._dispatch_missing(end, lagging)
        with self._phase("offsets"):
            store.rebuild_queue_offsets(self.report.dispatch_blocked)
            store.checkpoint.write()
        self.progress.phase = "done"
        return self.report

    # -- phases ----------------------------------------------------------------------------------

    @contextmanager
    def _phase(self, name: str):
        self.progress.phase = name
        started = time.perf_counter()
        try:
            yield
        finally:
            self.report.phases_ms[name] = (time.perf_counter() - started) * 1000

    def _recover_queues(self) -> int | None:
        """Recover every ConsumeQueue; returns the lowest max-offset of a queue that lost
        entries (the dispatch must restart there), or None."""
        lagging = None
        for queue in self.store.consume_queues.values():
            dropped = queue.recover()
            if dropped:
                self.report.queue_entries_dropped += dropped
                mark = max(queue.max_physical_offset, 0)
                lagging = mark if lagging is None else min(lagging, mark)
        if self.store.damaged_queues:
            lagging = 0
        return lagging

    def _walk(self, lagging: int | None) -> int:
        """Scan segments from the start file; returns the end of the valid prefix. Abnormal:
        dispatch each segment as it is found sound, after what the derived structures lack below
        the first (the index's deleted files can end segments earlier: `_index_end`)."""
        segments = self.store.commitlog.segments.files
        start = self._start_index() if not self.clean else max(0, len(segments) - 3)
        self.report.walk_start = segments[start].offset_start
        if not self.clean:
            behind = self._derived_start(lagging)
            if behind < self.report.walk_start:  # first: the index skips keys below its end
                self._reput(behind, self.report.walk_start)
        self.progress.total_bytes = sum(s.size for s in segments[start:])
        check_crc = self.store.settings.checkCRCOnRecover
        end = segments[start].offset_start
        for segment in segments[start:]:
            result = scan(segment.map, 0, segment.size, check_crc=check_crc)
            self.report.records_walked += result.records
            if not self.clean:
                self._dispatch_range(segment, 0, result.end)
            self.progress.done_bytes += segment.size
            stop = result.stopped_by
            if not isinstance(stop, Corruption):  # a blank or data to the last byte: the segment is full
                end = segment.offset_end
                continue
            end = segment.offset_start + result.end
            if stop.is_damage:
                self.report.corruption = f"{stop.kind.value} at offset {segment.offset_start + stop.position}: {stop.detail}"
            break
        return end

    def _start_index(self) -> int:
        """Abnormal: the newest segment whose first record is older than the checkpoint allows."""
        store = self.store
        limit = (store.checkpoint.min_timestamp_index
                 if store.settings.messageIndexEnable and store.settings.messageIndexSafe
                 else store.checkpoint.min_timestamp)
        segments = store.commitlog.segments.files
        for index in range(len(segments) - 1, -1, -1):
            stamp = peek_store_timestamp(segments[index].map)
            if stamp is not None and stamp != 0 and stamp <= limit:
                return index
        return 0

    def _dispatch_range(self, segment, start: int, end: int) -> None:
        base = segment.offset_start
        self._reput(base + start, base + end)

    def _reput(self, begin: int, end: int) -> None:
        """Dispatch [begin, end), unless an earlier range found the disk full."""
        if self.report.dispatch_blocked is not None:
            return
        try:
            _, count = reput(self.store, begin, end)
        except ReputStopped as e:  # (no room for a ConsumeQueue or index file; damage still stops the start)
            self.report.dispatch_blocked, self.report.dispatch_error = e.reached, str(e)
            self.report.records_dispatched += e.count
            return
        self.report.records_dispatched += count

    def _truncate(self, end: int) -> None:
        store = self.store
        self.report.recovered_offset = end
        self.report.deleted_segments = store.commitlog.truncate(end)
        if self.report.corruption:  # damaged bytes follow the valid prefix: make sure they stay gone
            segment = store.commitlog.segments.find(end) or store.commitlog.segments.last()
            if segment is not None and segment.offset_start <= end < segment.offset_end:
                segment.zero(end - segment.offset_start, segment.size)
        for segment in store.commitlog.segments.files:
            segment.position_flushed = segment.position_committed = segment.position_written
        for queue in store.consume_queues.values():
            if queue.max_physical_offset >= end or queue.max_physical_offset == -1:
                self.report.queue_entries_dropped += queue.truncate_dirty(end)

    def _dispatch_missing(self, end: int, lagging: int | None) -> None:
        """Dispatch records the derived structures lack: from the newest ConsumeQueue entry
        (RocketMQ's reput start), pulled back for any queue that lost entries or an index that
        is behind."""
        begin = self._derived_start(lagging)
        self.report.dispatch_start = begin
        self.progress.done_bytes, self.progress.total_bytes = 0, end - begin
        self._reput(begin, end)
        if self.report.dispatch_blocked is not None:  # (from the lowest a queue or the index may lack)
            self.report.dispatch_blocked = min(self.report.dispatch_blocked, begin)
        self.progress.done_bytes = end - begin

    def _derived_start(self, lagging: int | None) -> int:
        """Where a re-dispatch must begin for the ConsumeQueues and the index to lack nothing."""
        store = self.store
        starts = [max((q.max_physical_offset for q in store.consume_queues.values()), default=0)]
        if lagging is not None:
            starts.append(lagging)
        if store.settings.messageIndexEnable:
            starts.append(self._index_end())
        return max(min(starts), store.commitlog.offset_min)

    def _index_end(self) -> int:
        """The record the index may not hold every key of: the one at the newest file's
        endPhyOffset (its replay skips the keys held, IndexService.indexed_through)."""
        files = self.store.index.files
        return files[-1].end_phy_offset if files else 0


def recover(store: MessageStore, *, clean: bool | None = None) -> RecoveryReport:
    return Recovery(store, clean=clean).run()


def cut(store: MessageStore, keep: int) -> int:
    """Fencing (node.server.fencing): drop a recovered store's CommitLog from `keep` on, a
    follower's tail its new master never had, and make the derived files agree: ConsumeQueue
    entries past it go, index files that saw past it are rebuilt from their predecessors' end.
    Runs at start-up, before any service; returns the bytes dropped."""
    end = store.commitlog.offset_written
    if keep >= end:
        return 0
    recovery = Recovery(store, clean=True)
    recovery.report.corruption = f"fenced at {keep}"  # (so _truncate zeroes the cut segment's rest)
    recovery._truncate(keep)
    for index in [f for f in store.index.files if f.end_phy_offset >= keep]:
        store.index.files.remove(index)
        index.destroy()
    recovery._dispatch_missing(keep, None)
    if recovery.report.dispatch_blocked is not None:  # (a slave's full disk: the start says so)
        raise StoreError(recovery.report.dispatch_error)
    store.rebuild_queue_offsets()
    store.checkpoint.write()
    return end - keep
