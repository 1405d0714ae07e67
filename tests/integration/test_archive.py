"""`scripts/pipeline archive` on real local Spark: a store's sealed segments become a plain Parquet
dataset equal to the store's records; a second run archives nothing; a run killed with -9 is
completed by the next without duplicates; a segment changed after archiving is refused."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import orjson
import pyarrow.dataset as ds
import pytest
from golden import GOLDEN_STORE
from nodes import ROOT

from node.pipeline.archive import MANIFEST, ArchiveError, run, sealed
from node.pipeline.offline import SegmentReport, read_segment, walk
from actors.tiered import ArchiveDamaged as TieredArchiveDamaged
from actors.tiered import TieredArchive
from shm.codec import decode

pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow


def stored_records(store) -> set[tuple]:
    return {(r["topic"], r["queueId"], r["queueOffset"], r["commitLogOffset"], r["body"])
            for segment in sealed(str(store)) for batch in read_segment(segment) for r in batch.to_pylist()}


def archived_records(target) -> list[tuple]:
    table = ds.dataset(target, format="parquet", partitioning="hive").to_table()  # no mqnode code
    return [(r["topic"], r["queueId"], r["queueOffset"], r["commitLogOffset"], r["body"]) for r in table.to_pylist()]


@pytest.fixture
def store(tmp_path):
    copy = tmp_path / "store"
    shutil.copytree(GOLDEN_STORE, copy)
    return copy


def test_the_archive_equals_the_sealed_segments_and_a_second_run_archives_nothing(spark, store, tmp_path):
    target = tmp_path / "archive"
    done = run(spark, str(store), str(target))
    assert len(done["archived"]) == len(sealed(str(store))) == 15  # all but the segment being written
    rows = archived_records(target)
    assert len(rows) == len(set(rows)) == done["rows"] and set(rows) == stored_records(store)
    assert all(p.parent.parent.name.startswith("topic=") and p.parent.name.startswith("date=")
               for p in target.rglob("*.parquet"))
    assert run(spark, str(store), str(target))["archived"] == []
    manifest = orjson.loads((target / MANIFEST).read_bytes())
    assert set(manifest["segments"]) == set(done["archived"])
    assert spark.read.parquet(str(target)).count() == len(rows)


def test_tiered_reads_give_back_the_golden_records_byte_for_byte(spark, store, tmp_path):
    """What a node with `tieredArchiveDir` serves: every archived record of RocketMQ 4.9's store,
    queue by queue from the archive's min offset, the very bytes of the CommitLog."""
    run(spark, str(store), str(tmp_path / "archive"))
    stored = {}
    for segment in sealed(str(store)):
        for chunk in walk(segment, SegmentReport()):
            at = 0
            while at < len(chunk):
                record = decode(chunk, at)
                stored[(record.topic, record.queue_id, record.queue_offset)] = bytes(chunk[at: at + record.total_size])
                at += record.total_size
    archive, served = TieredArchive(tmp_path / "archive"), {}
    for topic, queue_id in {key[:2] for key in stored}:
        offset = archive.min_offset(topic, queue_id)
        while (read := archive.read(topic, queue_id, offset, 32, 1 << 20, None, 1 << 62)) is not None:
            assert read.records and read.next_begin > offset
            served.update({key: raw for raw in read.records
                           for key in [(decode(raw).topic, decode(raw).queue_id, decode(raw).queue_offset)]})
            offset = read.next_begin
    assert served == stored and len(stored) == 587  # the manifest's 623 less the segment being written
    # SEARCH_OFFSET_BY_TIMESTAMP over the archive: the nearest store time, the earlier on a tie
    # (and with the store beginning halfway, its first message a candidate too: None, the store's answer)
    for topic, queue_id in {key[:2] for key in stored}:
        rows = sorted((key[2], decode(raw).store_timestamp) for key, raw in stored.items()
                      if key[:2] == (topic, queue_id))
        half = len(rows) // 2
        for candidates, below, below_ms in ((rows, 1 << 62, None),
                                            (rows[:half] + [(None, rows[half][1])], rows[half][0], rows[half][1])):
            for stamp in {rows[0][1] - 1, rows[-1][1] + 1, *(t for _, t in rows), *(t + 1 for _, t in rows)}:
                expected = _nearest(candidates, stamp)
                assert archive.offset_by_time(topic, queue_id, stamp, below, below_ms) == expected, (
                    topic, queue_id, stamp, below)


def _nearest(rows: list, stamp: int):
    """A brute force of the search by time: the offset stored nearest `stamp`, the earlier on a tie."""
    after = next((i for i, (_, t) in enumerate(rows) if t >= stamp), None)
    if after is None:
        return None
    if after and stamp - rows[after - 1][1] <= rows[after][1] - stamp:
        return rows[after - 1][0]
    return rows[after][0]


def test_a_damaged_archive_is_reported_and_never_served(spark, store, tmp_path):
    """A file whose index columns disagree with its records raises (the pull answers SYSTEM_ERROR);
    a segment whose file cannot be read is left out while the others are indexed, and a read that
    would skip offsets that may be in it raises too."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    target = tmp_path / "archive"
    run(spark, str(store), str(target))
    segments = orjson.loads((target / MANIFEST).read_bytes())["segments"]
    first, last = sorted(segments)[0], sorted(segments)[-1]
    shifted = target / segments[first]["files"][0]  # its queue offsets moved by one: not its records
    table = pq.read_table(shifted)
    table = table.set_column(table.schema.get_field_index("queueOffset"), "queueOffset",
                             pc.add(table.column("queueOffset"), 1))
    pq.write_table(table, shifted, row_group_size=2048)
    unreadable = target / segments[last]["files"][0]
    unreadable.write_bytes(b"not parquet")
    archive = TieredArchive(target)
    archive.refresh()
    assert archive.failures == 1 and "cannot be read" in archive.last_error and last not in archive.indexed
    assert len(archive.indexed) == len(segments) - 1
    # (the first segment holds each of its queues' first offsets; golden topics need no percent-encoding)
    queue = next(key for key in archive.queues if key[0] == shifted.parent.parent.name.removeprefix("topic="))
    with pytest.raises(TieredArchiveDamaged, match="says"):
        archive.read(*queue, archive.min_offset(*queue), 32, 1 << 20, None, 1 << 62)
    with pytest.raises(TieredArchiveDamaged, match=f"segments {last}"):  # (what may be in it is not skipped)
        archive.read(*queue, archive.min_offset(*queue) - 1, 32, 1 << 20, None, 1 << 62)


def test_a_run_killed_with_9_is_completed_by_the_next_without_duplicates(spark, store, tmp_path):
    target = tmp_path / "archive"
    job = subprocess.Popen([sys.executable, "-m", "node.tools.pipeline", "archive", "--store", str(store),
                            "--archive", str(target), "--master", "local[2]"], cwd=ROOT, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (target / MANIFEST).exists() and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.005)
    subprocess.run(["pkill", "-9", "-g", str(job.pid)], check=False)  # mid-commit, with its Spark
    job.wait(30)
    before = orjson.loads((target / MANIFEST).read_bytes()) if (target / MANIFEST).exists() else {"segments": {}}
    run(spark, str(store), str(target))
    rows = archived_records(target)
    assert len(rows) == len(set(rows)) and set(rows) == stored_records(store)
    assert len(orjson.loads((target / MANIFEST).read_bytes())["segments"]) == 15 >= len(before["segments"])


def test_a_segment_changed_after_archiving_is_refused(spark, store, tmp_path):
    target = tmp_path / "archive"
    run(spark, str(store), str(target))
    first = sealed(str(store))[0]
    with open(first.path, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(ArchiveError, match="changed after it was archived"):
        run(spark, str(store), str(target))
