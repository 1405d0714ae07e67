"""Tiered reads end to end, with a real `mqnode start` process on 1 MiB segments and a real local
Spark: with `tieredArchiveDir`, `admin clean --force` deletes nothing the archive does not hold;
after `pipeline archive` it deletes the archived segments, and pulls below the store's min
offset come back from the archive as the very bytes that were stored, so a consumer from the
first offset, `mqnode consume --from first` and the Spark connector read the whole history."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from nodes import ROOT, NodeProcess, node_settings

from node import protocol
from node.client import Message, Producer, PullConsumer
from node.pipeline.archive import run as archive
from shm.codec import decode

pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow
TOPIC, QUEUES, BATCHES = "Tiered", 4, 48


def _cli(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "node.tools.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout)


def _pull(producer: Producer, queue_id: int, offset: int, subscription: str = "*") -> tuple[dict, bytes]:
    reply, body = producer.request({"code": protocol.PULL_MESSAGE, "topic": TOPIC, "queueId": queue_id,
                                    "queueOffset": offset, "maxMsgNums": 32, "subscription": subscription})
    return reply, body or b""


def _records(producer: Producer, queue_id: int, start: int, end: int) -> tuple[bytes, list[dict]]:
    """A queue's records [start, end) as the node sends them, and each reply's header."""
    data, replies, offset = [], [], start
    while offset < end:
        reply, body = _pull(producer, queue_id, offset)
        assert reply["status"] == "FOUND", reply
        data.append(body)
        replies.append(reply)
        offset = reply["nextBeginOffset"]
    return b"".join(data), replies


@pytest.fixture(scope="module")
def tiered(tmp_path_factory, spark):
    """A node whose archived segments were cleaned, the bytes it served before, and what clean did
    before anything was archived."""
    directory = tmp_path_factory.mktemp("tiered")
    settings = node_settings(directory / "store", runDir=str(directory / "run"), cleanResourceInterval=200,
                             deleteCommitLogFilesInterval=1, deleteConsumeQueueFilesInterval=1,
                             flushCommitLogThoroughInterval=200, tieredArchiveDir=str(directory / "archive"))
    node = NodeProcess(settings, directory / "node.log").start()
    try:
        _cli("admin", "topic", "create", "--endpoint", node.endpoint, "--topic", "TieredGone", "--queues", "1")
        with Producer(node.endpoint, timeout=10.0) as producer:  # in the first segment, archived: then deleted
            for i in range(3):
                producer.send("TieredGone", f"deleted-{i}".encode(), queue_id=0)
        _cli("admin", "topic", "delete", "--endpoint", node.endpoint, "--topic", "TieredGone")
        with Producer(node.endpoint, timeout=10.0) as producer:
            for b in range(BATCHES):  # ~10 MiB of ~2 KiB messages: ten 1 MiB segments
                items = [Message(TOPIC, bytes([b % 251]) * 2000 + str(i).encode(), tags=f"t{i % 3}",
                                 keys=f"k-{b}-{i}", properties={"n": str(i)}) for i in range(100)]
                producer.send_batch(TOPIC, items, queue_id=b % QUEUES)
            ends = [producer.request({"code": protocol.GET_MAX_OFFSET, "topic": TOPIC, "queueId": q})[0]["offset"]
                    for q in range(QUEUES)]
            before = [_records(producer, q, 0, ends[q])[0] for q in range(QUEUES)]
        _cli("admin", "topic", "create", "--endpoint", node.endpoint, "--topic", "TieredGone", "--queues", "1")
        with Producer(node.endpoint, timeout=10.0) as producer:  # made again: its queue goes on from 3
            assert producer.send("TieredGone", b"made-again", queue_id=0).queue_offset == 3
        unarchived = _cli("admin", "clean", "--endpoint", node.endpoint, "--force")
        deadline = time.monotonic() + 60  # the last segment's tail waits for the thorough flush
        archived: list[str] = []  # (over every call: a later one counts the earlier ones' as alreadyArchived)
        while True:
            done = archive(spark, str(settings.root), str(directory / "archive"))
            archived += done["archived"]
            if len(done["archived"]) + done["alreadyArchived"] >= 9 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        done = dict(done, archived=archived)
        cleaned = _cli("admin", "clean", "--endpoint", node.endpoint, "--force")
        yield node, ends, before, unarchived, cleaned, done
    finally:
        node.stop(strict=False)


def test_clean_deletes_only_what_the_archive_holds(tiered):
    node, _, _, unarchived, cleaned, done = tiered
    assert unarchived["count"] == 0  # forced, and still nothing: no segment was archived yet
    archived = set(done["archived"])
    assert cleaned["count"] >= 9 and {item["file"] for item in cleaned["deleted"]} <= archived
    left = sorted(p.name for p in node.settings.commitlog_dir.iterdir() if p.name.isdigit())
    assert left[0] not in archived or len(left) == 1


def test_pulls_below_the_store_return_the_stored_bytes(tiered):
    node, ends, before, *_ = tiered
    with Producer(node.endpoint) as producer:
        # every pull worker looks at the archive once a second: each has seen it within a few
        deadline = time.monotonic() + 10
        while True:
            stored_min = [producer.request({"code": protocol.GET_MIN_OFFSET, "topic": TOPIC, "queueId": q})[0]
                          for q in range(QUEUES) for _ in range(4)]  # (several asks: several workers answer)
            if all(reply.get("tiered") for reply in stored_min) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert all(reply["offset"] == 0 and reply["tiered"] is True for reply in stored_min)
        for q in range(QUEUES):
            data, replies = _records(producer, q, 0, ends[q])
            assert data == before[q]  # same bytes, same CRCs, across the archive and the store
            assert replies[0]["tiered"] is True and replies[-1].get("tiered") is None  # it ends in the store


def test_only_a_process_that_reads_the_archive_loads_pyarrow(tiered):
    """Ray imports pyarrow in each worker, for serializers of Ray Data's that no node uses: a
    node's workers make their serialization context without it (node.server.worker_setup), and
    the pull worker that reads archived rows still imports it."""
    node, ends, before, *_ = tiered
    with Producer(node.endpoint) as producer:
        deadline = time.monotonic() + 10  # (a pull worker looks at the archive once a second)
        while not producer.request({"code": protocol.GET_MIN_OFFSET, "topic": TOPIC, "queueId": 0})[0].get("tiered"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert _records(producer, 0, 0, ends[0])[0] == before[0]

    def maps_arrow(label: str) -> bool:
        pid = int((node.settings.run_dir / f"{label}.pid").read_text())
        return "libarrow" in Path(f"/proc/{pid}/maps").read_text()

    assert not any(maps_arrow(label) for label in ("flush", "allocator", "writer", "dispatcher", "schedule", "front"))
    assert maps_arrow("pull-0")


def test_a_search_by_time_before_the_store_finds_archived_offsets(tiered):
    node, *_ = tiered
    with Producer(node.endpoint) as producer:
        def search(stamp: int) -> int:
            reply, _ = producer.request({"code": protocol.SEARCH_OFFSET_BY_TIMESTAMP, "topic": TOPIC, "queueId": 0,
                                         "timestamp": stamp})
            return reply["offset"]

        reply, body = _pull(producer, 0, 40)
        assert reply["tiered"] is True
        stamp = decode(body).store_timestamp
        assert search(0) == 0  # before everything: the archive's first offset, not the store's
        assert search(stamp) <= 40 and decode(_pull(producer, 0, search(stamp))[1]).store_timestamp == stamp


def test_a_tag_filter_and_offsets_below_the_archive(tiered):
    node, *_ = tiered
    with Producer(node.endpoint) as producer:
        reply, body = _pull(producer, 0, 0, subscription="t1")
        assert reply["status"] == "FOUND" and reply["tiered"] is True
        with PullConsumer(node.endpoint) as consumer:
            result = consumer.pull(TOPIC, 0, 0, subscription="t1")
        assert result.messages and {m.tags for m in result.messages} == {"t1"}
        assert result.next_begin_offset > result.messages[-1].queue_offset
        reply, body = _pull(producer, 0, -5)
        assert reply["status"] == "OFFSET_ILLEGAL" and reply["nextBeginOffset"] == 0 and not body


def test_consume_from_first_and_spark_read_the_whole_history(tiered, spark):
    node, ends, *_ = tiered
    total = sum(ends)
    done = subprocess.run([sys.executable, "-m", "node.tools.cli", "consume", "--endpoint", node.endpoint,
                           "--topic", TOPIC, "--group", "TieredCli", "--from", "first", "--count", str(total),
                           "--timeout", "10"], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    lines = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert len(lines) == total and len({(m["queueId"], m["queueOffset"]) for m in lines}) == total
    frame = (spark.read.format("mqnode").option("endpoint", node.endpoint).option("topic", TOPIC)
             .option("startingOffsets", "earliest").option("endingOffsets", "latest").load())
    rows = frame.select("queueId", "queueOffset", "keys").collect()
    assert len(rows) == total and {(r.queueId, r.queueOffset) for r in rows} == {
        (q, o) for q in range(QUEUES) for o in range(ends[q])}


def test_an_archived_deleted_topic_is_not_read_back_into_one_made_again(tiered):
    """The archive holds the messages of a topic deleted before its segment was archived; a
    topic made again under the name reads from its own first message, never those (its queue's
    offsets below the deleted one's end: shm.reader.StoreReader.archive_floor)."""
    node = tiered[0]
    with PullConsumer(node.endpoint) as consumer:
        assert consumer.min_offset("TieredGone", 0) == 3
        below = consumer.pull("TieredGone", 0, 0)
        assert below.messages == [] and below.next_begin_offset == 3
        assert [m.body for m in consumer.pull("TieredGone", 0, 3).messages] == [b"made-again"]

