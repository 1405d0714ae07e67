"""`scripts/pipeline archive`: a store's sealed CommitLog segments into a Parquet archive.

The archive is a plain Parquet dataset (zstd), hive-partitioned by `topic` and `date` (UTC, of the
store time), each file sorted by queue and queue offset in row groups of ROW_GROUP rows, with the
connector's columns (`node.pipeline.rows`) and `envelope`, each record without its body, from
which a node with `tieredArchiveDir` gives back the stored bytes exactly (actors.tiered):
Spark, pandas and DuckDB read it with no mqnode code. Its `_manifest.json` (shm.archive_manifest;
the underscore keeps it out of every reader's data) records each archived segment: name, size,
CRC-32 of its bytes, rows, and the files it became.

Only sealed segments go: not the last one (the writer's), and on an mqnode store none past what
its control block says is flushed. Each segment is staged on a Spark task (one segment a task)
into `_staging/<segment>/`, then moved into place and recorded, one segment at a time, oldest
first; the manifest is rewritten whole (write, fsync, rename). So a second run archives nothing,
and a run killed at any instant leaves at most one segment's files moved but unrecorded, which
the next run removes before it stages that segment again (a file's name says its segment).
A segment in the manifest whose bytes changed since (another CRC) stops the run with an error.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from node.pipeline.offline import Segment, SegmentReport, commitlog_dir, read_segment, segments
from node.pipeline.rows import ARCHIVE_SCHEMA
from shm import archive_manifest as manifest_file

MANIFEST = manifest_file.FILE
STAGING = "_staging"
ROW_GROUP = 2048  # rows a row group: what a tiered read decodes at once (actors.tiered)


class ArchiveError(RuntimeError):
    """The archive and the store disagree: a segment changed after it was archived."""


@dataclass(frozen=True)
class Staged:
    segment: Segment
    crc: int
    rows: int
    crc_errors: int
    files: list[str]  # relative to the segment's staging directory


def segment_crc(path: str) -> int:
    from shm.codec import crc32  # (ISA-L's where installed, zlib's otherwise: the same checksum)

    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(8 * 1024 * 1024):
            crc = crc32(chunk, crc)
    return crc


def sealed(store: str, commitlog: str | None = None) -> list[Segment]:
    """Segments no writer will touch again: all but the last, and (an mqnode store) only those
    its control block says are flushed whole."""
    found = segments(commitlog_dir(store, commitlog))[:-1]
    control = Path(os.path.expanduser(store)) / "control"
    if control.exists():
        from shm.control_block import ControlBlock

        block = ControlBlock(control)
        try:
            flushed = block.get("flushed")
        finally:
            block.close()
        found = [s for s in found if s.start + s.size <= flushed]
    return found


def read_manifest(archive: Path) -> dict:
    try:
        return manifest_file.read(archive)
    except manifest_file.ManifestError as e:
        raise ArchiveError(str(e)) from None


def stage(segment: Segment, staging: str) -> Staged:
    """On an executor: one segment's records as zstd Parquet under `staging/<name>/`."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    report = SegmentReport()
    crc = segment_crc(segment.path)
    batches = list(read_segment(segment, report=report, schema=ARCHIVE_SCHEMA))
    target = Path(staging) / Path(segment.path).name
    shutil.rmtree(target, ignore_errors=True)
    if not batches:
        return Staged(segment, crc, 0, report.crc_errors, [])
    table = pa.Table.from_batches(batches)
    table = table.append_column("date", pc.strftime(table.column("storeTimestamp"), format="%Y-%m-%d"))
    table = table.sort_by([("topic", "ascending"), ("queueId", "ascending"), ("queueOffset", "ascending")])
    ds.write_dataset(table, target, format="parquet", partitioning=["topic", "date"], partitioning_flavor="hive",
                     basename_template=f"seg-{Path(segment.path).name}-{{i}}.parquet",
                     file_options=ds.ParquetFileFormat().make_write_options(compression="zstd"),
                     max_rows_per_group=ROW_GROUP, min_rows_per_group=ROW_GROUP,
                     existing_data_behavior="overwrite_or_ignore")
    files = sorted(str(p.relative_to(target)) for p in target.rglob("*.parquet"))
    return Staged(segment, crc, table.num_rows, report.crc_errors, files)


def _check_archived(manifest: dict, found: list[Segment]) -> None:
    for segment in found:
        entry = manifest["segments"].get(Path(segment.path).name)
        if entry is not None and (entry["size"] != segment.size or entry["crc"] != segment_crc(segment.path)):
            raise ArchiveError(f"segment {segment.path} changed after it was archived (size {segment.size}, "
                               f"archived {entry['size']} bytes with CRC {entry['crc']}): refusing to go on")


def _remove_unrecorded(archive: Path, manifest: dict) -> int:
    """A killed run's files: moved into place, their segment never recorded."""
    removed = 0
    for path in archive.glob("topic=*/date=*/seg-*.parquet"):
        name = path.name.split("-")[1]
        if name not in manifest["segments"]:
            path.unlink()
            removed += 1
    return removed


def _commit(archive: Path, staging: Path, staged: Staged, manifest: dict) -> None:
    name = Path(staged.segment.path).name
    source = staging / name
    for relative in staged.files:
        destination = archive / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source / relative, destination)
        manifest_file.fsync_dir(destination.parent)
    manifest["segments"][name] = {"size": staged.segment.size, "crc": staged.crc, "rows": staged.rows,
                                  "crcErrors": staged.crc_errors, "files": staged.files}
    manifest_file.write(archive, manifest)
    shutil.rmtree(source, ignore_errors=True)


def run(spark, store: str, archive_dir: str, commitlog: str | None = None) -> dict:
    """Archive what is sealed and not yet archived; returns what was done."""
    archive = Path(os.path.expanduser(archive_dir))
    archive.mkdir(parents=True, exist_ok=True)
    staging = archive / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    manifest = read_manifest(archive)
    removed = _remove_unrecorded(archive, manifest)
    found = sealed(store, commitlog)
    _check_archived(manifest, found)
    todo = [s for s in found if Path(s.path).name not in manifest["segments"]]
    done: list[Staged] = []
    if todo:
        staged_dir = str(staging)
        results = spark.sparkContext.parallelize(todo, len(todo)).map(lambda s: stage(s, staged_dir)).collect()
        for staged in sorted(results, key=lambda r: r.segment.start):
            _commit(archive, staging, staged, manifest)
            done.append(staged)
    shutil.rmtree(staging, ignore_errors=True)
    return {"archived": [Path(s.segment.path).name for s in done], "rows": sum(s.rows for s in done),
            "bytes": sum(s.segment.size for s in done), "crcErrors": sum(s.crc_errors for s in done),
            "alreadyArchived": len(found) - len(todo), "removedUnrecorded": removed}
