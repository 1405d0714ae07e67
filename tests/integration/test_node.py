"""A real node (Ray actors, ZeroMQ on 127.0.0.1, real files) driven by the Python client and by
raw ZeroMQ frames. One node for the module: Ray takes seconds to start."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest
import zmq
from helpers import wait_until
from nodes import ROOT, in_process_node

from node import protocol
from node.client import AsyncProducer, AsyncPullConsumer, Message, Producer, PullConsumer, SendError
from actors import host_tuning as cpu_latency
from node.server import topology
from shm.codec import decode_msg_id, encode, encode_host, properties_string
from shm.store import MessageStore
from shm.verify import verify_store

MAX_BODY = 64 * 1024


@pytest.fixture(scope="module", params=["compact", "split"])
def node(tmp_path_factory, request):
    """Every test runs against a node whose front writes the CommitLog (the default) and one
    with a writer process (and two pull workers: other test nodes run one)."""
    workers = {"pullWorkers": 2} if request.param == "split" else {}
    yield from in_process_node(tmp_path_factory.mktemp("node"), maxMessageSize=MAX_BODY, **workers,
                               topology=request.param, frontPinBelowCpu=0.7, cpuIdleLatencyUs=0,
                               after_stop=_verifies_after_a_clean_stop)


def _verifies_after_a_clean_stop(node) -> None:
    """After every test of the module, whatever they stored: a clean stop leaves a store whose
    every record passes verify, and no abort file."""
    report = verify_store(node.settings)
    assert report.ok, report.summary()
    assert not (node.settings.root / "abort").exists()


@pytest.fixture(scope="module")
def producer(node):
    with Producer(node.settings.listen, timeout=5.0) as p:
        yield p


@pytest.fixture
def raw(node):
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(node.settings.listen)

    def ask(frames: list[bytes], timeout_ms: int = 5000) -> dict:
        sock.send_multipart(frames)
        assert sock.poll(timeout_ms), "no reply: the node must answer everything"
        return orjson.loads(sock.recv_multipart()[0])

    yield ask
    sock.close(0)
    context.term()


def _record_at(node, offset_msg_id: str):
    _, offset = decode_msg_id(offset_msg_id)
    with MessageStore(node.settings, readonly=True) as store:
        return store.commitlog.read(offset, limit=offset + MAX_BODY * 2)


def test_sends_are_stored_as_rocketmq_stores_them(node, producer):
    result = producer.send("TopicA", b"hello", tags="TagA", keys=["k1", "k2"], properties={"color": "red"})
    assert result.status == "PUT_OK" and result.queue_offset == 0 and len(result.msg_id) == 32
    # What a 4.9 broker stores: the client's map plus CLUSTER, no WAIT, in Java HashMap order.
    _assert_stored_as(node, result, b"hello", {"color": "red", "TAGS": "TagA", "KEYS": "k1 k2",
                                              "UNIQ_KEY": result.msg_id, "CLUSTER": node.settings.brokerClusterName})


def test_plain_sends_are_stored_with_only_their_uniq_key(node, producer):
    """The client's plain-message path (no Message built) stores what the general path does."""
    result = producer.send("TopicA", "plain", queue_id=1)
    assert result.status == "PUT_OK" and result.queue_id == 1
    _assert_stored_as(node, result, b"plain", {"UNIQ_KEY": result.msg_id, "CLUSTER": node.settings.brokerClusterName})


def _assert_stored_as(node, result, body: bytes, properties: dict[str, str]) -> None:
    record = _record_at(node, result.offset_msg_id)
    store_host = encode_host(node.settings.brokerIP1, node.settings.listenPort)
    expected = encode(topic=result.topic, body=body, queue_id=result.queue_id, born_timestamp=record.born_timestamp,
                      born_host=encode_host(record.born_host.ip, record.born_host.port), store_host=store_host,
                      properties=properties_string(properties), queue_offset=result.queue_offset,
                      physical_offset=record.physical_offset, store_timestamp=record.store_timestamp)
    with MessageStore(node.settings, readonly=True) as store:
        assert store.commitlog.read_bytes(record.physical_offset, record.total_size) == expected
    assert record.born_host.ip == "127.0.0.1"


def test_round_robin_ordered_batch_oneway_and_delay(node, producer):
    queues = {producer.send("TopicB", f"m{i}").queue_id for i in range(16)}
    assert queues == set(range(node.settings.defaultTopicQueueNums))
    ordered = {producer.send("TopicB", "x", shard_key="order-42").queue_id for _ in range(5)}
    assert len(ordered) == 1
    results = producer.send_batch("TopicB", [Message("TopicB", b"a", tags="T"), b"b", "c"], queue_id=3)
    assert [r.queue_offset for r in results] == [results[0].queue_offset + i for i in range(3)]
    assert len({r.msg_id for r in results}) == 3
    first = _record_at(node, results[0].offset_msg_id)
    assert first.properties["TAGS"] == "T" and first.properties["CLUSTER"] == node.settings.brokerClusterName
    producer.send_oneway("TopicB", "fire and forget", queue_id=0)
    delayed = producer.send("TopicB", "later", delay_level=3, queue_id=2)
    record = _record_at(node, delayed.offset_msg_id)
    assert (record.topic, record.queue_id) == ("SCHEDULE_TOPIC_XXXX", 2)
    assert record.properties["REAL_TOPIC"] == "TopicB" and record.properties["REAL_QID"] == "2"


def test_an_async_client_serves_each_asyncio_run_in_turn_and_refuses_a_second_open_loop(node):
    """A module's AsyncProducer used by one asyncio.run after another: its connection was the first
    loop's (its replies read there), and the second run's send waited forever."""
    producer, consumer = AsyncProducer(node.settings.listen), AsyncPullConsumer(node.settings.listen)
    for _ in range(3):
        sent = asyncio.run(asyncio.wait_for(producer.send("TopicE", b"again", queue_id=0), 10))
        plain = asyncio.run(asyncio.wait_for(producer.send("TopicE", b"plain"), 10))
        batch = asyncio.run(asyncio.wait_for(producer.send_batch("TopicE", [b"a", b"b"], queue_id=1), 10))
        assert sent.status == plain.status == batch[0].status == "PUT_OK"
        pulled = asyncio.run(asyncio.wait_for(consumer.pull("TopicE", 0, sent.queue_offset), 10))
        assert pulled.messages[0].body == b"again"
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        assert asyncio.run_coroutine_threadsafe(producer.send("TopicE", b"there"), loop).result(10).status == "PUT_OK"
        with pytest.raises(RuntimeError, match="another event loop"):
            asyncio.run(producer.send("TopicE", b"here"))
        asyncio.run_coroutine_threadsafe(producer.close(), loop).result(10)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_concurrent_single_sends_are_coalesced(node):
    async def main():
        async with AsyncProducer(node.settings.listen, linger_ms=2) as p:
            results = await asyncio.gather(*[p.send("TopicC", f"body-{i}") for i in range(500)])
            return results

    results = asyncio.run(main())
    assert all(r.status == "PUT_OK" for r in results)
    assert len({r.offset_msg_id for r in results}) == 500
    by_queue = {}
    for r in results:
        by_queue.setdefault(r.queue_id, []).append(r.queue_offset)
    for offsets in by_queue.values():
        assert sorted(offsets) == list(range(len(offsets)))


def test_statuses_for_what_may_not_be_stored(node, producer):
    with pytest.raises(SendError) as e:
        producer.send("Topic With Spaces", "x")
    assert e.value.status == "MESSAGE_ILLEGAL"
    with pytest.raises(SendError) as e:
        producer.send("TopicA", b"x" * (MAX_BODY + 1))
    assert e.value.status == "MESSAGE_ILLEGAL" and "maxMessageSize" in e.value.remark
    with pytest.raises(SendError) as e:
        producer.send("TopicA", "x", properties={"big": "v" * 40000})
    assert e.value.status in ("PROPERTIES_SIZE_EXCEEDED", "MESSAGE_ILLEGAL")
    with pytest.raises(SendError) as e:
        producer.send("TopicA", "x", queue_id=99)
    assert e.value.status == "MESSAGE_ILLEGAL" and "queueId" in e.value.remark
    with pytest.raises(SendError) as e:
        producer.send("SCHEDULE_TOPIC_XXXX", "x", queue_id=0)
    assert e.value.status == "MESSAGE_ILLEGAL"
    for not_a_body in (123, None, ["x"]):  # (bytes(123) is 123 zero bytes: they were stored as if meant)
        with pytest.raises(TypeError, match="a message body is bytes or str"):
            producer.send("TopicA", not_a_body)
        with pytest.raises(TypeError, match="a message body is bytes or str"):
            producer.send_batch("TopicA", [b"fine", not_a_body])
    assert producer.send("TopicA", bytearray(b"still serving")).status == "PUT_OK"


@pytest.mark.parametrize("fields, error", [
    ({"properties": {"a": "x\x02TAGS\x01forged"}}, ValueError),  # (a batch's string: it set the tags)
    ({"tags": "t\x02KEYS\x01forged"}, ValueError),
    ({"properties": {"a": 1}}, TypeError),  # (a batch stored "1", a single send was refused)
    ({"properties": {"a": None}}, TypeError),  # ("None")
    ({"properties": {"a": ""}}, ValueError),  # (RocketMQ's parser drops it: stored, then gone)
    ({"properties": {"": "v"}}, ValueError),
    ({"keys": ["k", None]}, TypeError),  # (these two said "can only join an iterable" and the like)
    ({"keys": 5}, TypeError),
])
def test_what_a_message_cannot_store_is_refused_before_it_is_sent(node, producer, fields, error):
    offset = producer.send("TopicD", "before", queue_id=0).queue_offset
    said = "keys|property|tags"  # (what is wrong, named)
    with pytest.raises(error, match=said):
        producer.send_batch("TopicD", [Message("TopicD", b"m", **fields)], queue_id=0)
    with pytest.raises(error, match=said):
        producer.send("TopicD", "single", queue_id=0, **fields)
    after = producer.send("TopicD", "after", queue_id=0)
    assert after.queue_offset == offset + 1  # nothing stored between


def test_a_batch_message_with_properties_too_large_is_refused_as_a_single_send_is(node, producer):
    big = {"p": "v" * 32_800}  # (over the batch body's 2-byte length: struct's "'h' format requires ...")
    with pytest.raises(SendError) as single:
        producer.send("TopicD", "x", properties=big)
    with pytest.raises(SendError) as batched:
        producer.send_batch("TopicD", [b"fine", Message("TopicD", b"x", properties=big)], queue_id=2)
    assert single.value.status == batched.value.status == "PROPERTIES_SIZE_EXCEEDED"
    assert "message 1 of the batch" in batched.value.remark


def test_a_batch_stores_a_messages_str_body_as_utf8(node, producer):
    result = producer.send_batch("TopicD", [Message("TopicD", "text é", properties={"k": "v"})], queue_id=1)[0]
    record = _record_at(node, result.offset_msg_id)
    assert record.body == "text é".encode() and record.properties["k"] == "v"
    flagged = producer.send_batch("TopicD", [Message("TopicD", b"f", flag=-2**31)], queue_id=1)[0]
    assert _record_at(node, flagged.offset_msg_id).flag == -2**31
    for flag in (2**31, -2**31 - 1):  # (struct's "'i' format requires ..." at the batch's encoding)
        with pytest.raises(ValueError, match="flag is a 32-bit integer"):
            Message("TopicD", b"f", flag=flag)
    with pytest.raises(TypeError, match="delay_ms is an int"):  # ("unsupported operand type(s) for +" in send)
        producer.send("TopicD", "later", delay_ms="1000")


def test_malformed_frames_and_unknown_codes_get_error_replies(node, raw):
    assert raw([b"not json"])["status"] == "SYSTEM_ERROR"
    assert raw([b"[1, 2]"])["status"] == "SYSTEM_ERROR"
    assert raw([b'{"opaque": 5}'])["opaque"] == 5
    assert raw([b'{"code": 10}', b"body", b"third frame"])["status"] == "SYSTEM_ERROR"
    assert raw([b'{"code": 4242, "opaque": 1}'])["status"] == "REQUEST_CODE_NOT_SUPPORTED"
    sizes = orjson.dumps({"code": protocol.SEND_MESSAGES, "opaque": 2,
                          "messages": [{"topic": "TopicA", "queueId": 0, "bodySize": 10}]})
    assert raw([sizes, b"short"])["status"] == "SYSTEM_ERROR"
    bad_batch = orjson.dumps({"code": protocol.SEND_BATCH_MESSAGE, "opaque": 3, "topic": "TopicA", "queueId": 0})
    assert raw([bad_batch, b"\x00\x00\x00\x05garbage"])["status"] == "SYSTEM_ERROR"
    delayed_batch = orjson.dumps({"code": protocol.SEND_BATCH_MESSAGE, "opaque": 4, "topic": "TopicA", "queueId": 0,
                                  "properties": {"DELAY": "2"}})
    reply = raw([delayed_batch, protocol.encode_batch_body([(b"a", 0, "")])])
    assert reply["status"] == "MESSAGE_ILLEGAL"
    typed = orjson.dumps({"code": protocol.SEND_MESSAGE, "opaque": 6, "topic": "TopicA", "queueId": 0,
                          "flag": "not an int"})
    assert raw([typed, b"x"])["status"] == "MESSAGE_ILLEGAL"
    mixed = orjson.dumps({"code": protocol.SEND_MESSAGES, "opaque": 7, "messages": [
        {"topic": "TopicA", "queueId": 0, "bodySize": 1}, {"topic": "bad topic", "queueId": 0, "bodySize": 1}]})
    reply = raw([mixed, b"ab"])
    assert [r["status"] for r in reply["results"]] == ["PUT_OK", "MESSAGE_ILLEGAL"]
    reply = raw([mixed.replace(b'"messages"', b'"compact":true,"messages"'), b"ab"])
    assert [r["status"] for r in reply["results"]] == ["PUT_OK", "MESSAGE_ILLEGAL"]  # compact only when all stored
    compact = orjson.dumps({"code": protocol.SEND_MESSAGES, "opaque": 9, "compact": True, "messages": [
        {"topic": "TopicA", "queueId": 2, "bodySize": 1}, {"topic": "TopicA", "queueId": 2, "bodySize": 1}]})
    reply = raw([compact, b"ab"])
    assert "results" not in reply and reply["status"] == "PUT_OK" and reply["count"] == 2
    assert reply["queueOffsets"][1] == reply["queueOffsets"][0] + 1 and len(reply["offsetMsgId"].split(",")) == 2
    good = orjson.dumps({"code": protocol.SEND_MESSAGE, "opaque": 8, "topic": "TopicA", "queueId": 1})
    assert raw([good, b"after all that"])["status"] == "PUT_OK"


def test_cli_produce_and_admin_stats(node):
    endpoint = node.settings.listen
    done = subprocess.run([sys.executable, "-m", "node.tools.cli", "produce", "--endpoint", endpoint, "--topic", "CliTopic",
                           "--tags", "T1", "--keys", "a b", "--property", "k=v"],
                          input=b"one\ntwo\nthree\n\xff\x00 not text\r\n", cwd=ROOT, capture_output=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    lines = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert [line["status"] for line in lines] == ["PUT_OK"] * 4
    assert set(lines[0]) >= {"status", "msgId", "offsetMsgId", "queueId", "queueOffset"}
    record = _record_at(node, lines[1]["offsetMsgId"])
    assert record.body == b"two" and record.properties["k"] == "v" and record.keys == ["a", "b"]
    assert _record_at(node, lines[3]["offsetMsgId"]).body == b"\xff\x00 not text\r"  # (a line's bytes, as they came)
    failed = subprocess.run([sys.executable, "-m", "node.tools.cli", "produce", "--endpoint", endpoint, "--topic", "bad topic"],
                            input=b"x\n", cwd=ROOT, capture_output=True, timeout=60, check=False)
    assert failed.returncode == 1 and orjson.loads(failed.stdout)["status"] == "MESSAGE_ILLEGAL"
    empty = subprocess.run([sys.executable, "-m", "node.tools.cli", "produce", "--endpoint", endpoint, "--topic", "CliTopic",
                            "--property", "k="], input=b"x\n", cwd=ROOT, capture_output=True, timeout=60, check=False)
    assert empty.returncode == 2 and b"--property 'k='" in empty.stderr and not empty.stdout  # (it was sent, without k)
    stats = subprocess.run([sys.executable, "-m", "node.tools.cli", "admin", "stats", "--endpoint", endpoint],
                           cwd=ROOT, capture_output=True, timeout=60, check=False)
    assert stats.returncode == 0, stats.stderr
    shown = orjson.loads(stats.stdout)
    assert {"putMessageTimesTotal", "putMessageSizeTotal", "putTps", "putMessageDistributeTime",
            "putMessageEntireTimeMax"} <= set(shown["runtime"])
    assert {"front", "writer", "flush", "allocator", "dispatcher"} <= set(shown["actors"])
    # every service of the topology, with the process that hosts it and its pid
    hosts = topology.hosts(node.settings)
    assert {service: [h["process"] for h in placed] for service, placed in shown["services"].items()} == hosts
    assert all(h["pid"] == shown["actors"][h["process"]]["pid"] for placed in shown["services"].values() for h in placed)
    assert isinstance(shown["supervision"], dict)
    assert shown["actors"]["writer"]["nativeEncode"] is True  # the front's encode loops run in C
    assert shown["actors"]["writer"]["nativePlace"] is True  # and the append's patch loop
    assert shown["actors"]["dispatcher"]["nativeScan"] is True  # and so does the dispatcher's scan


def _thread_nice_values(pid: int) -> set[int]:
    values = set()
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        text = stat.read_text()
        values.add(int(text[text.rindex(")") + 2:].split()[16]))  # field 19 of proc(5): nice
    return values


# As a shell's foreground job: a background job's children inherit SIGINT ignored (a suite run
# under `nohup ... &`), and Python leaves an ignored SIGINT ignored.
FOREGROUND = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
              "runpy.run_module('node.tools.cli', run_name='__main__', alter_sys=True)")


def test_ctrl_c_ends_a_cli_consume_with_the_shells_status_and_no_traceback(node):
    with Producer(node.settings.listen) as producer:
        producer.send("CliCtrlC", b"one")
    consume = subprocess.Popen([sys.executable, "-c", FOREGROUND, "consume", "--endpoint", node.settings.listen,
                                "--topic", "CliCtrlC", "--group", "ctrl-c", "--timeout", "60"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert orjson.loads(consume.stdout.readline())["body"] == "one"
        consume.send_signal(signal.SIGINT)  # (waiting for the next message)
        status, said = consume.wait(30), consume.stderr.read()
        assert (status, said) == (130, b"")
    finally:
        if consume.poll() is None:
            consume.kill()


def test_dispatcher_and_allocator_loops_run_niced(node):
    """The dispatcher's loop runs at dispatcherNiceness and the allocator's at 10, so the front
    and the clients go first on a busy CPU. (Only those threads are looked for: in a Ray session
    a test process started, Ray's own threads run at its worker niceness.)"""
    run = node.settings.run_dir
    assert node.settings.dispatcherNiceness == 5
    pid = {name: int((run / f"{name}.pid").read_text()) for name in ("dispatcher", "allocator")}
    assert 5 in _thread_nice_values(pid["dispatcher"])
    assert 10 in _thread_nice_values(pid["allocator"])


def test_an_idle_front_keeps_its_threads_on_one_cpu(node):
    """frontPinBelowCpu (0.7 for this module's node, off by default): the front's process,
    well under 0.7 of a CPU while idle, has every thread on the one CPU its loop runs on within
    a few seconds, and says so in its statistics (actors.host_tuning)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: nothing to pin to")
    pid = int((node.settings.run_dir / "front.pid").read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        masks = {frozenset(os.sched_getaffinity(int(tid))) for tid in os.listdir(f"/proc/{pid}/task")}
        if len(masks) == 1 and len(next(iter(masks))) == 1:
            break
        time.sleep(0.2)
    assert len(masks) == 1 and len(next(iter(masks))) == 1, masks
    with Producer(node.settings.listen, timeout=5.0) as producer:
        info, _ = producer.request({"code": protocol.GET_BROKER_RUNTIME_INFO})
    pinning = info["actors"]["front"]["cpuPinning"]
    assert pinning["enabled"] and pinning["pins"] >= 1 and {pinning["pinnedCpu"]} == set(next(iter(masks)))


def test_a_serving_front_keeps_idle_cpus_quick_to_wake(node, producer):
    """cpuIdleLatencyUs 0 (opted in; -1, no request, is the default): after a request the front
    holds its PM QoS request
    (actors.host_tuning) and says so; where the device cannot be written it says why."""
    producer.send("TopicA", "wake")
    info, _ = producer.request({"code": protocol.GET_BROKER_RUNTIME_INFO})
    latency = info["actors"]["front"]["cpuLatency"]
    assert latency["limitUs"] == 0
    if latency["unavailable"] is not None:
        assert not os.access(cpu_latency.DEVICE, os.W_OK), latency
        return
    assert latency["held"] and latency["holds"] >= 1
    assert cpu_latency.limit_in_force() == 0


def test_topics_json_is_written_as_rocketmq_writes_it(node, producer):
    from actors import config_files

    producer.send("TopicJson", "x")
    text = (node.settings.root / "config" / "topics.json").read_text()
    assert text.startswith("{\n\t\"dataVersion\":{") and "\t\t\"TopicJson\":{\n" in text
    table = config_files.loads(text)["topicConfigTable"]["TopicJson"]
    assert table == {"order": False, "perm": 6, "readQueueNums": 8, "topicFilterType": "SINGLE_TAG",
                     "topicName": "TopicJson", "topicSysFlag": 0, "writeQueueNums": 8}


def test_reads_go_around_a_pull_worker_that_stopped_turning(node, producer):
    """A frozen pull worker (alive to Ray, its loop stopped: its heartbeat goes stale) gets no
    reads while the other pull worker turns: each read is answered at once, not when the
    frozen one is found hung and restarted."""
    if node.settings.topology != "split":
        pytest.skip("compact's front reads itself")
    producer.send("AroundFrozen", b"m", queue_id=0)
    pid = int((node.settings.run_dir / "pull-0.pid").read_text())  # (the first that keeps up: every read goes there)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(1.5)  # its heartbeat goes stale (the front's WORKER_SILENT_MS: 1 s)
        with PullConsumer(node.settings.listen, timeout=2.0) as consumer:
            for _ in range(20):
                assert consumer.max_offset("AroundFrozen", 0) == 1  # (a pull-1 answer; pull-0's would time out)
    finally:
        os.kill(pid, signal.SIGCONT)


def test_transactions_commit_and_roll_back_in_both_topologies(node, producer):
    """The transaction service (a process of its own in both topologies) re-puts commits and op
    records through the front's write path, and hears back, over its rings: a half a message and
    a one-half batch, committed and rolled back, read back once each."""
    from node.client import COMMIT_MESSAGE, ROLLBACK_MESSAGE, TransactionProducer

    with TransactionProducer(node.settings.listen, "PG-both", execute=lambda message, arg: arg) as transactions:
        kept = transactions.send_in_transaction("TxBoth", "kept", COMMIT_MESSAGE)
        dropped = transactions.send_in_transaction("TxBoth", "dropped", ROLLBACK_MESSAGE)
    assert (kept.end_status, dropped.end_status) == ("OK", "OK")
    halves = {"TRAN_MSG": "true", "PGROUP": "PG-both"}
    [whole] = producer.send_batch("TxBoth", [f"w{i}" for i in range(5)], queue_id=kept.queue_id, properties=halves,
                                  one_half=True)
    ends = [{"tranStateTableOffset": whole.queue_offset, "commitLogOffset": decode_msg_id(whole.offset_msg_id)[1],
             "commitOrRollback": 8}]
    reply, _ = producer.request({"code": protocol.END_TRANSACTIONS, "producerGroup": "PG-both", "ends": ends})
    assert [r["status"] for r in reply["results"]] == ["OK"], reply
    with PullConsumer(node.settings.listen) as consumer:  # (an end is answered once its commit is stored; the
        # ConsumeQueue is the dispatcher's to write after that, and a loaded machine is a moment behind)
        wait_until(lambda: consumer.max_offset("TxBoth", kept.queue_id) >= 6, 10, "the commits to be dispatched")
        result = consumer.pull("TxBoth", kept.queue_id, 0, max_count=32)
    assert [m.body for m in result.messages] == [b"kept", *(f"w{i}".encode() for i in range(5))]
