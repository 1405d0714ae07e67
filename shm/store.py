"""MessageStore: the store directory opened as a whole — CommitLog, ConsumeQueues, IndexFiles,
checkpoint — for one process. The writable opener holds the `lock`; readers open read-only.

Layout under `storePathRootDir` (RocketMQ 4.9's, so either can open the other's store):
`commitlog/`, `consumequeue/<topic>/<queueId>/`, `index/`, `checkpoint`, `abort`, `lock`,
`config/*.json`, plus mqnode's own `control` (shm.control_block) and `consumequeue/` +
DROPPED_OFFSETS (MessageStore.drop_queues_of; RocketMQ's loader skips a file there).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable

import orjson

from shm.archive_manifest import fsync_dir  # (one definition of a directory's fsync)
from shm.checkpoint import Checkpoint
from shm.codec import Record
from shm.commitlog import CommitLog
from shm.consume_queue import DROPPED_OFFSETS, ConsumeQueue, dropped_offsets
from shm.disk import write_whole
from shm.index_file import IndexService
from shm.mapped_file import StoreError, WrongFileSize
from shm.settings import Settings
from shm.store_files import StoreLock


class MessageStore:
    def __init__(self, settings: Settings, *, readonly: bool = False, lock: bool = True,
                 clock: Callable[[], float] = time.time):
        self.settings = settings
        self.readonly = readonly
        self.root = settings.root
        self.clock = clock
        self.delay_levels_ms = settings.delay_levels_ms()
        self.lock = StoreLock(self.root) if (lock and not readonly) else None
        if self.lock:
            self.lock.acquire()
        try:
            if not readonly:
                self.root.mkdir(parents=True, exist_ok=True)
            self.commitlog = self._open_commitlog(readonly)
            self.checkpoint = Checkpoint(self.root / "checkpoint", readonly=readonly) if (
                not readonly or (self.root / "checkpoint").exists()) else None
            self.index = IndexService(settings.index_dir, settings.maxHashSlotNum, settings.maxIndexNum,
                                      readonly=readonly, clock=clock, max_query=settings.maxMsgsNumBatch)
            self.index.on_file_full = self._index_file_full
            self.consume_queues: dict[tuple[str, int], ConsumeQueue] = {}
            self.damaged_queues: list[str] = []  # queues dropped at load, to be rebuilt
        except BaseException:
            if self.lock:
                self.lock.release()
            raise

    def _open_commitlog(self, readonly: bool) -> CommitLog:
        """The CommitLog; a store made with another segment size (a node started with
        --mappedFileSizeCommitLog, then this tool or a start without it) is refused naming the
        size to give: its segments are the store's format, never resized."""
        s = self.settings
        try:
            return CommitLog(s.commitlog_dir, s.mappedFileSizeCommitLog, readonly=readonly, keep_free=s.commitlog_headroom)
        except WrongFileSize as e:
            sizes = {path.stat().st_size for path in s.commitlog_dir.iterdir() if path.name.isdigit()}
            if e.actual is None or sizes != {e.actual} or e.actual % 4096:  # (a file cut short: a damaged store)
                raise
            raise WrongFileSize(f"{e}: this store was made with mappedFileSizeCommitLog = {e.actual} (give "
                                f"--mappedFileSizeCommitLog {e.actual}, or that line in the conf)", e.actual) from None

    def _index_file_full(self, end_timestamp: int) -> None:
        if self.checkpoint is not None and not self.readonly:
            self.checkpoint.flush_index(end_timestamp)

    # -- consume queues --------------------------------------------------------------------------

    def load_consume_queues(self, progress: Callable[[], None] | None = None) -> None:
        """Open every queue on disk (`progress` called after each: a service that opens tens of
        thousands beats meanwhile). A queue whose files cannot be opened (wrong size, a gap) is
        derived data: it is deleted and rebuilt from the CommitLog by recovery."""
        root = self.settings.consumequeue_dir
        if not root.is_dir():
            return
        for topic_dir in sorted(p for p in root.iterdir() if p.is_dir()):
            for queue_dir in sorted(p for p in topic_dir.iterdir() if p.is_dir()):
                if not queue_dir.name.isdigit():
                    continue  # RocketMQ ignores non-integer queue directories
                key = (topic_dir.name, int(queue_dir.name))
                try:
                    self.consume_queues[key] = self._open_queue(*key)
                except StoreError as e:
                    if self.readonly:
                        raise
                    self.damaged_queues.append(f"{topic_dir.name}/{queue_dir.name}: {e}")
                    shutil.rmtree(queue_dir)
                if progress is not None:
                    progress()

    def _open_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        return ConsumeQueue(self.settings.consumequeue_dir, topic, queue_id,
                            self.settings.mappedFileSizeConsumeQueue, readonly=self.readonly)

    def consume_queue(self, topic: str, queue_id: int, *, create: bool = True) -> ConsumeQueue | None:
        key = (topic, queue_id)
        queue = self.consume_queues.get(key)
        if queue is None and (create or (self.settings.consumequeue_dir / topic / str(queue_id)).is_dir()):
            queue = self.consume_queues[key] = self._open_queue(topic, queue_id)
        return queue

    def drop_queues_of(self, deleted_at: Callable[[str], int | None]) -> list[str]:
        """Remove the queues of deleted topics that index no message a reader may serve: every
        entry's record ends at or below the CommitLog's min offset or the topic's deletion floor
        (`deleted_at(topic)`: the CommitLog's end when it was deleted, 0 when none is kept; None
        for a topic not deleted); "topic/queueId" of each. Only their writer's: recovery's (before
        `rebuild_queue_offsets`, before any other process maps them) or the dispatcher's (which
        then tells the readers: `queues_dropped`). RocketMQ destroys a deleted topic's queues at
        the delete (cleanUnusedTopic); cleaning never deletes a queue's last file: without this,
        each queue a deleted topic leaves would keep its file, and a mapping and a descriptor in
        the dispatcher, for the life of the store.

        Each one's next queue offset is kept first (`DROPPED_OFFSETS`), and the writer goes on
        from it if the topic is sent to again: a queue offset never names two messages (an
        archive of the old ones keeps theirs). Nothing is dropped when that cannot be written."""
        files = self.commitlog.segments.files
        floor = files[0].offset_start if files else 0
        going = [key for key, queue in self.consume_queues.items()
                 if (at := deleted_at(queue.topic)) is not None and queue.max_physical_offset <= max(floor, at)]
        if not going:
            return []
        # (kept for a queue made again too: below it, an archive's offsets are the deleted topic's)
        kept = self.dropped_offsets() | {self.consume_queues[key].key: self.consume_queues[key].offset_max for key in going}
        root = self.settings.consumequeue_dir
        if not write_whole(root / DROPPED_OFFSETS, orjson.dumps(kept, option=orjson.OPT_SORT_KEYS)):
            return []  # no room: kept as they are, the next start tries again
        fsync_dir(root)
        for key in going:
            queue = self.consume_queues.pop(key)
            queue.destroy()
            shutil.rmtree(queue.directory, ignore_errors=True)
            if not any(queue.directory.parent.iterdir()):
                queue.directory.parent.rmdir()
        return [f"{topic}/{queue_id}" for topic, queue_id in going]

    def dropped_offsets(self) -> dict[str, int]:
        """"topic-queueId" -> the next queue offset of each queue `drop_queues_of` removed."""
        return dropped_offsets(self.settings.consumequeue_dir)

    def rebuild_queue_offsets(self, undispatched_from: int | None = None) -> None:
        """The next queue offset of every queue = its ConsumeQueue's max offset (§2.9); with
        `undispatched_from` (records recovery could not dispatch: a full disk), past that of the
        records from there on, so that no queue offset is given twice."""
        table = self.commitlog.queue_offsets = {q.key: q.offset_max for q in self.consume_queues.values()}
        for name, offset in self.dropped_offsets().items():
            table.setdefault(name, offset)  # (a queue made again holds at least as much)
        for queue in self.consume_queues.values():
            queue.correct_min_offset(self.commitlog.offset_min)
        if undispatched_from is not None:
            from shm.dispatch import is_queued  # (dispatch needs the store's parts, not the store)

            for record in self.commitlog.iterate(max(undispatched_from, self.commitlog.offset_min), read_body=False):
                if isinstance(record, Record) and is_queued(record):
                    key = f"{record.topic}-{record.queue_id}"
                    table[key] = max(table.get(key, 0), record.queue_offset + 1)

    def destroy_logics(self) -> None:
        for queue in self.consume_queues.values():
            queue.destroy()
        self.consume_queues.clear()
        shutil.rmtree(self.settings.consumequeue_dir, ignore_errors=True)
        self.index.destroy()

    # -- lifecycle -------------------------------------------------------------------------------

    def flush_all(self) -> None:
        """Everything written so far to disk, then the checkpoint (shutdown, tools)."""
        self.commitlog.flush()
        for queue in self.consume_queues.values():
            queue.flush()
        self.index.flush()
        if self.checkpoint is not None and not self.readonly:
            self.checkpoint.flush()

    def close(self) -> None:
        self.commitlog.close()
        for queue in self.consume_queues.values():
            queue.close()
        self.index.close()
        if self.checkpoint is not None:
            self.checkpoint.close()
        if self.lock:
            self.lock.release()
            self.lock = None

    def __enter__(self) -> "MessageStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
