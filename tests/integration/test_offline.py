"""Reading store directories without a node, on a real local Spark: the golden RocketMQ 4.9 store
reads as exactly its manifest's records; a torn tail is skipped; a CRC mismatch is counted, or
fails the read with mode=FAILFAST; topic and time filters; `scripts/pipeline count --store`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import orjson
import pytest
from golden import GOLDEN_STORE, manifest
from nodes import ROOT

from node.pipeline.offline import SegmentReport, commitlog_dir, read_segment, segments
from shm.codec import decode

pyspark = pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    from node.pipeline import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2]").appName("mqnode-offline-tests")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
    register(session)
    yield session
    session.stop()


def test_the_golden_store_reads_as_exactly_its_manifests_records(spark):
    frame = spark.read.format("mqnode").option("store", str(GOLDEN_STORE)).load()
    rows = frame.select("topic", "queueId", "queueOffset", "commitLogOffset", "offsetMsgId", "properties",
                        "bornTimestamp").collect()
    expected = {(r["msgTopic"], r["msgQueueId"], r["msgQueueOffset"], r["msgCommitLogOffset"], r["msgId"])
                for r in manifest()["readback"]}
    assert len(rows) == 623 == len(expected)
    assert {(r.topic, r.queueId, r.queueOffset, r.commitLogOffset, r.offsetMsgId) for r in rows} == expected
    by_offset = {r["msgCommitLogOffset"]: r for r in manifest()["readback"]}
    for row in rows:
        assert dict(row.properties) == by_offset[row.commitLogOffset]["properties"]
    assert frame.rdd.getNumPartitions() == len(segments(commitlog_dir(str(GOLDEN_STORE))))  # one a segment


def test_topic_and_time_filters_and_the_count_command(spark):
    topic_b = spark.read.format("mqnode").option("store", str(GOLDEN_STORE)).option("topic", "TopicB").load()
    assert topic_b.count() == sum(1 for r in manifest()["readback"] if r["msgTopic"] == "TopicB")
    times = sorted(r["storeTimestamp"] for r in manifest()["readback"])
    middle = times[len(times) // 2]
    later = (spark.read.format("mqnode").option("store", str(GOLDEN_STORE)).option("startingTimestamp", middle)
             .load().count())
    assert later == sum(1 for t in times if t >= middle)
    done = subprocess.run([sys.executable, "-m", "node.tools.pipeline", "count", "--store", str(GOLDEN_STORE),
                           "--master", "local[1]"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert sum(line["count"] for line in lines if line["topic"] == "TopicB") == topic_b.count()
    assert sum(line["count"] for line in lines) == 623


def _damaged_copy(tmp_path):
    store = tmp_path / "store"
    shutil.copytree(GOLDEN_STORE, store)
    last = segments(commitlog_dir(str(store)))[-1]
    first = segments(commitlog_dir(str(store)))[0]
    return store, first, last


def test_a_torn_tail_is_skipped_and_a_crc_mismatch_counted_or_fatal(spark, tmp_path):
    store, first, last = _damaged_copy(tmp_path)
    report = SegmentReport()
    whole = sum(b.num_rows for b in read_segment(last, report=report))
    start, end = last_record(last)
    with open(last.path, "r+b") as f:  # tear the last record: its header written, the rest zeros
        f.seek(start + 8)
        f.write(b"\x00" * (end - start - 8))
    torn = SegmentReport()
    assert sum(b.num_rows for b in read_segment(last, report=torn)) == whole - 1 and torn.torn_at is not None
    with open(first.path, "r+b") as f:  # flip a byte of the first record's body (IPv4 hosts: at 88)
        assert len(decode(f.read(), 0).body) > 0
        f.seek(88)
        byte = f.read(1)
        f.seek(88)
        f.write(bytes([byte[0] ^ 0xFF]))
    counted = SegmentReport()
    rows = sum(b.num_rows for b in read_segment(first, report=counted))
    assert counted.crc_errors == 1 and rows == counted.records
    assert spark.read.format("mqnode").option("store", str(store)).load().count() == 623 - 2
    with pytest.raises(Exception, match="CRC"):
        spark.read.format("mqnode").option("store", str(store)).option("mode", "FAILFAST").load().collect()


def last_record(segment) -> tuple[int, int]:
    """Where the segment's last record starts and ends."""
    with open(segment.path, "rb") as f:
        data = f.read()
    position, last = 0, (0, 0)
    while True:
        record = decode(data, position)
        if not hasattr(record, "total_size"):
            return last
        last = (position, position + record.total_size)
        position += record.total_size
