"""clean: the only code that deletes store files (RocketMQ's CleanCommitLogService and
CleanConsumeQueueService, docs/storage.md "Cleaning").

Every `cleanResourceInterval` ms the core looks at the disk and decides:

- **Disk full.** The CommitLog's or ConsumeQueue's disk over `diskSpaceWarningLevelRatio` sets the
  control block's FLAG_DISK_FULL (the write service then answers sends SERVICE_NOT_AVAILABLE,
  "the disk is full") and makes cleaning immediate; at or under `diskSpaceCleanForciblyRatio`
  the flag clears and sends are taken again (between the two it stays as it is: RocketMQ's
  band). Over `diskSpaceCleanForciblyRatio`, cleaning is immediate too. The ratio is
  RocketMQ's: used = total - free, ceil(used * 100 / (used + usable)) / 100.
- **No room for a segment.** mqnode's addition: the CommitLog's disk with less free than one
  `mappedFileSizeCommitLog` and the headroom a new segment leaves (Settings.commitlog_headroom)
  starts a pass (space) and makes cleaning immediate, whatever the ratios say. RocketMQ's
  ratios assume segments small against the disk; on a small one (or with large segments) the
  log could not grow while every ratio stayed under its trigger: the writer refused sends, a
  slave's ha-client could not go on.
- **A CommitLog pass** when the local hour is in `deleteWhen` (time), when either disk is over
  `diskMaxUsedSpaceRatio` % (space), or on request (manual, `admin clean`: up to 20 passes back
  to back). A pass walks the segments oldest first and never touches the last one, nor one
  not yet flushed and dispatched whole. A segment goes when its last modification is
  `fileReservedTime` hours old; when cleaning is immediate and `cleanFileForciblyEnable` holds
  (or `admin clean --force`), its age is ignored (forced). At most 10 go a pass, with
  `deleteCommitLogFilesInterval` ms between them; the pass stops at the first segment too young.
  mqnode's one addition: a pass that deleted its 10 while the space trigger still holds is
  followed by the next at once, so deletion keeps up with fast appends. With
  `tieredArchiveDir`, a segment goes only once the archive's manifest holds it
  (shm.archive_manifest): the pass stops at the first one it does not, however full the disk.
- **ConsumeQueue and index files** after a pass moved the CommitLog's min offset: every CQ file
  but a queue's last whose last entry points below it (a `deleteConsumeQueueFilesInterval` ms
  pause after each queue that lost files), then every index file but the last whose end offset
  is below it.

Crash policy: the min offset is published in the control block before a segment is unlinked,
so readers answer from the new bounds (OFFSET_TOO_SMALL below them) and never look for it.
Unlinking never unmaps anything: a process that still maps a deleted file keeps valid pages
(no SIGBUS: files are never truncated) until it drops the mapping, which every process of the
node does at its next turn after the clean bumps the control block's `deletions`
(`follow_min_offset`), freeing the space. A kill at any instant leaves a contiguous tail of segments (oldest first), and the
restarted node derives every bound from the files on disk. A file that cannot be unlinked (a
"hanged" file) is left, and tried again after `redeleteHangedFileInterval` ms.
`destroyMapedFileIntervalForcibly` bounds, in RocketMQ, how long a deleted file's mapping may
outlive its deletion while referenced; here no deletion waits for a reference (the mapping
stays valid in the process that holds it), so there is nothing for it to bound.

The service is `CleanCore` (no socket; the control block, the store's directories, a wall
clock, a monotonic clock and the disk ratio function in) and `Clean`, its process's shell.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import zmq

from actors.base import Actor, give_way, incoming, socket
from actors.wire import pack_replies
from node import protocol
from shm import archive_manifest
from shm.consume_queue import last_entry_offset
from shm.disk import free_bytes, nearest_existing
from shm.index_file import end_phy_offset
from shm.control_block import FLAG_DISK_FULL
from shm.invariant import invariant

log = logging.getLogger("mqnode")

DELETE_MAX_PER_PASS = 10  # RocketMQ's deleteExpiredFileByTime: at most 10 files a call
MANUAL_PASSES = 20  # executeDeleteFilesManually
CAUSES = ("time", "space", "forced", "manual")
CLEAN_NICENESS = 19
TIGHT_CHECK_S = 0.2  # between looks at a disk whose state refuses sends (a statvfs each)
ROOM_SAID_S = 60.0  # the no-room warning at most this often


def disk_ratio(path: Path) -> float:
    """The used share of `path`'s file system, as RocketMQ's UtilAll.getDiskPartitionSpaceUsedPercent
    (a directory not made yet: the disk it will be on)."""
    st = os.statvfs(nearest_existing(path))
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    usable = st.f_bavail * st.f_frsize
    return math.ceil(used * 100 / (used + usable)) / 100 if used + usable > 0 else 0.0


def _drop_cached_pages(path: Path) -> None:
    """Free the segment's cached pages no process maps, here, at this process's low priority
    (the unlink leaves them to whichever process drops the last mapping)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass  # advice only
    finally:
        os.close(fd)


def delete_hours(text: str) -> frozenset[int]:
    """`deleteWhen`: ";"-separated hours of the day ("04", "4;16")."""
    hours = set()
    for part in text.split(";"):
        part = part.strip()
        if not part.isdigit() or not 0 <= int(part) <= 23:
            raise ValueError(f"deleteWhen: {part!r} is not an hour from 00 to 23")
        hours.add(int(part))
    return frozenset(hours)


def _segments(directory: Path) -> list[Path]:
    """Segment files (20-digit names), oldest first; none for a directory gone (the dispatcher
    drops a deleted topic's queues: shm.store.MessageStore.drop_queues_of)."""
    try:
        return sorted(p for p in directory.iterdir() if len(p.name) == 20 and p.name.isdigit())
    except (FileNotFoundError, NotADirectoryError):
        return []


@dataclass
class Pass:
    cause: str  # what started it: time, space, manual
    forced: bool  # age ignored
    next_at: float = 0.0
    deleted: int = 0


@dataclass
class ManualRequest:
    reply_to: tuple  # (client, arrival, opaque) for the shell
    force: bool
    after_pass: int = 0  # the passes started before it came: it is answered by a later one
    stop: str = ""  # why its last pass ended
    deleted: list[dict] = field(default_factory=list)


class CleanCore:
    """Expired-file cleaning without sockets: call `step(now)` in a loop; it returns how long
    until it has something to do. `wall_ms` (epoch ms) ages files and names the hour;
    `local_hour` gives the hour of the day for `wall_ms` (a test may fix it)."""

    def __init__(self, settings, control, *, wall_ms=None, local_hour=None, ratio=disk_ratio,
                 room=free_bytes):
        s = settings
        self.settings = s
        self.control = control
        self.wall_ms = wall_ms or (lambda: time.time_ns() // 1_000_000)
        self.local_hour = local_hour or (lambda ms: time.localtime(ms / 1000).tm_hour)
        self.ratio = ratio
        self.room = room
        self.segment_room = True  # the CommitLog's disk holds one more segment and its headroom
        self.room_said_at = -ROOM_SAID_S
        self.hours = delete_hours(s.deleteWhen)
        self.reserved_ms = s.fileReservedTime * 3600 * 1000
        self.max_used = min(max(s.diskMaxUsedSpaceRatio, 10), 95) / 100  # clamped as RocketMQ clamps it
        self.next_check = 0.0  # first look at once: a full disk is refused from the start
        self.clean_immediately = False
        self.space_trigger = False
        self.running: Pass | None = None
        self.queues_to_clean: list[Path] = []
        self.index_pending = False
        self.next_queue_at = 0.0
        self.manual: list[ManualRequest] = []
        self.manual_passes = 0
        self.hanged_until = 0.0
        self.finished: list[ManualRequest] = []  # manual requests done, for the shell to answer
        self.passes = self.checks = 0
        self.deleted_files = dict.fromkeys(CAUSES, 0)
        self.deleted_bytes = dict.fromkeys(CAUSES, 0)
        self.cq_files_deleted = self.index_files_deleted = self.hanged = 0
        self.last_pass_ms = 0
        self.last_stop = ""  # why the last pass ended
        self.ratios = {"commitlog": 0.0, "consumequeue": 0.0}

    # -- the loop ------------------------------------------------------------------------------------

    def step(self, now: float) -> float:
        """Do what is due at monotonic time `now`; returns seconds until the next thing is due."""
        if now >= self.next_check and self.running is None:
            self.next_check = now + self.settings.cleanResourceInterval / 1000
            self._check(now)
        if self.running is not None and now >= self.running.next_at:
            self._delete_one(now)
        elif self.running is None and (self.queues_to_clean or self.index_pending) and now >= self.next_queue_at:
            self._clean_logics(now)
        due = [self.next_check]
        if self.running is not None:
            due.append(self.running.next_at)
        elif self.queues_to_clean or self.index_pending:
            due.append(self.next_queue_at)
        return max(0.0, min(due) - now)

    def request_manual(self, reply_to: tuple, *, force: bool) -> None:
        """`admin clean`: up to MANUAL_PASSES passes, back to back, expired files only unless
        `force`; answered (`finished`) when a pass deletes nothing or the passes are used up."""
        self.manual.append(ManualRequest(reply_to, force, self.passes))
        self.manual_passes = MANUAL_PASSES
        self.next_check = 0.0  # at the next step

    # -- the disk and the triggers ---------------------------------------------------------------------

    def _check(self, now: float) -> None:
        s = self.settings
        self.checks += 1
        self.ratios = {"commitlog": self.ratio(s.commitlog_dir), "consumequeue": self.ratio(s.consumequeue_dir)}
        used = max(self.ratios.values())
        self.clean_immediately = used > s.diskSpaceCleanForciblyRatio
        if used > s.diskSpaceWarningLevelRatio:
            if not self.control.has_flag(FLAG_DISK_FULL):
                log.error("disk full: %.1f%% used (diskSpaceWarningLevelRatio %s): sends are refused until "
                          "cleaning frees space", used * 100, s.diskSpaceWarningLevelRatio)
            self.control.set_flag(FLAG_DISK_FULL, True)
            self.clean_immediately = True
        elif used <= s.diskSpaceCleanForciblyRatio and self.control.has_flag(FLAG_DISK_FULL):
            # (between the two ratios the flag stays as it is, as RocketMQ's isSpaceToDelete keeps
            # it: a disk that cleaning took just under the warning level is not refused and taken
            # again at every look)
            self.control.set_flag(FLAG_DISK_FULL, False)
            log.warning("disk no longer full: %.1f%% used: sends are taken again", used * 100)
        self.space_trigger = used > self.max_used
        segment_need = s.mappedFileSizeCommitLog + s.commitlog_headroom
        free = self.room(s.commitlog_dir)
        room = free >= segment_need
        if room != self.segment_room:
            # (a small disk at full speed turns this over at every segment: said once a minute)
            said = now - self.room_said_at < ROOM_SAID_S
            (log.debug if said else log.info if room else log.warning)(
                "the CommitLog's disk %s room for another %d-byte segment and its %d bytes of headroom%s",
                "has" if room else "has no", s.mappedFileSizeCommitLog, s.commitlog_headroom,
                "" if room else ": cleaning at once")
            if not room and not said:
                self.room_said_at = now
            self.segment_room = room
        if not room:
            self.space_trigger = self.clean_immediately = True
        if free < 2 * segment_need or self.control.has_flag(FLAG_DISK_FULL):
            # sends wait (or will, once the allocator has made the next segment) on the look that
            # finds no room, and on the one after the cleaning: soon, not a cleanResourceInterval
            # away; a small disk at full speed fills a segment in seconds
            self.next_check = min(self.next_check, now + TIGHT_CHECK_S)
        time_up = self.local_hour(self.wall_ms()) in self.hours
        if self.manual_passes > 0:
            self.manual_passes -= 1
            force = any(request.force for request in self.manual)
            self._start(Pass("manual", force or (self.clean_immediately and s.cleanFileForciblyEnable), now))
        elif self.space_trigger or time_up:
            forced = self.clean_immediately and s.cleanFileForciblyEnable
            self._start(Pass("space" if self.space_trigger else "time", forced, now))

    def _start(self, run: Pass) -> None:
        self.passes += 1
        self.last_pass_ms = self.wall_ms()
        self.running = run

    # -- CommitLog segments --------------------------------------------------------------------------

    def _delete_one(self, now: float) -> None:
        """Delete the oldest segment if it may go, else end the pass."""
        run, s = self.running, self.settings
        segments = _segments(s.commitlog_dir)
        oldest = segments[0] if len(segments) > 1 else None  # never the last one
        safe_end = min(self.control.get("flushed"), self.control.get("dispatched"))
        if oldest is None:
            return self._end_pass(now, "only the segment being written is left")
        if int(oldest.name) + s.mappedFileSizeCommitLog > safe_end:
            return self._end_pass(now, "the oldest segment is not yet flushed and dispatched whole")
        if now < self.hanged_until:
            return self._end_pass(now, "the oldest segment could not be deleted; retried later")
        try:
            stat = oldest.stat()
        except FileNotFoundError:
            return self._end_pass(now, "the oldest segment vanished")
        if not run.forced and stat.st_mtime_ns // 1_000_000 + self.reserved_ms > self.wall_ms():
            return self._end_pass(now, "the oldest segment is younger than fileReservedTime")
        unarchived = self._unarchived(oldest, stat.st_size) if s.tieredArchiveDir else None
        if unarchived:
            return self._end_pass(now, unarchived)
        new_min = int(segments[1].name)
        invariant(new_min >= self.control.get("min_offset"), "the CommitLog's min offset only moves forward")
        self.control.set("min_offset", new_min)  # readers first: published before the unlink
        _drop_cached_pages(oldest)
        try:
            oldest.unlink()
        except FileNotFoundError:
            pass
        except OSError:
            self.hanged += 1  # retried after redeleteHangedFileInterval
            self.hanged_until = now + s.redeleteHangedFileInterval / 1000
            return self._end_pass(now, "the oldest segment could not be deleted; retried later")
        self._deleted()
        cause = "manual" if run.cause == "manual" else "forced" if run.forced else run.cause
        self.deleted_files[cause] += 1
        self.deleted_bytes[cause] += stat.st_size
        log.info("deleted CommitLog segment %s (%d bytes, %s)", oldest.name, stat.st_size, cause)
        for request in self.manual:
            request.deleted.append({"file": oldest.name, "bytes": stat.st_size, "cause": cause})
        run.deleted += 1
        if run.deleted >= DELETE_MAX_PER_PASS:
            return self._end_pass(now, f"{DELETE_MAX_PER_PASS} deleted: the most a pass deletes")
        run.next_at = now + s.deleteCommitLogFilesInterval / 1000

    def _unarchived(self, segment: Path, size: int) -> str | None:
        """With `tieredArchiveDir`, why `segment` may not go yet: a segment goes only once the
        archive's manifest holds it (never data that exists nowhere else); an unreadable
        manifest holds nothing."""
        try:
            manifest = archive_manifest.read(Path(self.settings.tieredArchiveDir).expanduser())
        except (archive_manifest.ManifestError, OSError) as e:
            return f"the tiered archive cannot be read: {e}"
        if not archive_manifest.holds(manifest, segment.name, size):
            return "the oldest segment is not yet in the tiered archive (scripts/pipeline archive)"
        return None

    def _end_pass(self, now: float, why: str) -> None:
        run, self.running = self.running, None
        self.last_stop = why
        if run.deleted:
            self.clean_logics(now)
        if run.cause == "manual":
            if run.deleted and self.manual_passes > 0:
                self.next_check = now  # the next manual pass at once
            else:  # done: answer the requests this run of passes served (a later one gets its own)
                done = [request for request in self.manual if self.passes > request.after_pass]
                for request in done:
                    request.stop = why
                self.manual = [request for request in self.manual if self.passes <= request.after_pass]
                self.finished += done
                self.manual_passes = MANUAL_PASSES if self.manual else 0
        elif run.deleted >= DELETE_MAX_PER_PASS and self.space_trigger:
            self.next_check = now  # still over the ratio: keep up with the appends

    # -- ConsumeQueue and index files ------------------------------------------------------------------

    def clean_logics(self, now: float) -> None:
        """ConsumeQueue and index files below the min offset, queue by queue from `now` (after a
        pass deleted segments; and once at start: a crash may have come between the two)."""
        self.queues_to_clean = [queue for topic in sorted(self._dirs(self.settings.consumequeue_dir))
                                for queue in sorted(self._dirs(topic))]
        self.index_pending = True
        self.next_queue_at = now

    @staticmethod
    def _dirs(path: Path) -> list[Path]:
        try:
            return [p for p in path.iterdir() if p.is_dir()]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def _clean_logics(self, now: float) -> None:
        """One queue per step (a pause after one that lost files), then the index files."""
        min_offset = self.control.get("min_offset")
        if self.queues_to_clean:
            lost = self._clean_queue(self.queues_to_clean.pop(0), min_offset)
            if lost:
                self._deleted()
            self.cq_files_deleted += lost
            self.next_queue_at = now + (self.settings.deleteConsumeQueueFilesInterval / 1000 if lost else 0)
            return
        self.index_pending = False
        files = sorted(p for p in self.settings.index_dir.iterdir() if p.name.isdigit()) \
            if self.settings.index_dir.is_dir() else []
        for path in files[:-1]:
            if self._index_end(path) >= min_offset:
                break
            path.unlink(missing_ok=True)
            self.index_files_deleted += 1
            self._deleted()

    def _deleted(self) -> None:
        """Tell every process that files are gone: each drops its mappings of them at its next turn."""
        self.control.set("deletions", self.control.get("deletions") + 1)

    @staticmethod
    def _clean_queue(directory: Path, min_offset: int) -> int:
        """Delete the queue's files (never its last) whose last entry points below `min_offset`."""
        lost = 0
        files = _segments(directory)
        for path in files[:-1]:
            phy = last_entry_offset(path)
            if phy is None or phy >= min_offset:  # (unreadable: kept, and the files after it)
                break
            path.unlink(missing_ok=True)
            lost += 1
        return lost

    @staticmethod
    def _index_end(path: Path) -> int:
        end = end_phy_offset(path)
        return 2**63 - 1 if end is None else end  # unreadable: keep it

    def statistics(self) -> dict:
        return {"passes": self.passes, "checks": self.checks, "deletedFiles": dict(self.deleted_files),
                "deletedBytes": dict(self.deleted_bytes), "consumeQueueFilesDeleted": self.cq_files_deleted,
                "indexFilesDeleted": self.index_files_deleted, "hangedFiles": self.hanged,
                "lastPassMs": self.last_pass_ms, "lastPassStop": self.last_stop, "diskRatio": dict(self.ratios),
                "diskFull": self.control.has_flag(FLAG_DISK_FULL), "cleanImmediately": self.clean_immediately,
                "segmentRoom": self.segment_room,
                "minOffset": self.control.get("min_offset")}


class Clean(Actor):
    """The clean service's process (in both topologies): `admin clean` requests from the front's
    `clean` socket, their answers through `replies`."""

    name = "clean"

    def __init__(self, settings, **kwargs):
        super().__init__(settings, **kwargs)
        self.core: CleanCore | None = None  # opened by `open`, given the control block
        self.niceness = 0

    def open(self) -> None:
        # Deleting is background work: freeing a segment's pages costs CPU that the front and
        # the clients should have first (on two cores it doubled the ack p99 at nice 0).
        self.niceness = give_way(CLEAN_NICENESS)
        self.core = CleanCore(self.settings, self.control)
        if self.control.get("min_offset") > 0:
            self.core.clean_logics(time.monotonic())
        self.requests = socket(self.context, zmq.PULL, hwm=1000)
        self.requests.connect(self.endpoints["clean"])
        self.replies = socket(self.context, zmq.PUSH, hwm=1000)
        self.replies.connect(self.endpoints["replies"])
        self.items = [(self.requests, zmq.POLLIN)]
        self.wait_s = 0.0

    def poll_items(self) -> list:
        return self.items

    def timeout_ms(self) -> int:
        return max(1, min(200, int(self.wait_s * 1000)))

    def step(self, events: set) -> None:
        if self.requests in events:
            for frames in incoming(self.requests, 100):
                self._take(frames)
        self.wait_s = self.core.step(time.monotonic())
        if self.core.finished:
            done, self.core.finished = self.core.finished, []
            self.replies.send(pack_replies([self._answer(request) for request in done]))

    def _take(self, frames: list[bytes]) -> None:
        client, meta, header_raw, _ = frames  # the front's own frames: one that does not split is a bug
        header = orjson.loads(header_raw)
        self.core.request_manual((client, orjson.loads(meta)["t"], header.get("opaque")),
                                 force=header.get("force") is True)

    @staticmethod
    def _answer(request: ManualRequest) -> tuple:
        client, arrival, opaque = request.reply_to
        header = protocol.reply_header(opaque, "OK", deleted=request.deleted, count=len(request.deleted),
                                       bytes=sum(d["bytes"] for d in request.deleted), stopped=request.stop)
        return (client, -arrival, orjson.dumps(header))

    def statistics(self) -> dict:
        return super().statistics() | (self.core.statistics() if self.core is not None else {})

    def drain(self) -> None:
        self.core.finished += self.core.manual  # answered with what they deleted so far
        self.core.manual = []
        if self.core.finished:
            self.replies.send(pack_replies([self._answer(request) for request in self.core.finished]))
