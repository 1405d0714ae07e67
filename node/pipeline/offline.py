"""Reading a store directory without a node: the `store` option of the `mqnode` data source.

One Spark partition per CommitLog segment file (a segment's name is its first offset, its size
is the segment size, so no setting is needed to find them; `storePathCommitLog` may point
elsewhere, as in the store's settings). Each segment is mapped read-only and walked with the
codec's `scan` (no Record objects): runs of valid records become Arrow batches through the same
`to_batch` the node reads use, so the columns are identical. What a segment holds after its last
record is not data: a blank (the end-of-file filler), zeros, or a torn tail a crash left, which
is skipped, as recovery would cut it. A record whose body CRC does not match is counted
(`SegmentReport.crc_errors`) and skipped; with `mode=FAILFAST` it fails the read. Reads
RocketMQ 4.9 stores as well as mqnode's.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from node.pipeline.rows import ARROW_SCHEMA, to_batch
from shm.codec import Blank, Corruption, CorruptionKind, scan

BATCH_BYTES = 4 * 1024 * 1024  # records per Arrow batch: about this much CommitLog
UNITS = {"s": 1, "ms": 1000, "us": 1_000_000, "ns": 1_000_000_000}  # a timestamp unit's ticks per second


class CorruptStore(RuntimeError):
    """mode=FAILFAST and a record's body CRC does not match."""


@dataclass(frozen=True)
class Segment:
    path: str
    start: int  # the CommitLog offset of its first byte
    size: int


@dataclass
class SegmentReport:
    records: int = 0
    crc_errors: int = 0
    torn_at: int | None = None  # where a torn tail began (None: the segment ended cleanly)
    errors: list[str] = field(default_factory=list)


def commitlog_dir(store: str, commitlog: str | None = None) -> Path:
    path = Path(os.path.expanduser(commitlog)) if commitlog else Path(os.path.expanduser(store)) / "commitlog"
    if not path.is_dir():
        raise FileNotFoundError(f"no CommitLog at {path} (is {store} a store directory?)")
    return path


def segments(directory: Path) -> list[Segment]:
    """The segment files, in offset order (names of 20 digits; anything else is not ours)."""
    found = [Segment(str(p), int(p.name), p.stat().st_size) for p in directory.iterdir()
             if p.name.isdigit() and len(p.name) == 20 and p.is_file()]
    return sorted(found, key=lambda s: s.start)


def walk(segment: Segment, report: SegmentReport, *, failfast: bool = False) -> Iterator[bytes]:
    """Runs of whole, valid records of `segment` (copied out of the mapping), each about
    BATCH_BYTES at most."""
    if segment.size == 0:
        return
    with open(segment.path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        pos = 0
        while pos < segment.size:
            limit = min(segment.size, pos + BATCH_BYTES)
            result = scan(buf, pos, limit)
            stop = result.stopped_by
            edge = isinstance(stop, Corruption) and stop.kind == CorruptionKind.TRUNCATED and limit < segment.size
            if edge and result.end == pos:  # one record larger than a window: scan it whole
                result = scan(buf, pos, min(segment.size, pos + stop.size))
                stop, edge = result.stopped_by, False
            if result.end > pos:
                report.records += result.records
                yield buf[pos:result.end]
            pos = result.end
            if stop is None or edge:
                continue  # the window's end: go on from the record that crossed it
            if isinstance(stop, Blank):
                return  # the filler to the segment's end
            if stop.kind == CorruptionKind.CRC_MISMATCH:
                report.crc_errors += 1
                report.errors.append(f"{segment.path}: offset {segment.start + pos}: {stop.detail}")
                if failfast:
                    raise CorruptStore(report.errors[-1])
                pos += stop.size  # its sizes were consistent: skip just this record
                continue
            if stop.kind != CorruptionKind.END_OF_DATA:
                report.torn_at = segment.start + pos  # a torn tail: what follows is not data
            return
    finally:
        buf.close()


def read_segment(segment: Segment, *, topics: frozenset[str] | None = None, since_ms: int | None = None,
                 until_ms: int | None = None, failfast: bool = False, schema: pa.Schema = ARROW_SCHEMA,
                 report: SegmentReport | None = None) -> Iterator[pa.RecordBatch]:
    """`segment`'s records as Arrow batches of `schema`, only `topics` (all when None) stored in
    [since_ms, until_ms)."""
    report = report if report is not None else SegmentReport()
    for run in walk(segment, report, failfast=failfast):
        batch = to_batch([run], 2**63 - 1, schema=schema)
        mask = None
        if topics is not None:
            mask = pc.is_in(batch.column("topic"), value_set=pa.array(sorted(topics), pa.string()))
        stored = None
        for bound, compare in ((since_ms, pc.greater_equal), (until_ms, pc.less)):
            if bound is not None:
                kind = schema.field("storeTimestamp").type
                stored = stored if stored is not None else pc.cast(batch.column("storeTimestamp"), pa.int64())
                test = compare(stored, pa.scalar(bound * UNITS[kind.unit] // 1000, pa.int64()))
                mask = test if mask is None else pc.and_(mask, test)
        if mask is not None:
            batch = batch.filter(mask)
        if batch.num_rows:
            yield batch
