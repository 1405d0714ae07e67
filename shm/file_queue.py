"""An ordered run of same-sized segment files in one directory, addressed by global offset.

The file for offset `o` is the one named `o - o % size`, at position `o % size`. Adjacent files
differ by exactly one segment size; a gap, a file of the wrong size, or a stray name is a named
error at load (the CommitLog is the truth and is never silently skipped over). One gap is mended
by the CommitLog writer's load (`drop_blank_after_gap`): files after it that hold not a byte (made
ahead, never written: the allocator before 13a59b7 could make the segment after one a full disk
refused) are deleted and named in `dropped_after_gap`; a gap with anything written after it stays
an error. (A ConsumeQueue with a gap stays an error too: its store rebuilds it whole from the
CommitLog, which the entries the missing file held need.)

Single writer: only the owning process appends, truncates and deletes. Readers in other processes
open the queue `readonly` and call `refresh()` to see files the writer added or removed.
"""

from __future__ import annotations

import re
from pathlib import Path

from shm.invariant import invariant
from shm.mapped_file import MappedFile, StoreError, file_name, retire

_SEGMENT_NAME = re.compile(r"^\d{20}$")


class SegmentGap(StoreError):
    pass


class MappedFileQueue:
    def __init__(self, directory: Path, file_size: int, *, readonly: bool = False, drop_blank_after_gap: bool = False,
                 keep_free: int = 0, blocks_ahead: int = 0):
        invariant(file_size > 0)
        self.directory = Path(directory)
        self.file_size = file_size
        self.readonly = readonly
        self.drop_blank_after_gap = drop_blank_after_gap and not readonly
        self.keep_free = keep_free  # what a new file leaves free on the disk (shm.mapped_file.allocate)
        self.blocks_ahead = blocks_ahead  # a file's blocks as it fills, this many bytes at a time (MappedFile)
        self.files: list[MappedFile] = []
        self.dropped_after_gap: list[str] = []
        if not readonly:
            self.directory.mkdir(parents=True, exist_ok=True)
        self.load()

    # -- loading -----------------------------------------------------------------------------

    def segment_paths(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.iterdir() if _SEGMENT_NAME.match(p.name))

    def load(self) -> None:
        """Map every segment on disk; positions are provisionally 'full' until recovery."""
        self.close()
        files = []
        try:
            for path in self.segment_paths():
                try:
                    files.append(MappedFile(path, self.file_size, readonly=self.readonly,
                                            blocks_ahead=self.blocks_ahead))
                except FileNotFoundError:
                    # a reader racing the clean service, which deletes from the head: a file
                    # listed a moment ago is gone; one missing elsewhere is a gap, refused below
                    if not self.readonly:
                        raise
        except StoreError:
            for f in files:
                f.close()
            raise
        self.files = self._drop_blank_after_gap(files) if self.drop_blank_after_gap else files
        self.check_contiguous()

    def _drop_blank_after_gap(self, files: list[MappedFile]) -> list[MappedFile]:
        for i, (before, after) in enumerate(zip(files, files[1:], strict=False)):
            if after.offset_start == before.offset_start + self.file_size:
                continue
            tail = files[i + 1:]
            if not all(f.holds_nothing() for f in tail):
                return files  # data after a gap: check_contiguous names it
            for f in tail:
                f.destroy()
                self.dropped_after_gap.append(f.path.name)
            return files[: i + 1]
        return files

    def check_contiguous(self) -> None:
        for before, after in zip(self.files, self.files[1:], strict=False):
            if after.offset_start != before.offset_start + self.file_size:
                raise SegmentGap(f"{self.directory}: segment {file_name(before.offset_start + self.file_size)} "
                                 f"is missing between {before.path.name} and {after.path.name}")
        if self.files and self.files[0].offset_start % self.file_size:
            raise SegmentGap(f"{self.files[0].path} does not start on a segment boundary")

    def refresh(self) -> None:
        """Readers: pick up segments the writer created and drop the ones it deleted, or replaced
        (a file under a known name that is not the one mapped is mapped afresh)."""
        known = {f.offset_start: f for f in self.files}
        on_disk = {int(p.name): p for p in self.segment_paths()}
        for start, f in list(known.items()):
            if start not in on_disk or not f.is_file_at(on_disk[start]):
                f.close()
                del known[start]
        for start, path in on_disk.items():
            if start not in known:
                try:
                    known[start] = MappedFile(path, self.file_size, readonly=True, blocks_ahead=self.blocks_ahead)
                except (FileNotFoundError, StoreError):
                    continue  # deleted meanwhile, or still being renamed into place
        self.files = [known[k] for k in sorted(known)]

    def forget_deleted_head(self) -> int:
        """Drop (never delete) the oldest files the clean service deleted: their mappings hold
        the space until closed, which a background thread does (`retire`). Returns how many."""
        dropped = 0
        while self.files and not self.files[0].is_file_at(self.files[0].path):
            retire(self.files.pop(0))
            dropped += 1
        return dropped

    # -- addressing ----------------------------------------------------------------------------

    @property
    def offset_min(self) -> int:
        return self.files[0].offset_start if self.files else 0

    @property
    def offset_written(self) -> int:
        if not self.files:
            return 0
        last = self.files[-1]
        return last.offset_start + last.position_written

    @property
    def offset_flushed(self) -> int:
        for f in self.files:
            if f.position_flushed < f.size:
                return f.offset_start + f.position_flushed
        return self.files[-1].offset_end if self.files else 0

    def last(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    def find(self, offset: int, *, first_if_missing: bool = False) -> MappedFile | None:
        if not self.files:
            return None
        first = self.files[0]
        index = (offset - first.offset_start) // self.file_size
        if 0 <= index < len(self.files):
            candidate = self.files[index]
            if candidate.offset_start <= offset < candidate.offset_end:
                return candidate
        for candidate in self.files:  # a list out of order (never expected) still resolves
            if candidate.offset_start <= offset < candidate.offset_end:
                return candidate
        return first if first_if_missing else None

    # -- writing ---------------------------------------------------------------------------------

    def create(self, offset_start: int) -> MappedFile:
        invariant(not self.readonly and offset_start % self.file_size == 0)
        last = self.last()
        invariant(last is None or offset_start == last.offset_end, (offset_start, last))
        mapped = MappedFile(self.directory / file_name(offset_start), self.file_size, create=True,
                            keep_free=self.keep_free, blocks_ahead=self.blocks_ahead)
        mapped.set_written(0)
        self.files.append(mapped)
        return mapped

    def last_writable(self, offset_if_empty: int = 0) -> MappedFile:
        """The file the next append goes to, creating the next one when the last is full."""
        last = self.last()
        if last is None:
            return self.create(offset_if_empty - offset_if_empty % self.file_size)
        if last.is_full():
            return self.create(last.offset_end)
        return last

    def truncate(self, offset: int) -> list[str]:
        """Drop everything at and after `offset`; returns the names of deleted files."""
        deleted = []
        for f in list(self.files):
            if f.offset_end <= offset:
                continue
            if f.offset_start <= offset:
                f.set_written(offset - f.offset_start)
            else:
                # A reader only forgets the file; the writer deletes it.
                f.close() if self.readonly else f.destroy()
                self.files.remove(f)
                deleted.append(f.path.name)
        return deleted

    def resume_at(self, offset: int) -> None:
        """A writer restarting on a running node: data ends at `offset` (the published counter).
        Files starting at or past it are forgotten, not deleted (the allocator may have made
        them; `last_writable` opens them again when it needs them)."""
        for f in list(self.files):
            if f.offset_start >= offset:
                f.close()
                self.files.remove(f)
                continue
            position = min(f.size, offset - f.offset_start)
            f.set_written(position)
            f.position_committed = f.position_flushed = position

    def delete_head(self, count: int) -> list[str]:
        """Delete up to `count` oldest files, never the last one."""
        deleted = []
        while count > 0 and len(self.files) > 1:
            f = self.files.pop(0)
            f.destroy()
            deleted.append(f.path.name)
            count -= 1
        return deleted

    def destroy(self) -> None:
        for f in self.files:
            f.destroy()
        self.files = []

    def flush(self) -> int:
        """Flush every file with unflushed data; returns the flushed global offset."""
        for f in self.files:
            if f.position_flushed < f.position_committed:
                f.flush()
        return self.offset_flushed

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []
