"""The read side on a real node: pulls with RocketMQ's statuses, long polling, consumer offsets,
queries by key, time and id, and the consume/query/admin commands. One node for the module."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import orjson
import psutil
import pytest
import zmq
from nodes import ROOT, in_process_node

from node import protocol
from node.client import Producer, PullConsumer
from shm.codec import Host, decode_msg_id, offset_msg_id


@pytest.fixture(scope="module", params=["split", "compact"])
def node(tmp_path_factory, request):
    """Every test runs against a node with a pull worker and a writer process and against one
    whose front serves reads and writes the CommitLog itself."""
    workers = {"pullWorkers": 1} if request.param == "split" else {}
    yield from in_process_node(tmp_path_factory.mktemp("read"), defaultTopicQueueNums=4, topology=request.param,
                               flushConsumerOffsetInterval=300, **workers)


@pytest.fixture(scope="module")
def producer(node):
    with Producer(node.settings.listen, timeout=5.0) as p:
        yield p


@pytest.fixture(scope="module")
def consumer(node):
    with PullConsumer(node.settings.listen, timeout=5.0) as c:
        yield c


def _wait_dispatched(consumer, topic: str, queue_id: int, count: int) -> None:
    deadline = time.monotonic() + 10
    while consumer.max_offset(topic, queue_id) < count:
        assert time.monotonic() < deadline, "the dispatcher did not catch up"
        time.sleep(0.01)


def test_pull_statuses_follow_rocketmq(node, producer, consumer):
    for i in range(10):
        producer.send("Pulls", f"m{i}", tags="TagA" if i % 2 else "TagB", queue_id=0)
    _wait_dispatched(consumer, "Pulls", 0, 10)
    found = consumer.pull("Pulls", 0, 0, max_count=4)
    assert (found.status, found.next_begin_offset, found.min_offset, found.max_offset) == ("FOUND", 4, 0, 10)
    assert [m.body for m in found.messages] == [b"m0", b"m1", b"m2", b"m3"]
    assert [m.queue_offset for m in found.messages] == [0, 1, 2, 3]
    assert consumer.pull("Pulls", 0, 10).status == "NO_NEW_MSG"  # OFFSET_OVERFLOW_ONE
    moved = consumer.pull("Pulls", 0, 50)  # OFFSET_OVERFLOW_BADLY
    assert (moved.status, moved.next_begin_offset) == ("OFFSET_ILLEGAL", 10)
    assert consumer.pull("Pulls", 0, -3).status == "OFFSET_ILLEGAL"  # OFFSET_TOO_SMALL
    assert consumer.pull("Pulls", 3, 0).status == "NO_NEW_MSG"  # NO_MESSAGE_IN_QUEUE at 0
    assert consumer.pull("Pulls", 3, 7).status == "OFFSET_ILLEGAL"
    assert consumer.pull("NoSuchTopic", 0, 0).status == "NO_NEW_MSG"


def test_pull_replies_large_and_small_arrive_intact_together(node, producer, consumer):
    """Pull replies of ~1 KiB to ~33 KiB, several in flight at once: each gets its own records,
    whole and in queue order, however the worker and the front batch them."""
    bodies = [bytes([i]) * (1000 + i) for i in range(40)]
    producer.send_batch("BigPulls", bodies, queue_id=1)
    _wait_dispatched(consumer, "BigPulls", 1, 40)

    async def both():
        pulls = [consumer.inner.pull("BigPulls", 1, offset, max_count=count)
                 for offset, count in [(0, 32), (32, 1), (5, 32), (39, 1), (33, 2)]]
        return await asyncio.gather(*pulls)

    for _ in range(3):
        for (offset, count), result in zip([(0, 32), (32, 1), (5, 32), (39, 1), (33, 2)], consumer._call(both())):
            expected = range(offset, min(40, offset + count))
            assert [m.queue_offset for m in result.messages] == list(expected)
            assert [m.body for m in result.messages] == [bodies[i] for i in expected]


def test_replies_larger_than_a_ring_message_and_requests_no_ring_holds(node, producer, consumer):
    """A query's reply of 5 messages of ~1 MiB (more than a ring message holds: split's pull
    worker sends it over the front's socket) arrives whole; a read whose header no ring message
    holds (2 MiB) is refused under split, and reads go on."""
    bodies = [bytes([65 + i]) * 1_040_000 for i in range(5)]  # (the module's segments are 1 MiB)
    for body in bodies:
        producer.send("HugeReads", body, keys=["huge"], queue_id=0)
    _wait_dispatched(consumer, "HugeReads", 0, 5)
    assert sorted(m.body for m in consumer.query("HugeReads", "huge")) == bodies
    reply = consumer._call(consumer.inner._ask({"code": protocol.PULL_MESSAGE, "topic": "HugeReads", "queueId": 0,
                                                "queueOffset": 0, "maxMsgNums": 1, "pad": "x" * (2 << 20)}))[0]
    if node.settings.topology == "split":  # (compact's front reads it itself)
        assert reply["status"] == "SYSTEM_ERROR" and "a read request of" in reply["remark"], reply
    else:
        assert reply["status"] == "FOUND"
    assert [m.body for m in consumer.pull("HugeReads", 0, 1, max_count=1).messages] == bodies[1:2]


def test_the_writer_wakes_the_dispatcher(node, producer, consumer):
    """Each record is dispatched because the writer said `written` moved, not found by the
    dispatcher's fallback timer (sends spaced wider than it, so either could find them)."""
    def dispatcher_stats() -> dict:
        time.sleep(1.2)  # quiet for longer than the once-a-second statistics push
        reply, _ = producer.request({"code": protocol.GET_BROKER_RUNTIME_INFO})
        return reply["actors"]["dispatcher"]

    before = dispatcher_stats()
    for i in range(20):
        producer.send("Wakes", f"w{i}", queue_id=0)
        time.sleep(0.08)
    _wait_dispatched(consumer, "Wakes", 0, 20)
    after = dispatcher_stats()
    on_wake = after["caughtUpOnWake"] - before["caughtUpOnWake"]
    on_timer = after["caughtUpOnTimer"] - before["caughtUpOnTimer"]
    assert on_wake >= 18 and on_timer <= 2, (on_wake, on_timer)


def test_tag_filtering_gives_exactly_the_matching_messages(node, producer, consumer):
    for i in range(30):
        producer.send("Tagged", f"t{i}", tags=("TagA", "TagB", "TagC")[i % 3], queue_id=1)
    _wait_dispatched(consumer, "Tagged", 1, 30)
    got, offset = [], 0
    while offset < 30:
        result = consumer.pull("Tagged", 1, offset, subscription="TagA || TagC")
        got += [m.body.decode() for m in result.messages]
        offset = result.next_begin_offset
    assert got == [f"t{i}" for i in range(30) if i % 3 != 1]
    nothing = consumer.pull("Tagged", 1, 0, subscription="TagZ")
    assert nothing.status == "NO_MATCHED_MSG" and nothing.next_begin_offset > 0


def test_long_polling_wakes_on_arrival_and_idles_for_free(node, producer, consumer):
    producer.send("HeldPulls", "first", queue_id=0)  # (its own topic: in any order of the tests)
    _wait_dispatched(consumer, "HeldPulls", 0, 1)
    top = consumer.max_offset("HeldPulls", 0)
    sent_at = []

    def send_later():
        time.sleep(0.3)
        sent_at.append(time.monotonic())
        producer.send("HeldPulls", "wake up", queue_id=0)

    threading.Thread(target=send_later).start()
    began = time.monotonic()
    result = consumer.pull("HeldPulls", 0, top, suspend_ms=10000)
    woke = time.monotonic()
    assert result.status == "FOUND" and result.messages[0].body == b"wake up"
    assert woke - began < 5.0 and woke - sent_at[0] < 1.0  # woken by the arrival, not the timeout
    # an empty held pull ends at its timeout with NO_NEW_MSG
    began = time.monotonic()
    assert consumer.pull("HeldPulls", 0, top + 1, suspend_ms=300).status == "NO_NEW_MSG"
    assert time.monotonic() - began >= 0.25
    # held pulls that overlap leave the consumer's own timeout as it was (a long poll's deadline
    # is its own, not lent to the consumer while it waits)
    async def overlapping():
        short = asyncio.ensure_future(consumer.inner.pull("HeldPulls", 0, top + 1, suspend_ms=200))
        await asyncio.sleep(0.05)
        await consumer.inner.pull("HeldPulls", 0, top + 1, suspend_ms=600)
        await short
    consumer._call(overlapping())
    assert consumer.inner.client.timeout == 5.0
    # 300 held pulls cost (almost) no CPU while nothing arrives
    holder = "front" if node.settings.topology == "compact" else "pull-0"  # (the process hosting pull-0)
    pull_worker = psutil.Process(int((node.settings.run_dir / f"{holder}.pid").read_text()))
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(node.settings.listen)
    for i in range(300):
        sock.send(orjson.dumps({"code": protocol.PULL_MESSAGE, "opaque": i, "topic": "Idle", "queueId": 0,
                                "queueOffset": 0, "suspend": True, "suspendTimeoutMillis": 4000}))
    time.sleep(0.5)
    before = sum(pull_worker.cpu_times()[:2])
    time.sleep(2.0)
    spent = sum(pull_worker.cpu_times()[:2]) - before
    assert spent < 0.4, f"held pulls burned {spent:.2f} s of CPU in 2 s"
    replies = 0
    while sock.poll(5000) and replies < 300:
        assert orjson.loads(sock.recv())["status"] == "NO_NEW_MSG"
        replies += 1
    assert replies == 300
    sock.close(0)
    context.term()


def test_a_group_consumes_everything_exactly_once_across_restarts(node, producer):
    sent = [producer.send("Orders", f"order-{i}", keys=[f"order-{i}"], properties={"n": str(i)}) for i in range(120)]
    seen = []
    with PullConsumer(node.settings.listen) as first:
        seen += list(first.consume("Orders", "billing", limit=50, idle_timeout=5))
    with PullConsumer(node.settings.listen) as second:  # a restarted consumer resumes from committed offsets
        seen += list(second.consume("Orders", "billing", idle_timeout=1.5))
    assert sorted(m.msg_id for m in seen) == sorted(r.msg_id for r in sent)  # each exactly once
    by_queue = {}
    for m in seen:
        by_queue.setdefault(m.queue_id, []).append(m.queue_offset)
        assert m.body == f"order-{m.properties['n']}".encode() and m.keys == [f"order-{m.properties['n']}"]
    assert all(offsets == sorted(offsets) for offsets in by_queue.values())
    with PullConsumer(node.settings.listen) as third:
        assert list(third.consume("Orders", "billing", idle_timeout=0.5)) == []
        assert len(list(third.consume("Orders", "audit", start="first", idle_timeout=1.5))) == 120


def test_a_consume_left_mid_batch_commits_what_was_taken_and_not_the_message_in_hand(node, producer):
    producer.send_batch("LeftEarly", [f"{i}".encode() for i in range(100)], queue_id=0)
    with PullConsumer(node.settings.listen) as consumer:
        for message in consumer.consume("LeftEarly", "leavers", start="first", idle_timeout=5):
            if message.body == b"4":
                break  # (0-3 handled; 4 perhaps not: it comes again)
        assert consumer.committed("leavers", "LeftEarly", 0) == 4  # (nothing: the next had all 32 again)
        with pytest.raises(ValueError):
            for message in consumer.consume("LeftEarly", "leavers", idle_timeout=5):
                if message.body == b"7":
                    raise ValueError("the caller's bug")
        again = [m.body for m in consumer.consume("LeftEarly", "leavers", idle_timeout=1.5)]
    assert again == [f"{i}".encode() for i in range(7, 100)]


def test_queries_by_key_time_and_id(node, producer, consumer):
    result = producer.send("Lookup", "find me", keys=["needle", "other"], queue_id=0)
    time.sleep(0.1)
    _wait_dispatched(consumer, "Lookup", 0, 1)
    assert [m.body for m in consumer.query("Lookup", "needle")] == [b"find me"]
    assert [m.body for m in consumer.query("Lookup", result.msg_id)] == [b"find me"]  # UNIQ_KEY
    assert consumer.query("Lookup", "absent") == [] and consumer.query("Pulls", "needle") == []
    viewed = consumer.view(result.offset_msg_id)  # straight from the CommitLog
    assert viewed.body == b"find me" and viewed.offset_msg_id == result.offset_msg_id
    assert consumer.view(result.offset_msg_id.lower(), "Lookup").msg_id == result.msg_id
    assert consumer.view(result.offset_msg_id, "Pulls") is None  # not that topic's
    assert consumer.view(result.msg_id, "Lookup").offset_msg_id == result.offset_msg_id  # a msgId, by the index
    assert consumer.view(result.msg_id) is None  # (32 hex digits, and no offsetMsgId of this node)
    host, offset = decode_msg_id(result.offset_msg_id)
    elsewhere = offset_msg_id(Host(host.ip, host.port + 1), offset)  # another node's id, same offset
    reply, _ = consumer._call(consumer.inner._ask({"code": protocol.VIEW_MESSAGE_BY_ID, "offsetMsgId": elsewhere}))
    assert reply["status"] == "QUERY_NOT_FOUND" and str(host) in reply["remark"], reply
    assert consumer.view(elsewhere) is None and consumer.view(elsewhere, "Lookup") is None
    with pytest.raises(ValueError, match="name the topic"):
        consumer.view("needle")
    stamp = consumer.query("Lookup", "needle")[0].store_timestamp
    reply, _ = consumer._call(consumer.inner._ask({"code": protocol.SEARCH_OFFSET_BY_TIMESTAMP, "topic": "Lookup",
                                                   "queueId": 0, "timestamp": stamp}))
    assert reply["offset"] == 0


def test_bad_read_requests_get_statuses_and_the_node_lives(node, consumer, producer):
    ask = lambda header: consumer._call(consumer.inner._ask(header))[0]
    assert ask({"code": protocol.PULL_MESSAGE, "topic": "Pulls", "queueId": 0})["status"] == "SYSTEM_ERROR"
    assert ask({"code": protocol.PULL_MESSAGE, "topic": "../etc", "queueId": 0, "queueOffset": 0})["status"] == "SYSTEM_ERROR"
    assert ask({"code": protocol.PULL_MESSAGE, "topic": "Pulls", "queueId": 0, "queueOffset": 0,
                "subscription": "A || "})["status"] == "SUBSCRIPTION_PARSE_FAILED"
    assert ask({"code": protocol.VIEW_MESSAGE_BY_ID, "offsetMsgId": "zz"})["status"] == "SYSTEM_ERROR"
    assert ask({"code": protocol.UPDATE_CONSUMER_OFFSET, "consumerGroup": "g", "topic": "T", "queueId": 0,
                "commitOffset": -1})["status"] == "SYSTEM_ERROR"
    assert ask({"code": protocol.QUERY_CONSUMER_OFFSET, "consumerGroup": "nobody", "topic": "T",
                "queueId": 0})["status"] == "QUERY_NOT_FOUND"
    producer.send("StillServing", "after the bad ones", queue_id=0)  # (its own topic: in any order of the tests)
    _wait_dispatched(consumer, "StillServing", 0, 1)
    assert consumer.pull("StillServing", 0, 0).status == "FOUND"


def test_consume_query_and_admin_commands(node, producer):
    for i in range(5):
        producer.send("CliRead", f"line {i}", tags="X", keys=[f"key-{i}"])
    endpoint = node.settings.listen

    def run(*args):
        return subprocess.run([sys.executable, "-m", "node.tools.cli", *args, "--endpoint", endpoint], cwd=ROOT,
                              capture_output=True, timeout=60, check=False)

    done = run("consume", "--topic", "CliRead", "--group", "cli", "--timeout", "2")
    assert done.returncode == 0, done.stderr
    lines = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert sorted(line["body"] for line in lines) == [f"line {i}" for i in range(5)]
    assert {"topic", "queueId", "queueOffset", "msgId", "offsetMsgId", "tags", "keys", "properties",
            "bornTimestamp", "storeTimestamp"} <= set(lines[0])
    again = run("consume", "--topic", "CliRead", "--group", "cli", "--timeout", "1")
    assert again.returncode == 0 and again.stdout == b""  # offsets were committed
    found = run("query", "--topic", "CliRead", "--key", "key-3")
    assert found.returncode == 0 and orjson.loads(found.stdout)["body"] == "line 3"
    by_id = run("query", "--msg-id", orjson.loads(found.stdout)["offsetMsgId"])
    assert by_id.returncode == 0 and orjson.loads(by_id.stdout)["keys"] == ["key-3"], by_id.stderr
    by_msg_id = run("query", "--msg-id", orjson.loads(found.stdout)["msgId"], "--topic", "CliRead")
    assert by_msg_id.returncode == 0 and orjson.loads(by_msg_id.stdout)["body"] == "line 3", by_msg_id.stderr
    missing = run("query", "--msg-id", orjson.loads(found.stdout)["msgId"])
    assert missing.returncode == 1 and missing.stdout == b""  # (a client's msgId without its topic: taken as an offsetMsgId)
    assert b"no message with offsetMsgId " in missing.stderr and b"found with --topic" in missing.stderr
    where = orjson.loads(found.stdout)  # mqadmin queryMsgByOffset
    at = run("query", "--topic", "CliRead", "--queue-id", str(where["queueId"]), "--queue-offset", str(where["queueOffset"]))
    assert at.returncode == 0 and orjson.loads(at.stdout)["body"] == "line 3", at.stderr
    past = run("query", "--topic", "CliRead", "--queue-id", str(where["queueId"]), "--queue-offset", "99")
    assert past.returncode == 1 and b"no message at offset 99" in past.stderr
    offsets = run("admin", "offsets", "--group", "cli")
    assert offsets.returncode == 0, offsets.stderr
    table = orjson.loads(offsets.stdout)["CliRead"]
    assert sum(q["consumerOffset"] for q in table.values()) == 5 and all(q["lag"] == 0 for q in table.values())
    status = run("admin", "topic", "--topic", "CliRead")  # mqadmin topicStatus: each queue's offsets, last store time
    assert status.returncode == 0, status.stderr
    queues = orjson.loads(status.stdout)["queues"]
    assert sum(q["maxOffset"] - q["minOffset"] for q in queues.values()) == 5
    assert {q["lastUpdateTimestamp"] > 0 for q in queues.values() if q["maxOffset"]} == {True}
    assert max(q["lastUpdateTimestamp"] for q in queues.values()) == max(line["storeTimestamp"] for line in lines)
    unknown = run("admin", "topic", "--topic", "NeverMade")
    assert unknown.returncode == 1 and b"TOPIC_NOT_EXIST" in unknown.stderr
    topics = run("admin", "topics")
    assert "CliRead" in orjson.loads(topics.stdout) and "NeverMade" not in orjson.loads(topics.stdout)


def test_broker_permission_changes_while_the_node_runs(node, producer, consumer):
    """`admin config update --set brokerPermission=N` (mqadmin updateBrokerConfig): 4 (read only)
    routes the topics read-only and refuses sends to order topics, serving the others and every
    read; 2 (write only) refuses pulls and pops; back at 6, as before. `admin config` shows it."""
    ask = lambda header, body=None: producer.request(header, body)[0]

    def admin(*args):
        done = subprocess.run([sys.executable, "-m", "node.tools.cli", "admin", *args, "--endpoint", node.settings.listen],
                              cwd=ROOT, capture_output=True, timeout=60, check=False)
        return done.returncode, orjson.loads(done.stdout) if done.returncode == 0 else done.stderr.decode()

    assert ask({"code": protocol.UPDATE_AND_CREATE_TOPIC, "topic": "PermOrdered", "readQueueNums": 2,
                "writeQueueNums": 2, "order": True})["status"] == "OK"
    producer.send("PermReads", "before", queue_id=0)
    _wait_dispatched(consumer, "PermReads", 0, 1)
    pull = {"code": protocol.PULL_MESSAGE, "topic": "PermReads", "queueId": 0, "queueOffset": 0, "maxMsgNums": 1}
    ordered = {"code": protocol.SEND_MESSAGE, "topic": "PermOrdered", "queueId": 0}
    try:
        assert admin("config", "update", "--set", "brokerPermission=4") == (0, {"status": "OK", "brokerPermission": 4})
        assert admin("config")[1]["brokerPermission"] == "4"
        assert ask({"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": "PermReads"})["perm"] == 4
        assert producer.send("PermReads", "while read only", queue_id=0).status == "PUT_OK"
        refused = ask(ordered, b"x")
        assert refused["status"] == "NO_PERMISSION" and "sending message is forbidden" in refused["remark"], refused
        assert ask(pull)["status"] == "FOUND"
        assert admin("config", "update", "--set", "brokerPermission=2")[0] == 0
        for header in (pull, {"code": protocol.POP_MESSAGE, "consumerGroup": "perm", "topic": "PermReads",
                              "queueId": -1, "maxMsgNums": 1, "invisibleTime": 60000}):
            refused = ask(header)
            assert refused["status"] == "NO_PERMISSION" and "message is forbidden" in refused["remark"], refused
        assert ask(ordered, b"x")["status"] == "PUT_OK"
        code, remark = admin("config", "update", "--set", "flushDiskType=SYNC_FLUSH")
        assert code == 1 and "INVALID_PARAMETER" in remark and "restart" in remark
        assert ask({"code": protocol.UPDATE_BROKER_CONFIG})["status"] == "INVALID_PARAMETER"
        assert ask({"code": protocol.UPDATE_BROKER_CONFIG}, b"brokerPermission=5")["status"] == "INVALID_PARAMETER"
    finally:
        assert admin("config", "update", "--set", "brokerPermission=6")[0] == 0
    assert ask(pull)["status"] == "FOUND" and ask({"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": "PermReads"})["perm"] == 6
    assert ask(ordered, b"x")["status"] == "PUT_OK"


def test_offsets_are_persisted_as_rocketmq_writes_them(node, producer):
    """Committed offsets reach config/consumerOffset.json within flushConsumerOffsetInterval, in
    RocketMQ's layout; the group's subscription config too."""
    from actors import config_files

    for i in range(40):
        producer.send("Persisted", f"p-{i}")
    with PullConsumer(node.settings.listen) as consumer:
        assert len(list(consumer.consume("Persisted", "keeper", idle_timeout=1.0))) == 40
    path = node.settings.root / "config" / "consumerOffset.json"
    deadline = time.monotonic() + 10
    while True:
        text = path.read_text() if path.exists() else ""
        table = config_files.loads(text)["offsetTable"] if text else {}
        if sum(table.get("Persisted@keeper", {}).values()) == 40:
            break
        assert time.monotonic() < deadline, table.get("Persisted@keeper")
        time.sleep(0.1)
    assert "\t\"offsetTable\":{" in text
    groups = config_files.loads((node.settings.root / "config" / "subscriptionGroup.json").read_text())
    assert groups["subscriptionGroupTable"]["keeper"]["retryMaxTimes"] == 16
