"""The Spark connector with a real local Spark session and a real node (one of each for the module):
batch reads equal what was produced, offsets and timestamps bound them, a stream restarted from its
checkpoint delivers every message exactly once to a file sink, a 100k-row write reads back intact,
and bad options fail with a clear message."""

from __future__ import annotations

import time

import orjson
import pytest
from nodes import NodeProcess, node_settings

from node import protocol
from node.client import Message, Producer

pyspark = pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow
TOPICS = ("SparkRead", "SparkStream", "SparkWrite", "SparkTime", "SparkTx", "SparkTxAbort", "SparkTxRetry",
          "SparkTxSource", "SparkTxStream", "SparkNulls")


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    directory = tmp_path_factory.mktemp("spark-node")
    settings = node_settings(directory / "store", runDir=str(directory / "run"), autoCreateTopicEnable=False,
                             enablePropertyFilter=True)
    config = settings.root / "config"
    config.mkdir(parents=True)
    table = {t: {"topicName": t, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6} for t in TOPICS}
    (config / "topics.json").write_bytes(orjson.dumps({"topicConfigTable": table}))
    process = NodeProcess(settings, directory / "node.log").start()
    yield process
    process.stop(strict=False)


def _read(spark, node, **options):
    reader = spark.read.format("mqnode").option("endpoint", node.endpoint)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_a_batch_read_equals_what_was_produced(spark, node):
    sent = []
    with Producer(node.endpoint) as producer:
        for i in range(200):
            props = {"é-key": f"välue-{i}", "X": "a=b;c"}
            result = producer.send("SparkRead", f"body-{i}".encode(), tags=f"T{i % 3}", keys=[f"k{i}", f"alt{i}"],
                                   properties=props, queue_id=i % 4)
            sent.append((result, i))
    rows = _read(spark, node, topic="SparkRead").collect()
    assert len(rows) == 200
    by_id = {row.offsetMsgId: row for row in rows}
    for result, i in sent:
        row = by_id[result.offset_msg_id]
        assert (row.body, row.tags, list(row.keys)) == (f"body-{i}".encode(), f"T{i % 3}", [f"k{i}", f"alt{i}"])
        assert row.properties["é-key"] == f"välue-{i}" and row.properties["X"] == "a=b;c"
        assert (row.topic, row.queueId, row.queueOffset, row.msgId) == ("SparkRead", i % 4, i // 4, result.msg_id)
        assert row.commitLogOffset >= 0 and row.storeTimestamp is not None and row.bornTimestamp is not None
        assert row.storeHost and row.bornHost and row.sysFlag == 0 and row.flag == 0
    assert _read(spark, node, topic="SparkRead", minPartitions="9").rdd.getNumPartitions() >= 9
    # pulls asking more than the node answers (32): the short answers' gaps are read, nothing twice
    wide = _read(spark, node, topic="SparkRead", pullBatchSize="40").select("offsetMsgId").collect()
    assert sorted(r.offsetMsgId for r in wide) == sorted(by_id)

    ranged = _read(spark, node, topic="SparkRead", startingOffsets='{"SparkRead": {"0": 5}}',
                   endingOffsets='{"SparkRead": {"0": 10, "1": 0, "2": 0, "3": 0}}').collect()
    assert sorted((r.queueId, r.queueOffset) for r in ranged) == [(0, o) for o in range(5, 10)]
    tagged = _read(spark, node, topic="SparkRead", subscription="T1").collect()
    assert len(tagged) == len([i for i in range(200) if i % 3 == 1]) and {r.tags for r in tagged} == {"T1"}
    # a SQL92 selector over the properties, applied at the node
    chosen = _read(spark, node, topic="SparkRead", expressionType="SQL92",
                   subscription="TAGS = 'T2' AND KEYS STARTSWITH 'k1'").select("body").collect()
    assert sorted(r.body for r in chosen) == sorted(f"body-{i}".encode() for i in range(200)
                                                    if i % 3 == 2 and str(i).startswith("1"))
    with pytest.raises(Exception, match="SQL92"):
        _read(spark, node, topic="SparkRead", expressionType="SQL92", subscription="a >").collect()


def test_timestamps_bound_a_read(spark, node):
    with Producer(node.endpoint) as producer:
        for i in range(20):
            producer.send("SparkTime", f"early-{i}".encode(), queue_id=0)
        time.sleep(0.3)
        middle = int(time.time() * 1000)
        time.sleep(0.3)
        for i in range(20):
            producer.send("SparkTime", f"late-{i}".encode(), queue_id=0)
    rows = _read(spark, node, topic="SparkTime", startingTimestamp=str(middle)).collect()
    assert sorted(r.body.decode() for r in rows) == sorted(f"late-{i}" for i in range(20))


def test_a_stream_restarted_from_its_checkpoint_delivers_each_message_once(spark, node, tmp_path):
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def produce(first: int, count: int) -> None:
        with Producer(node.endpoint) as producer:
            producer.send_batch("SparkStream", [Message("SparkStream", f"m-{i}".encode()) for i in range(first, first + count)],
                                queue_id=first // 100 % 4)

    def run_once() -> None:
        stream = (spark.readStream.format("mqnode").option("endpoint", node.endpoint).option("topic", "SparkStream")
                  .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "70").load())
        query = (stream.selectExpr("CAST(body AS STRING) AS body", "queueId", "queueOffset").writeStream
                 .format("json").option("path", str(out)).option("checkpointLocation", str(checkpoint))
                 .trigger(processingTime="200 milliseconds").start())
        query.processAllAvailable()
        query.stop()

    produce(0, 100)
    produce(100, 100)
    run_once()
    produce(200, 100)  # the topic grows while no query runs
    produce(300, 100)
    run_once()
    bodies = [row.body for row in spark.read.json(str(out)).collect()]
    assert sorted(bodies) == sorted(f"m-{i}" for i in range(400))  # all, and none twice


def test_a_stream_of_a_topic_not_yet_made_reads_it_once_a_send_makes_it(spark, node, tmp_path):
    """Consumers make no topic (a batch read of one is TOPIC_NOT_EXIST); a stream waits for it, as
    Kafka's subscribe does."""
    stream = spark.readStream.format("mqnode").option("endpoint", node.endpoint).option("topic", "SparkLater") \
        .option("startingOffsets", "earliest").load()
    query = (stream.selectExpr("CAST(body AS STRING) AS body").writeStream.format("memory").queryName("later")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(processingTime="200 milliseconds")
             .start())
    try:
        query.processAllAvailable()
        with Producer(node.endpoint) as producer:  # (this node makes no topic by itself: the admin's request)
            made = producer.request({"code": protocol.UPDATE_AND_CREATE_TOPIC, "topic": "SparkLater",
                                     "readQueueNums": 4, "writeQueueNums": 4, "perm": 6})[0]
            assert made["status"] == "OK", made
            producer.send_batch("SparkLater", [Message("SparkLater", f"l-{i}".encode()) for i in range(50)])
        deadline = time.monotonic() + 60
        while spark.sql("SELECT * FROM later").count() < 50 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sorted(r.body for r in spark.sql("SELECT body FROM later").collect()) == sorted(f"l-{i}" for i in range(50))
    finally:
        query.stop()


def test_a_write_of_100k_rows_reads_back_intact(spark, node):
    frame = spark.range(100_000).selectExpr("CAST(id AS STRING) AS body", "CONCAT('t', id % 5) AS tags",
                                            "CAST(id % 4 AS INT) AS queueId")
    frame.write.format("mqnode").option("endpoint", node.endpoint).option("topic", "SparkWrite").mode("append").save()
    back = _read(spark, node, topic="SparkWrite")
    assert back.count() == 100_000
    summary = back.selectExpr("CAST(body AS STRING) AS body", "tags", "queueId").groupBy().agg(
        {"body": "count"}).collect()
    assert summary[0][0] == 100_000
    mismatched = back.selectExpr("CAST(CAST(body AS STRING) AS LONG) AS id", "tags", "queueId").where(
        "tags != CONCAT('t', id % 5) OR queueId != id % 4").count()
    distinct = back.selectExpr("CAST(body AS STRING) AS b").distinct().count()
    assert mismatched == 0 and distinct == 100_000


def test_a_null_key_or_property_value_is_none_and_an_empty_one_or_a_number_body_fails(spark, node):
    frame = spark.createDataFrame([("b1", "v"), ("b2", None)], "body string, v string").selectExpr(
        "body", "map('a', v) AS properties", "array('k', v) AS keys")
    frame.write.format("mqnode").option("endpoint", node.endpoint).option("topic", "SparkNulls").mode("append").save()
    back = {bytes(row.body): row for row in _read(spark, node, topic="SparkNulls").collect()}
    assert back[b"b1"].properties["a"] == "v" and back[b"b1"]["keys"] == ["k", "v"]
    assert "a" not in back[b"b2"].properties and back[b"b2"]["keys"] == ["k"]  # (it was stored as "None")
    empty = spark.createDataFrame([("b3",)], "body string").selectExpr("body", "map('a', '') AS properties")
    with pytest.raises(Exception, match="row 0: property 'a' is empty"):
        empty.write.format("mqnode").option("endpoint", node.endpoint).option("topic", "SparkNulls").mode("append").save()
    assert _read(spark, node, topic="SparkNulls").count() == 2
    for columns, said in ((["id AS body"], "the `body` column must be binary or string"),  # (a TypeError in a
                          (["'b' AS body", "id AS shardingKey"], "the `shardingKey` column must be a string, not int64"),
                          (["'b' AS body", "id AS keys"], "the `keys` column must be a string or an array of strings")):
        with pytest.raises(Exception, match=said):  # task at its first row, an AttributeError, "not iterable")
            spark.range(3).selectExpr(*columns).write.format("mqnode").option("endpoint", node.endpoint) \
                .option("topic", "SparkNulls").mode("append").save()


@pytest.mark.parametrize("options, message", [
    ({"topic": "NoSuchTopic"}, "TOPIC_NOT_EXIST"),
    ({"topic": "SparkRead", "startingOffsets": "{not json"}, "startingOffsets"),
    ({"topic": "SparkRead", "startingOffsets": '{"SparkRaed": {"0": 0}}'}, "offsets name topic 'SparkRaed'"),  # (ignored)
    ({"topic": "SparkRead", "endpoint": "tcp://127.0.0.1:1", "timeout": "1"}, "did not answer"),
    ({}, "option `topic`"),
    ({"topic": "SparkRead", "pullBatchSize": "0"}, "pullBatchSize"),
])
def test_bad_options_fail_with_a_clear_message(spark, node, options, message):
    reader = spark.read.format("mqnode").option("endpoint", node.endpoint)
    for key, value in options.items():
        reader = reader.option(key, value)
    with pytest.raises(Exception, match=message):
        reader.load().collect()


def test_a_read_from_cleaned_offsets_fails_or_skips_as_failOnDataLoss_says(spark, node):
    with Producer(node.endpoint) as producer:
        for i in range(5):
            producer.send("SparkTime", f"x-{i}".encode(), queue_id=3)
    # offset -5 is below every queue's min offset: the node no longer has it (as after a clean)
    with pytest.raises(Exception, match="was cleaned from the node"):
        _read(spark, node, topic="SparkTime", startingOffsets='{"SparkTime": {"3": -5}}').collect()
    skipped = _read(spark, node, topic="SparkTime", startingOffsets='{"SparkTime": {"3": -5}}',
                    failOnDataLoss="false").where("queueId = 3").collect()
    assert sorted(r.body for r in skipped) == [f"x-{i}".encode() for i in range(5)]
    past = '{"SparkTime": {"3": 99}}'  # (a start past the end read nothing, with no word of why)
    for ending in ("latest", '{"SparkTime": {"3": 2}}'):
        with pytest.raises(Exception, match="SparkTime/3: startingOffsets 99 is after endingOffsets"):
            _read(spark, node, topic="SparkTime", startingOffsets=past, endingOffsets=ending).collect()
    assert _read(spark, node, topic="SparkTime", startingOffsets=past, failOnDataLoss="false").where(
        "queueId = 3").count() == 0


def test_a_node_with_its_acl_on_is_written_and_read_with_the_credentials_options(spark, tmp_path):
    (tmp_path / "acl.yml").write_text("accounts:\n  - accessKey: sparkApp\n    secretKey: spark-secret\n"
                                      "    defaultTopicPerm: PUB|SUB\n    topicPerms: [Locked=DENY]\n")
    settings = node_settings(tmp_path / "store", runDir=str(tmp_path / "run"), aclEnable=True,
                             aclFile=str(tmp_path / "acl.yml"))
    secured = NodeProcess(settings, tmp_path / "node.log").start()
    account = {"accessKey": "sparkApp", "secretKey": "spark-secret"}
    try:
        frame = spark.range(500).selectExpr("CAST(id AS STRING) AS body", "CAST(id % 2 AS INT) AS queueId")
        writer = frame.write.format("mqnode").option("endpoint", secured.endpoint).mode("append")
        for key, value in account.items():
            writer = writer.option(key, value)
        writer.option("topic", "Open").save()
        assert _read(spark, secured, topic="Open", **account).count() == 500
        with pytest.raises(Exception, match="NO_PERMISSION"):
            _read(spark, secured, topic="Open").collect()  # no credentials
        with pytest.raises(Exception, match="NO_PERMISSION.*topic Locked"):
            writer.option("topic", "Locked").save()
    finally:
        secured.stop(strict=False)


# -- all-or-nothing writes (option transactional) ---------------------------------------------------

def _bodies(spark, node, topic: str) -> list[str]:
    return [r.body for r in _read(spark, node, topic=topic).selectExpr("CAST(body AS STRING) AS body").collect()]


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _transactions(node, listed: int = 0) -> dict:
    with Producer(node.endpoint) as client:
        reply, _ = client.request({"code": protocol.GET_TRANSACTION_STATE, "limit": listed})
    return reply


def _write_through(spark, node, rows: int, each_task, topic: str, **options) -> None:
    """A transactional write of the bodies "0".."rows-1" to `topic` by two tasks, each passing its
    rows through `each_task` (mapInArrow) in batches of 500, so it can fail between them."""
    frame = spark.range(rows, numPartitions=2).selectExpr("CAST(id AS STRING) AS body")
    writer = (frame.mapInArrow(each_task, frame.schema).write.format("mqnode").option("endpoint", node.endpoint)
              .option("topic", topic).option("transactional", "true").mode("append"))
    for key, value in options.items():
        writer = writer.option(key, value)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        writer.save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


def test_a_transactional_write_is_visible_whole_and_once(spark, node):
    frame = spark.range(20_000, numPartitions=4).selectExpr("CAST(id AS STRING) AS body", "CAST(id % 4 AS INT) AS queueId")
    (frame.write.format("mqnode").option("endpoint", node.endpoint).option("topic", "SparkTx")
     .option("transactional", "true").mode("append").save())
    bodies = _bodies(spark, node, "SparkTx")
    assert len(bodies) == 20_000 and set(bodies) == {str(i) for i in range(20_000)}


def test_a_transactional_write_whose_job_fails_leaves_nothing_visible(spark, node):
    from pyspark.errors import PySparkException
    from pyspark.sql.utils import CapturedException

    before = _transactions(node)["rolledBack"]
    endpoint = node.endpoint

    def fail_one(batches):  # (runs in Spark's Python worker: imports its own, names nothing of this module)
        import time as clock

        from pyspark import TaskContext

        from node import protocol as wire
        from node.client import Producer as Client

        def until_a_half_is_open(deadline_s: float = 120.0) -> None:
            # (a fixed sleep here was too short for a writer's Python worker to start on a loaded machine)
            deadline = clock.monotonic() + deadline_s
            with Client(endpoint) as client:
                while clock.monotonic() < deadline:
                    reply, _ = client.request({"code": wire.GET_TRANSACTION_STATE, "limit": 100_000})
                    if any(h["producerGroup"] == "PG-spark-abort" for h in reply["halves"]):
                        return
                    clock.sleep(0.1)

        for i, batch in enumerate(batches):
            if i == 2 and TaskContext.get().partitionId() == 1:
                until_a_half_is_open()  # (a writer sends its first half, of up to 512 rows, of the two batches before)
                raise RuntimeError("task 1 fails after two batches")
            yield batch

    with pytest.raises((PySparkException, CapturedException, Exception)) as failed:
        _write_through(spark, node, 8_000, fail_one, "SparkTxAbort", producerGroup="PG-spark-abort")
    assert "task 1 fails" in str(failed.value)
    assert _bodies(spark, node, "SparkTxAbort") == []
    # what both tasks sent (each failed attempt of task 1 rolls back its own; Spark kills task 0, or it ends,
    # when task 1 fails again: the job's abort rolls back what task 0 reported and the group's open halves;
    # a half was open when task 1 failed)
    assert _transactions(node)["rolledBack"] - before >= 1
    assert [h for h in _transactions(node, 100_000)["halves"] if h["producerGroup"] == "PG-spark-abort"] == []


def test_a_transactional_write_whose_task_is_retried_is_visible_once(spark, node):
    def fail_first_attempt(batches):  # (runs in Spark's Python worker)
        from pyspark import TaskContext

        context = TaskContext.get()
        for i, batch in enumerate(batches):
            if i == 1 and context.partitionId() == 0 and context.attemptNumber() == 0:
                raise RuntimeError("the first attempt of task 0 fails after its first batch")
            yield batch

    _write_through(spark, node, 6_000, fail_first_attempt, "SparkTxRetry")
    bodies = _bodies(spark, node, "SparkTxRetry")
    assert len(bodies) == 6_000 and set(bodies) == {str(i) for i in range(6_000)}


def test_a_transactional_stream_commits_each_batch_once_when_spark_replays_it(spark, node, tmp_path):
    checkpoint = tmp_path / "checkpoint"
    with Producer(node.endpoint) as producer:
        producer.send_batch("SparkTxSource", [Message("SparkTxSource", f"s-{i}".encode()) for i in range(300)],
                            queue_id=0)

    def run_once() -> None:
        stream = (spark.readStream.format("mqnode").option("endpoint", node.endpoint).option("topic", "SparkTxSource")
                  .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "100").load())
        query = (stream.select("body").writeStream.format("mqnode").option("endpoint", node.endpoint)
                 .option("topic", "SparkTxStream").option("transactional", "true")
                 .option("checkpointLocation", str(checkpoint)).trigger(processingTime="200 milliseconds").start())
        query.processAllAvailable()
        query.stop()

    run_once()
    commits = sorted((checkpoint / "commits").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    last = [p for p in commits if p.name.isdigit()][-1]
    last.unlink()  # Spark forgets it committed the last batch: a restart replays it
    (checkpoint / "commits" / f".{last.name}.crc").unlink(missing_ok=True)
    run_once()
    bodies = _bodies(spark, node, "SparkTxStream")
    assert sorted(bodies) == sorted(f"s-{i}" for i in range(300))  # all, and none twice
