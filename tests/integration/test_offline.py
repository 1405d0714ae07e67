"""Reading store directories without a node, on a real local Spark: the golden RocketMQ 4.9 store
reads as exactly its manifest's records; a torn tail is skipped; a CRC mismatch is counted, or
fails the read with mode=FAILFAST; topic and time filters; the lines of `scripts/pipeline count`."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import orjson
import pytest
from golden import GOLDEN_STORE, manifest

from node.pipeline.offline import SegmentReport, commitlog_dir, read_segment, segments
from node.tools.pipeline import _source_options, build_parser, counts
from shm.codec import decode

pyspark = pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow


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


def test_topic_and_time_filters_and_the_count_commands_lines(spark):
    topic_b = spark.read.format("mqnode").option("store", str(GOLDEN_STORE)).option("topic", "TopicB").load()
    assert topic_b.count() == sum(1 for r in manifest()["readback"] if r["msgTopic"] == "TopicB")
    times = sorted(r["storeTimestamp"] for r in manifest()["readback"])
    middle = times[len(times) // 2]
    later = (spark.read.format("mqnode").option("store", str(GOLDEN_STORE)).option("startingTimestamp", middle)
             .load().count())
    assert later == sum(1 for t in times if t >= middle)
    # the command's own flags: the same store flags as `archive`, `verify` and `dump`, accepted
    args = build_parser().parse_args(["count", "--store", str(GOLDEN_STORE), "--mappedFileSizeCommitLog", "65536",
                                      "--set", "maxHashSlotNum=500"])
    lines = counts(spark.read.format("mqnode").options(**_source_options(args)).load())
    assert sum(line["count"] for line in lines if line["topic"] == "TopicB") == topic_b.count()
    assert sum(line["count"] for line in lines) == 623
    with pytest.raises(SystemExit, match="--starting-offsets, --subscription read from a node"):
        _source_options(build_parser().parse_args(["count", "--store", str(GOLDEN_STORE), "--starting-offsets",
                                                   "earliest", "--subscription", "TagA"]))
    for option, value in (("startingOffsets", '{"TopicB": {"0": 5}}'), ("subscription", "TagA"),
                          ("endpoint", "tcp://127.0.0.1:1")):  # (ignored: every message was read)
        with pytest.raises(Exception, match=f"option `{option}` is for reads from a node"):
            spark.read.format("mqnode").option("store", str(GOLDEN_STORE)).option(option, value).load().count()


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


def test_the_summary_of_the_golden_store_matches_counts_made_without_spark(spark, tmp_path):
    from collections import Counter

    from node.pipeline import summary

    records = [r for segment in segments(commitlog_dir(str(GOLDEN_STORE))) for batch in read_segment(segment)
               for r in batch.to_pylist()]
    result = summary.compute(spark.read.format("mqnode").option("store", str(GOLDEN_STORE)).load())
    assert result["messages"] == len(records) == 623
    assert result["bytes"] == sum(len(r["body"]) for r in records)
    by_topic = Counter(r["topic"] for r in records)
    assert {t: v["messages"] for t, v in result["topics"].items()} == dict(by_topic)
    assert sum(p["messages"] for p in result["topics"]["TopicA"]["overTime"]) == by_topic["TopicA"]
    assert sum(h["messages"] for h in result["bodySizes"]["histogram"]) == 623
    assert result["bodySizes"]["max"] == max(len(r["body"]) for r in records)
    tags = Counter(r["tags"] for r in records if r["tags"] is not None)
    most = max(tags.values())
    assert result["topTags"][0]["messages"] == most and tags[result["topTags"][0]["value"]] == most
    summary.write(result, tmp_path / "report")
    for name in ("summary.json", "report.html", *summary.PLOTS):
        assert (tmp_path / "report" / name).stat().st_size > 0
    assert "TopicA" in summary.table(result)


def test_register_says_what_to_set_when_sparks_workers_would_run_another_python(spark, tmp_path, monkeypatch):
    """A job run by the project's Python, not activated: PYSPARK_PYTHON unset, and the `python3`
    first on PATH one without the connector's packages. register() says so before any query.
    (The module's session, as a session made with PYSPARK_PYTHON unset has it: PySpark's
    SparkContext takes `python3` then; a session of its own would start a second JVM.)"""
    from node.pipeline import WorkerPythonError, register

    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nexec {shutil.which('python3', path='/usr/bin:/bin')} -I -S \"$@\"\n")  # no site-packages
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(spark.sparkContext, "pythonExec", "python3")
    with pytest.raises(WorkerPythonError) as refused:
        register(spark)
    assert f"set PYSPARK_PYTHON={sys.executable} before creating the Spark session" in str(refused.value)
    assert "cannot import the mqnode connector" in str(refused.value)


def test_register_names_a_file_of_the_working_directory_that_shadows_a_module(spark, tmp_path, monkeypatch):
    """Spark's Python workers start with the working directory first on sys.path: a user's queue.py
    there stops them importing the connector. register() says so (not "set PYSPARK_PYTHON" to the
    interpreter they already run); with PYTHONSAFEPATH=1 (scripts/pipeline sets it) they pass it over."""
    from node.pipeline import WorkerPythonError, register

    (tmp_path / "queue.py").write_text("raise SystemExit('the user\\'s queue.py was imported')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", sys.executable)
    with pytest.raises(WorkerPythonError) as refused:
        register(spark)
    assert f"in {tmp_path}: a file there may shadow a module" in str(refused.value), str(refused.value)
    assert "the user's queue.py was imported" in str(refused.value)
    monkeypatch.setenv("PYTHONSAFEPATH", "1")
    register(spark)


def test_scripts_pipeline_runs_on_a_host_whose_name_does_not_resolve(tmp_path):
    """A container's or laptop's hostname in no /etc/hosts or DNS: Spark's start resolved it and
    died (UnknownHostException, then JAVA_GATEWAY_EXITED). A local Spark binds 127.0.0.1
    (SPARK_LOCAL_IP, node.tools.pipeline.spark_session). The name is changed in a UTS namespace of
    the command's own (root's `unshare -u`; skipped where the host allows none)."""
    from nodes import ROOT

    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-u", "true"], capture_output=True).returncode != 0:
        pytest.skip("no UTS namespace of its own for a test here")
    command = (f"hostname mqnode-no-such-host-{os.getpid()} && cd {shlex.quote(str(tmp_path))} && exec "
               f"{shlex.quote(str(ROOT / 'scripts' / 'pipeline'))} count --store {shlex.quote(str(GOLDEN_STORE))} "
               "--mappedFileSizeCommitLog 65536")
    env = {k: v for k, v in os.environ.items() if k != "SPARK_LOCAL_IP"}
    done = subprocess.run([unshare, "-u", "sh", "-c", command], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sum(orjson.loads(line)["count"] for line in done.stdout.splitlines()) == 623
