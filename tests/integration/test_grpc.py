"""The gRPC proxy (docs/protocol.md "gRPC") on a real node, driven by Apache RocketMQ's official
Python client (rocketmq-python-client: its Producer, SimpleConsumer and PushConsumer, in
subprocesses, tests/integration/rocketmq5_client.py), by its official Node.js client
(rocketmq-client-nodejs on grpc-js, not grpcio's C core: tests/nodejs/client.js, the same
commands, held to the same answers) and by plain gRPC calls with the node's own stubs for what a
client library never sends: malformed and refused requests, streams left open, clients that
vanish mid-call."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import grpc
import pytest
from nodes import ROOT, free_port, grpc_endpoint, nodejs, nodejs_missing, official, running_node

from actors.proxy.apis import definition_pb2 as pb
from actors.proxy.apis import service_pb2 as rpc
from actors.proxy.apis import service_pb2_grpc
from node import protocol
from node.client import Producer, PullConsumer

pytestmark = pytest.mark.slow
Code = pb.Code


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    directory = tmp_path_factory.mktemp("grpc")
    # retries back off along the delay levels from level 3: 1 s here, so retries and DLQs are quick;
    # a push consumer's messages are invisible 3 s at first and renewed 3 s at a time 1.5 s before;
    # consumers long-poll 3 s (a push consumer's shutdown waits out the receive in flight)
    yield from running_node(directory, grpcServerPort=free_port(), messageDelayLevel="1s 1s 1s 1s 1s 1s",
                            defaultInvisibleTimeMills=3000, renewAheadTimeMillis=1500, renewSliceTimeMillis=3000,
                            grpcClientConsumerMaxLongPollingTimeoutMillis=3000, transactionTimeOut=1000,
                            transactionCheckInterval=1000, enablePropertyFilter=True)


@pytest.fixture(scope="module")
def stub(node):
    with grpc.insecure_channel(grpc_endpoint(node)) as channel:
        yield service_pb2_grpc.MessagingServiceStub(channel)


META = (("x-mq-client-id", "test-client-1"), ("x-mq-language", "PYTHON"))


def admin_group(node, group: str, **fields) -> None:
    with Producer(node.endpoint) as client:
        reply, _ = client.request({"code": protocol.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, "groupName": group, **fields})
        assert reply["status"] == "OK", reply


def dead_letters(node, group: str, want: int) -> list:
    """What %DLQ%<group> holds once `want` messages are there (or after 10 s, whatever is)."""
    with PullConsumer(node.endpoint) as consumer:
        deadline, dead = time.monotonic() + 10, []
        while len(dead) < want and time.monotonic() < deadline:
            dead = consumer.pull(f"%DLQ%{group}", 0, 0, max_count=max(want, 10)).messages
            time.sleep(0.2)
    return dead


def service_statistics(node, service: str) -> dict:
    """A service's statistics as the front last had them (each pushes them once a second)."""
    with Producer(node.endpoint) as client:
        info, _ = client.request({"code": protocol.GET_BROKER_RUNTIME_INFO})
    return info["actors"][service]


def proxy_statistics(node) -> dict:
    return service_statistics(node, "proxy")


# -- the official client ------------------------------------------------------------------------------


def no_errors(lines: list[dict]) -> list[dict]:
    assert not [line for line in lines if "error" in line], lines
    return lines


def round_trip(client, node, topic: str) -> list[dict]:
    """40 sends of `client` (an official client's driver: `official`, `nodejs`), 20 of them with a
    tag, keys and a property, 20 async; its simple consumer of group `topic`G gets each once, with
    its fields, and then nothing more. What it got."""
    sent = client(node, "produce", "--topic", topic, "--count", "20", "--tag", "TagA", "--keys", "k1")
    sent += client(node, "produce", "--topic", topic, "--count", "20", "--async", "--prefix", "a")
    assert len(no_errors(sent)) == 40 and len({s["id"] for s in sent}) == 40
    got = client(node, "simple", "--topic", topic, "--group", f"{topic}G", "--want", "40", "--seconds", "30")
    assert sorted(g["id"] for g in got) == sorted(s["id"] for s in sent)
    first = next(g for g in got if g["body"] == "m0")
    assert first["tag"] == "TagA" and first["keys"] == ["k1"] and first["properties"] == {"index": "0"}
    assert {g["attempt"] for g in got} == {1} and {g["topic"] for g in got} == {topic}
    assert client(node, "simple", "--topic", topic, "--group", f"{topic}G", "--want", "1", "--seconds", "2") == []
    return got


def test_the_official_producer_and_simple_consumer_round_trip(node):
    round_trip(official, node, "G5Round")


def test_the_official_simple_consumer_with_a_sql92_filter_gets_what_it_selects_and_no_more(node):
    sent = official(node, "produce", "--topic", "G5Sql", "--count", "20", "--tag", "TagA")
    assert len(sent) == 20 and not [s for s in sent if "error" in s], sent
    got = official(node, "simple", "--topic", "G5Sql", "--group", "G5SqlG", "--want", "5", "--seconds", "30",
                   "--filter", "index >= 15 AND TAGS = 'TagA'", "--sql")
    assert sorted(int(g["properties"]["index"]) for g in got) == list(range(15, 20)), got
    assert official(node, "simple", "--topic", "G5Sql", "--group", "G5SqlG", "--want", "1", "--seconds", "3",
                    "--filter", "index >= 15", "--sql") == []  # (the others were stepped over, the five acked)


def test_the_official_producer_recalls_a_delayed_message_before_its_time(node):
    sent = official(node, "produce", "--topic", "G5Recall", "--count", "4", "--delay-ms", "4000", "--recall", "2")
    assert not [s for s in sent if "error" in s], sent
    ids, recalled = [s["id"] for s in sent if "id" in s], [s["recalled"] for s in sent if "recalled" in s]
    assert len(ids) == 4 and recalled == ids[:2]
    got = official(node, "simple", "--topic", "G5Recall", "--group", "G5RecallG", "--want", "2", "--seconds", "20")
    assert sorted(g["id"] for g in got) == sorted(ids[2:])
    assert official(node, "simple", "--topic", "G5Recall", "--group", "G5RecallG", "--want", "1", "--seconds", "3") == []


def test_the_official_transactional_producer_commits_rolls_back_and_answers_checks(node):
    """RocketMQ 5's transactional Producer: commit visible once, rollback never; a half left open
    is checked through the proxy (RecoverOrphanedTransactionCommand on its Telemetry stream) and
    its TransactionChecker's answer ends it."""
    sent = official(node, "transaction", "--topic", "G5Tx", "--count", "3", "--end", "commit", "--prefix", "c")
    sent += official(node, "transaction", "--topic", "G5Tx", "--count", "2", "--end", "rollback", "--prefix", "r")
    assert len(sent) == 5 and not [s for s in sent if "error" in s], sent
    assert all(s["transaction"] for s in sent)
    lines = official(node, "transaction", "--topic", "G5Tx", "--count", "2", "--end", "none", "--prefix", "u",
                     "--check-answer", "commit", "--seconds", "20", "--checks", "2")
    checked = [line["checked"] for line in lines if "checked" in line]
    assert sorted(checked) == sorted(line["id"] for line in lines if "transaction" in line), lines
    got = official(node, "simple", "--topic", "G5Tx", "--group", "G5TxG", "--want", "5", "--seconds", "20")
    assert sorted(g["body"] for g in got) == ["c0", "c1", "c2", "u0", "u1"]
    assert {g["id"] for g in got} >= {s["id"] for s in sent if s["end"] == "commit"}
    assert official(node, "simple", "--topic", "G5Tx", "--group", "G5TxG", "--want", "1", "--seconds", "3") == []


def test_end_transaction_refuses_a_transaction_id_it_never_gave(node, stub):
    request = rpc.EndTransactionRequest(topic=pb.Resource(name="G5Tx"), message_id="X", transaction_id="nope",
                                        resolution=pb.COMMIT)
    response = stub.EndTransaction(request, metadata=META, timeout=10)
    assert response.status.code == Code.INVALID_TRANSACTION_ID
    request.transaction_id = "7F0000010000326F0000000000000000-999999"  # (well formed, no half there)
    response = stub.EndTransaction(request, metadata=META, timeout=10)
    assert response.status.code == Code.INVALID_TRANSACTION_ID and "half" in response.status.message


def test_unacked_messages_come_back_after_their_invisible_duration_with_the_next_attempt(node):
    official(node, "produce", "--topic", "G5Back", "--count", "5")
    began = time.monotonic()
    first = official(node, "simple", "--topic", "G5Back", "--group", "G5BackG", "--want", "5", "--invisible", "2",
                     "--mode", "none")
    assert len(first) == 5 and {m["attempt"] for m in first} == {1}
    again = official(node, "simple", "--topic", "G5Back", "--group", "G5BackG", "--want", "5", "--seconds", "20")
    assert sorted(m["body"] for m in again) == sorted(m["body"] for m in first)
    assert {m["attempt"] for m in again} == {2} and time.monotonic() - began >= 2


def test_change_invisible_duration_holds_a_message_longer(node):
    official(node, "produce", "--topic", "G5Change", "--count", "3")
    changed = official(node, "simple", "--topic", "G5Change", "--group", "G5ChangeG", "--want", "3", "--invisible", "2",
                       "--mode", "change:30")
    assert len(changed) == 3 and all(m["changed"] for m in changed)
    time.sleep(3)  # past the first 2 s: still invisible for the 30 s the change gave
    assert official(node, "simple", "--topic", "G5Change", "--group", "G5ChangeG", "--want", "1", "--seconds", "3") == []


def test_fifo_messages_of_a_group_keep_one_queue_and_a_fifo_group_consumes_them_in_order(node):
    admin_group(node, "G5FifoG", consumeMessageOrderly=True, retryMaxTimes=3)
    for group in ("g1", "g2"):
        sent = official(node, "produce", "--topic", "G5Fifo", "--count", "10", "--message-group", group, "--prefix", group)
        assert [s["offset"] for s in sent] == list(range(10)), sent  # one queue, in order
    got = official(node, "push", "--topic", "G5Fifo", "--group", "G5FifoG", "--seconds", "60", "--fail-first", "1",
                   "--successes", "20")  # (~10 s alone; a loaded machine's redeliveries take longer)
    for group in ("g1", "g2"):
        mine = [m for m in got if m["group"] == group]
        done = [m["body"] for m in mine if m["result"] == "SUCCESS"]
        assert done == [f"{group}{i}" for i in range(10)], mine
        # in order: each message failed once and came back before the next one was handed out
        assert [m["body"] for m in mine] == [f"{group}{i}" for i in range(10) for _ in (1, 2)]


def test_a_delivery_timestamp_holds_the_message_until_it_is_due(node):
    sent_at = time.time()
    official(node, "produce", "--topic", "G5Delay", "--count", "1", "--delay-ms", "3000", "--prefix", "later")
    got = official(node, "simple", "--topic", "G5Delay", "--group", "G5DelayG", "--want", "1", "--seconds", "20")
    assert [m["body"] for m in got] == ["later0"] and time.time() - sent_at >= 2.0


def test_the_push_consumer_retries_and_the_node_dead_letters_past_retry_max_times(node):
    admin_group(node, "G5PushG", retryMaxTimes=1)
    official(node, "produce", "--topic", "G5Push", "--count", "3", "--prefix", "p")
    got = official(node, "push", "--topic", "G5Push", "--group", "G5PushG", "--seconds", "20", "--fail-all",
                   "--tries", "6")
    assert sorted((m["body"], m["attempt"]) for m in got) == [(f"p{i}", a) for i in range(3) for a in (1, 2)]
    assert sorted(m.body for m in dead_letters(node, "G5PushG", 3)) == [b"p0", b"p1", b"p2"]


def test_a_push_consumers_slow_listener_keeps_its_message_the_proxy_renewing_it(node):
    official(node, "produce", "--topic", "G5Slow", "--count", "2", "--prefix", "slow")
    before = proxy_statistics(node)
    got = official(node, "push", "--topic", "G5Slow", "--group", "G5SlowG", "--seconds", "20", "--sleep", "8",
                   "--successes", "2")
    # each taken once (8 s of listener against 3 s of invisible time, renewed meanwhile) and acked
    assert sorted((m["body"], m["attempt"], m["result"]) for m in got) == [("slow0", 1, "SUCCESS"),
                                                                           ("slow1", 1, "SUCCESS")], got
    time.sleep(1.5)  # (the proxy pushes its statistics once a second)
    after = proxy_statistics(node)
    assert after["pid"] == before["pid"]
    assert after["renewals"] - before["renewals"] >= 4  # (two messages, renewed 1.5 s before each 3 s runs out)
    assert official(node, "simple", "--topic", "G5Slow", "--group", "G5SlowG", "--want", "1", "--seconds", "4") == []


def test_sent_over_grpc_reads_the_same_over_zeromq_and_the_other_way(node, stub):
    sent = official(node, "produce", "--topic", "G5Cross", "--count", "1", "--tag", "T1", "--keys", "key1")
    with PullConsumer(node.endpoint) as consumer:
        message = next(m for q in range(8) for m in consumer.pull("G5Cross", q, 0).messages)
    assert (message.msg_id, message.tags, message.keys, message.body) == (sent[0]["id"], "T1", ["key1"], b"m0")
    assert message.properties["index"] == "0"
    with Producer(node.endpoint) as producer:
        result = producer.send("G5Cross2", b"from zmq", tags="T2", keys=["a", "b"], properties={"p": "v"})
    got = official(node, "simple", "--topic", "G5Cross2", "--group", "G5CrossG", "--want", "1", "--seconds", "20")
    assert got[0]["id"] == result.msg_id and got[0]["body"] == "from zmq" and got[0]["tag"] == "T2"
    assert got[0]["keys"] == ["a", "b"] and got[0]["properties"] == {"p": "v"}


# -- plain gRPC: what a client library never sends ---------------------------------------------------


def message(topic: str, body: bytes = b"x", **system) -> pb.Message:
    out = pb.Message(topic=pb.Resource(name=topic), body=body)
    out.system_properties.message_id = system.pop("message_id", "0102FC00000001000000000000000001")
    out.system_properties.message_type = system.pop("message_type", pb.NORMAL)
    for name, value in system.items():
        setattr(out.system_properties, name, value)
    return out


@pytest.mark.parametrize("bad, code", [
    (message("bad topic!"), Code.ILLEGAL_TOPIC),
    (message("TBW102"), Code.ILLEGAL_TOPIC),  # a system topic
    (message("G5Bad", b""), Code.MESSAGE_BODY_EMPTY),
    (message("G5Bad", b"x" * (4 * 1024 * 1024 + 1)), Code.MESSAGE_BODY_TOO_LARGE),
    (message("G5Bad", tag="a|b"), Code.ILLEGAL_MESSAGE_TAG),
    (message("G5Bad", message_id=""), Code.ILLEGAL_MESSAGE_ID),
    (message("G5Bad", message_type=pb.LITE), Code.UNSUPPORTED),
    (message("G5Bad", message_type=pb.FIFO), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (message("G5Bad", message_type=pb.FIFO, message_group="g" * 65), Code.ILLEGAL_MESSAGE_GROUP),
])
def test_a_message_the_proxy_refuses_gets_the_protocol_status_and_stores_nothing(node, stub, bad, code):
    response = stub.SendMessage(rpc.SendMessageRequest(messages=[bad]), metadata=META, timeout=10)
    assert response.status.code == code and response.entries[0].status.code == code, response.status
    assert response.status.message


def test_a_reserved_property_and_a_far_delivery_time_are_refused(node, stub):
    reserved = message("G5Bad")
    reserved.user_properties["UNIQ_KEY"] = "mine"
    far = message("G5Bad", message_type=pb.DELAY)
    far.system_properties.delivery_timestamp.FromMilliseconds(int(time.time() * 1000) + 10 * 86_400_000)
    codes = [stub.SendMessage(rpc.SendMessageRequest(messages=[m]), metadata=META, timeout=10).status.code
             for m in (reserved, far)]
    assert codes == [Code.ILLEGAL_MESSAGE_PROPERTY_KEY, Code.ILLEGAL_DELIVERY_TIME]


def test_one_bad_message_of_a_batch_fails_alone(node, stub):
    good, bad = message("G5Mixed", b"fine"), message("G5Mixed", b"")
    response = stub.SendMessage(rpc.SendMessageRequest(messages=[good, bad]), metadata=META, timeout=10)
    assert response.status.code == Code.MULTIPLE_RESULTS
    assert [e.status.code for e in response.entries] == [Code.OK, Code.MESSAGE_BODY_EMPTY]


def test_what_this_node_does_not_serve_answers_not_implemented_and_the_rest_goes_on(node, stub):
    lite = stub.SyncLiteSubscription(rpc.SyncLiteSubscriptionRequest(topic=pb.Resource(name="G5Tx"),
                                                                     group=pb.Resource(name="G")),
                                     metadata=META, timeout=10)
    assert lite.status.code == Code.NOT_IMPLEMENTED
    recalled = stub.RecallMessage(rpc.RecallMessageRequest(topic=pb.Resource(name="G5Tx"), recall_handle="h"),
                                  metadata=META, timeout=10)
    assert recalled.status.code == Code.BAD_REQUEST  # (not a handle)
    route = stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="G5Tx")), metadata=META, timeout=10)
    assert route.status.code == Code.OK and len(route.message_queues) == 8
    assert {q.permission for q in route.message_queues} == {pb.READ_WRITE}
    assert set(route.message_queues[0].accept_message_types) == {pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION}


def pull(stub, topic: str, queue: int, offset: int, *, batch: int = 32, tags: str = "*", wait_ms: int = 0,
         group: str = "G5PullG") -> tuple[int, list[pb.Message], int | None]:
    """PullMessage: (status code, messages, next offset)."""
    request = rpc.PullMessageRequest(group=pb.Resource(name=group), offset=offset, batch_size=batch,
                                     message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=queue),
                                     filter_expression=pb.FilterExpression(type=pb.TAG, expression=tags))
    request.long_polling_timeout.FromMilliseconds(wait_ms)
    answers = list(stub.PullMessage(request, metadata=META, timeout=10 + wait_ms / 1000))
    assert answers[0].HasField("status") and all(a.HasField("message") for a in answers[1:-1]), answers
    next_offset = answers[-1].next_offset if answers[-1].WhichOneof("content") == "next_offset" else None
    return answers[0].status.code, [a.message for a in answers[1:-1]], next_offset


def offset_of(stub, rpc_name: str, topic: str, queue: int, **fields):
    request_type = getattr(rpc, f"{rpc_name}Request")
    return getattr(stub, rpc_name)(request_type(message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=queue),
                                                **fields), metadata=META, timeout=10)


def test_a_pull_consumer_over_grpc_pulls_a_queue_from_an_offset_and_keeps_its_own_offsets(node, stub):
    """PullMessage, QueryOffset, UpdateOffset and GetOffset, as RocketMQ 5's pull consumers use
    them: the pull reads what ZeroMQ's pull reads, from the offset asked, and commits nothing."""
    topic, group = "G5Pull", pb.Resource(name="G5PullG")
    pulled_before = proxy_statistics(node)["messagesPulled"]
    with Producer(node.endpoint) as producer:
        sent = [producer.send(topic, f"p{i}".encode(), tags="even" if i % 2 == 0 else "odd", keys=[f"k{i}"],
                              queue_id=2) for i in range(10)]
    low = offset_of(stub, "QueryOffset", topic, 2, query_offset_policy=pb.BEGINNING)
    high = offset_of(stub, "QueryOffset", topic, 2, query_offset_policy=pb.END)
    assert (low.status.code, low.offset, high.status.code, high.offset) == (Code.OK, 0, Code.OK, 10)

    code, messages, next_offset = pull(stub, topic, 2, 3, batch=4)
    assert (code, next_offset) == (Code.OK, 7)
    assert [m.body for m in messages] == [b"p3", b"p4", b"p5", b"p6"]
    first = messages[0].system_properties
    assert (first.message_id, first.queue_id, first.queue_offset, first.tag, list(first.keys)) == (
        sent[3].msg_id, 2, 3, "odd", ["k3"])
    assert first.delivery_attempt == 1 and not first.receipt_handle and first.message_type == pb.NORMAL
    with PullConsumer(node.endpoint) as consumer:  # the same message, as ZeroMQ's pull reads it
        zmq_message = consumer.pull(topic, 2, 3, max_count=1).messages[0]
    assert first.store_timestamp.ToMilliseconds() == zmq_message.store_timestamp and first.born_host == zmq_message.born_host

    code, messages, next_offset = pull(stub, topic, 2, 0, tags="even")
    assert code == Code.OK and [m.body for m in messages] == [b"p0", b"p2", b"p4", b"p6", b"p8"] and next_offset == 10
    assert pull(stub, topic, 2, 10, wait_ms=0) == (Code.MESSAGE_NOT_FOUND, [], 10)
    code, _, next_offset = pull(stub, topic, 2, 50)
    assert code == Code.ILLEGAL_OFFSET and next_offset == 10  # (the node says where to go on from)

    # the pull committed nothing; the consumer's own offset is what UpdateOffset sets
    assert offset_of(stub, "GetOffset", topic, 2, group=group).status.code == Code.OFFSET_NOT_FOUND
    assert offset_of(stub, "UpdateOffset", topic, 2, group=group, offset=7).status.code == Code.OK
    got = offset_of(stub, "GetOffset", topic, 2, group=group)
    assert (got.status.code, got.offset) == (Code.OK, 7)
    assert offset_of(stub, "UpdateOffset", topic, 2, group=group, offset=-1).status.code == Code.ILLEGAL_OFFSET
    assert pull(stub, "G5NoSuchTopic", 0, 0)[0] == Code.TOPIC_NOT_FOUND
    assert pull(stub, topic, 2, -1)[0] == Code.ILLEGAL_OFFSET
    assert pull(stub, topic, -1, 0)[0] == Code.BAD_REQUEST
    assert pull(stub, topic, 2, 0, batch=0)[0] == Code.BAD_REQUEST
    deadline = time.monotonic() + 5
    while proxy_statistics(node)["messagesPulled"] - pulled_before < 9:  # (statistics come once a second)
        assert time.monotonic() < deadline, "the proxy did not count the 9 messages pulled"
        time.sleep(0.2)


def test_a_pull_at_the_end_of_a_queue_waits_for_the_next_message(node, stub):
    import threading

    topic = "G5PullWait"
    with Producer(node.endpoint) as producer:
        producer.send(topic, b"first", queue_id=0)
        began = time.monotonic()
        assert pull(stub, topic, 0, 1, wait_ms=600) == (Code.MESSAGE_NOT_FOUND, [], 1)
        assert time.monotonic() - began >= 0.5  # (it waited, as long as it asked)
        sender = threading.Timer(0.5, lambda: producer.send(topic, b"second", queue_id=0))
        sender.start()
        began = time.monotonic()
        code, messages, next_offset = pull(stub, topic, 0, 1, wait_ms=20_000)
        waited = time.monotonic() - began
        sender.join()  # (its send's answer may come after the pull's: the producer is closed after it)
    assert (code, [m.body for m in messages], next_offset) == (Code.OK, [b"second"], 2)
    assert 0.4 <= waited < 10, waited


def test_stale_and_forged_receipt_handles_are_refused_and_ack_nothing_else(node, stub):
    with Producer(node.endpoint) as producer:
        producer.send("G5Handles", b"h")
    group, topic = pb.Resource(name="G5HandlesG"), pb.Resource(name="G5Handles")
    received = list(stub.ReceiveMessage(rpc.ReceiveMessageRequest(
        group=group, message_queue=pb.MessageQueue(topic=topic, id=-1), batch_size=4,
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*")), metadata=META, timeout=10))
    handle = next(r.message.system_properties.receipt_handle for r in received if r.HasField("message"))
    for forged in ("nonsense", "99 G5Handles 0 0", handle.replace(" 0 ", " 1 "), "\x00"):
        ack = stub.AckMessage(rpc.AckMessageRequest(group=group, topic=topic, entries=[
            rpc.AckMessageEntry(message_id="x", receipt_handle=forged)]), metadata=META, timeout=10)
        assert ack.status.code == Code.INVALID_RECEIPT_HANDLE, (forged, ack)
    ok = stub.AckMessage(rpc.AckMessageRequest(group=group, topic=topic, entries=[
        rpc.AckMessageEntry(message_id="x", receipt_handle=handle)]), metadata=META, timeout=10)
    again = stub.AckMessage(rpc.AckMessageRequest(group=group, topic=topic, entries=[
        rpc.AckMessageEntry(message_id="x", receipt_handle=handle)]), metadata=META, timeout=10)
    assert ok.status.code == Code.OK and again.status.code == Code.INVALID_RECEIPT_HANDLE


def test_malformed_protobufs_get_an_error_and_the_proxy_serves_on(node, stub):
    with grpc.insecure_channel(grpc_endpoint(node)) as channel:
        for method in ("SendMessage", "QueryRoute", "AckMessage", "ChangeInvisibleDuration", "Heartbeat"):
            raw = channel.unary_unary(f"/apache.rocketmq.v2.MessagingService/{method}")
            for garbage in (b"\xff\xff\xff\xff", b"\x0a\xff\x01", bytes(range(256))):
                try:
                    raw(garbage, timeout=5)
                except grpc.RpcError as e:
                    assert e.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT,
                                        grpc.StatusCode.UNKNOWN), e
    route = stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="G5Alive")), metadata=META, timeout=10)
    assert route.status.code == Code.OK


def test_a_thousand_open_streams_and_a_client_gone_mid_receive_leave_the_proxy_serving(node, stub):
    import asyncio

    async def crowd():
        async with grpc.aio.insecure_channel(grpc_endpoint(node)) as channel:
            aio_stub = service_pb2_grpc.MessagingServiceStub(channel)
            calls = [aio_stub.Telemetry(metadata=(("x-mq-client-id", f"crowd-{i}"),)) for i in range(1000)]
            settings = rpc.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER,
                                                                 publishing=pb.Publishing()))
            await asyncio.gather(*(call.write(settings) for call in calls))
            answers = await asyncio.gather(*(call.read() for call in calls))
            assert {a.status.code for a in answers} == {Code.OK}
            assert {a.settings.publishing.max_body_size for a in answers} == {4 * 1024 * 1024}
            held = aio_stub.ReceiveMessage(rpc.ReceiveMessageRequest(
                group=pb.Resource(name="G5GoneG"), message_queue=pb.MessageQueue(topic=pb.Resource(name="G5Gone"), id=-1),
                batch_size=4, long_polling_timeout={"seconds": 20}), metadata=META, timeout=30)
            await asyncio.sleep(0.5)
            held.cancel()  # the client vanishes while its receive is held
            for call in calls:
                call.cancel()

    with Producer(node.endpoint) as producer:
        producer.send("G5Gone", b"first")
    asyncio.run(crowd())
    route = stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="G5Gone")), metadata=META, timeout=10)
    assert route.status.code == Code.OK
    # nothing is lost: what the vanished client's receive took (if it got that far) comes back once
    # its invisible time (3 s here) runs out, as a second delivery
    again = rpc.ReceiveMessageRequest(group=pb.Resource(name="G5GoneG"), batch_size=4,
                                      message_queue=pb.MessageQueue(topic=pb.Resource(name="G5Gone"), id=-1))
    again.long_polling_timeout.FromSeconds(10)
    back = [r.message for r in stub.ReceiveMessage(again, metadata=META, timeout=20) if r.HasField("message")]
    assert [m.body for m in back] == [b"first"] and back[0].system_properties.delivery_attempt in (1, 2)
    deadline = time.monotonic() + 5
    while True:  # (statistics come to the front once a second)
        stats = proxy_statistics(node)
        if stats["clients"] >= 1000 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert stats["errors"] == 0 and stats["clients"] >= 1000, stats


def test_a_receive_its_client_cancelled_while_waiting_hands_the_next_message_to_the_next_receive(node, stub):
    """The client left while its receive waited at the node: what that pop takes when a message
    comes is given back (visible again in a second, as RocketMQ 5's proxy nacks what it could not
    write), not hidden for the minute that receive asked for."""
    import asyncio

    with Producer(node.endpoint) as producer:
        reply, _ = producer.request({"code": protocol.UPDATE_AND_CREATE_TOPIC, "topic": "G5Left", "readQueueNums": 1,
                                     "writeQueueNums": 1})
        assert reply["status"] == "OK", reply
    before = proxy_statistics(node)
    waiting = rpc.ReceiveMessageRequest(group=pb.Resource(name="G5LeftG"), batch_size=4,
                                        message_queue=pb.MessageQueue(topic=pb.Resource(name="G5Left"), id=-1),
                                        invisible_duration={"seconds": 60}, long_polling_timeout={"seconds": 20})

    def pops_held() -> int:
        return service_statistics(node, "pop")["held"]

    async def leave_while_waiting():
        async with grpc.aio.insecure_channel(grpc_endpoint(node)) as channel:
            held = service_pb2_grpc.MessagingServiceStub(channel).ReceiveMessage(waiting, metadata=META, timeout=30)
            deadline = time.monotonic() + 10
            while await asyncio.to_thread(pops_held) == 0:  # (statistics come once a second)
                assert time.monotonic() < deadline, "the receive's pop was never held at the node"
                await asyncio.sleep(0.2)
            held.cancel()

    asyncio.run(leave_while_waiting())
    deadline = time.monotonic() + 10  # (a message that reached the stream before the cancel did is the client's)
    while proxy_statistics(node)["receivesLeft"] == before["receivesLeft"]:
        assert time.monotonic() < deadline, "the proxy never saw the receive cancelled"
        time.sleep(0.2)
    with Producer(node.endpoint) as producer:
        producer.send("G5Left", b"after")  # the parked pop takes it, for nobody
    deadline = time.monotonic() + 10
    while pops_held():  # (taken once the pop service sees it dispatched; before that a new pop might win it)
        assert time.monotonic() < deadline, "the held pop never answered"
        time.sleep(0.2)
    again = rpc.ReceiveMessageRequest(group=pb.Resource(name="G5LeftG"), batch_size=4,
                                      message_queue=pb.MessageQueue(topic=pb.Resource(name="G5Left"), id=-1),
                                      invisible_duration={"seconds": 60}, long_polling_timeout={"seconds": 8})
    started = time.monotonic()
    back = [r.message for r in stub.ReceiveMessage(again, metadata=META, timeout=20) if r.HasField("message")]
    assert [m.body for m in back] == [b"after"], back
    assert time.monotonic() - started < 6
    deadline = time.monotonic() + 5
    while proxy_statistics(node)["messagesGivenBack"] == before["messagesGivenBack"] and time.monotonic() < deadline:
        time.sleep(0.2)  # (statistics come to the front once a second)
    assert proxy_statistics(node)["messagesGivenBack"] == before["messagesGivenBack"] + 1


def test_an_unknown_group_or_bad_times_in_a_receive_get_their_statuses(node, stub):
    topic = pb.Resource(name="G5Times")
    cases = [(rpc.ReceiveMessageRequest(group=pb.Resource(name="bad group"), batch_size=1,
                                        message_queue=pb.MessageQueue(topic=topic)), Code.ILLEGAL_CONSUMER_GROUP),
             (rpc.ReceiveMessageRequest(group=pb.Resource(name="G"), batch_size=0,
                                        message_queue=pb.MessageQueue(topic=topic)), Code.BAD_REQUEST),
             (rpc.ReceiveMessageRequest(group=pb.Resource(name="G"), batch_size=1, invisible_duration={"nanos": 5},
                                        message_queue=pb.MessageQueue(topic=topic)), Code.ILLEGAL_INVISIBLE_TIME),
             (rpc.ReceiveMessageRequest(group=pb.Resource(name="G"), batch_size=1,
                                        long_polling_timeout={"seconds": 3600},
                                        message_queue=pb.MessageQueue(topic=topic)), Code.ILLEGAL_POLLING_TIME),
             (rpc.ReceiveMessageRequest(group=pb.Resource(name="G"), batch_size=1,
                                        filter_expression=pb.FilterExpression(type=pb.SQL, expression="a > 'x'"),
                                        message_queue=pb.MessageQueue(topic=topic)), Code.ILLEGAL_FILTER_EXPRESSION),
             (rpc.ReceiveMessageRequest(group=pb.Resource(name="G"), batch_size=1,
                                        message_queue=pb.MessageQueue(topic=pb.Resource(name="G5NoSuchTopic"))),
              Code.TOPIC_NOT_FOUND)]
    for request, code in cases:
        answers = list(stub.ReceiveMessage(request, metadata=META, timeout=10))
        assert [a.status.code for a in answers] == [code], (request, answers)


def test_a_node_whose_grpc_port_is_taken_says_so_and_does_not_start(node, tmp_path):
    done = subprocess.run([sys.executable, "-m", "node.tools.cli", "start", "--store", str(tmp_path / "store"),
                           "--listen", f"tcp://127.0.0.1:{free_port()}", "--grpcServerPort", str(node.settings.grpc_port)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "grpcServerPort" in done.stderr and "in use" in done.stderr, done.stderr


def _random_request(rng, method: str):
    """A request of `method` with fields drawn at random: names good and bad, sizes in and out of
    bounds, handles real-looking and not."""
    text = lambda: rng.choice(["G5Fuzz", "G5FuzzG", "", "a b", "%RETRY%x", "x" * 300, "ü", "TBW102", "\x00"])
    number = lambda: rng.choice([0, 1, -1, 32, 2**31 - 1, -2**31, 5000])
    handle = lambda: rng.choice(["", "1 G5Fuzz 0 0", "nonsense", "9999999 G5Fuzz 99 99", "1 G5Fuzz 0", "\x01"])
    resource = lambda: pb.Resource(name=text())
    queue = lambda: pb.MessageQueue(topic=resource(), id=number())
    if method == "SendMessage":
        messages = []
        for _ in range(rng.choice([0, 1, 3])):
            m = pb.Message(topic=resource(), body=rng.choice([b"", b"x", b"y" * 2000]))
            m.system_properties.message_id = rng.choice(["", "id-1", "x" * 200])
            m.system_properties.message_type = rng.randrange(0, 8)
            if rng.random() < 0.3:
                m.system_properties.message_group = text()
            if rng.random() < 0.3:
                m.system_properties.delivery_timestamp.FromMilliseconds(rng.choice([0, 2**40, int(time.time() * 1000)]))
            if rng.random() < 0.3:
                m.user_properties[text()] = text()
            messages.append(m)
        return rpc.SendMessageRequest(messages=messages)
    if method == "ReceiveMessage":
        request = rpc.ReceiveMessageRequest(group=resource(), message_queue=queue(), batch_size=number())
        if rng.random() < 0.5:
            request.invisible_duration.FromMilliseconds(rng.choice([0, 1, 10_000, 2**40]))
        request.long_polling_timeout.FromMilliseconds(rng.choice([0, 100, 2**40]))
        request.filter_expression.type = rng.randrange(0, 3)
        request.filter_expression.expression = text()
        return request
    if method == "PullMessage":
        request = rpc.PullMessageRequest(group=resource(), message_queue=queue(), offset=number(), batch_size=number())
        request.long_polling_timeout.FromMilliseconds(rng.choice([0, 100, 2**40]))
        request.filter_expression.type = rng.randrange(0, 3)
        request.filter_expression.expression = text()
        return request
    if method == "AckMessage":
        return rpc.AckMessageRequest(group=resource(), topic=resource(), entries=[
            rpc.AckMessageEntry(message_id=text(), receipt_handle=handle()) for _ in range(rng.choice([0, 1, 2]))])
    if method == "ChangeInvisibleDuration":
        request = rpc.ChangeInvisibleDurationRequest(group=resource(), topic=resource(), receipt_handle=handle())
        request.invisible_duration.FromMilliseconds(rng.choice([0, 1, 5000, 2**40]))
        return request
    if method == "ForwardMessageToDeadLetterQueue":
        return rpc.ForwardMessageToDeadLetterQueueRequest(group=resource(), topic=resource(), receipt_handle=handle())
    if method == "QueryAssignment":
        return rpc.QueryAssignmentRequest(topic=resource(), group=resource())
    if method in ("UpdateOffset", "GetOffset"):
        cls = rpc.UpdateOffsetRequest if method == "UpdateOffset" else rpc.GetOffsetRequest
        return cls(group=resource(), message_queue=queue())
    if method == "QueryOffset":
        return rpc.QueryOffsetRequest(message_queue=queue(), query_offset_policy=rng.randrange(0, 3))
    if method == "Heartbeat":
        return rpc.HeartbeatRequest(group=resource(), client_type=rng.randrange(0, 9))
    return rpc.QueryRouteRequest(topic=resource())


FUZZED = ("SendMessage", "ReceiveMessage", "PullMessage", "AckMessage", "ChangeInvisibleDuration", "ForwardMessageToDeadLetterQueue",
          "QueryAssignment", "UpdateOffset", "GetOffset", "QueryOffset", "Heartbeat", "QueryRoute")


def test_two_thousand_random_requests_each_get_a_status_and_the_proxy_has_no_bug_to_show(node, stub):
    import random

    rng = random.Random(4711)  # seeded: a failure replays
    proxy_pid = node.actor_process("proxy").pid
    for n in range(2000):
        method = FUZZED[n % len(FUZZED)]
        request = _random_request(rng, method)
        call = getattr(stub, method)
        if method in ("ReceiveMessage", "PullMessage"):
            answers = list(call(request, metadata=META, timeout=10))
            codes = [a.status.code for a in answers if a.HasField("status")]
        else:
            response = call(request, metadata=META, timeout=10)
            codes = [response.status.code]
            assert response.status.code != Code.INTERNAL_SERVER_ERROR, (n, method, request, response.status)
        assert codes and Code.INTERNAL_SERVER_ERROR not in codes, (n, method, request, codes)
    assert proxy_statistics(node)["errors"] == 0 and node.actor_process("proxy").pid == proxy_pid


def test_a_killed_proxy_is_restarted_and_the_official_client_carries_on(node):
    official(node, "produce", "--topic", "G5Kill", "--count", "2", "--prefix", "before")
    proxy = node.actor_process("proxy")
    os.kill(proxy.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:  # (Ray restarts it; the launcher's supervision counts the restart)
        try:
            if node.actor_process("proxy").pid != proxy.pid:
                break
        except Exception:  # noqa: BLE001 (between the kill and the new process's pid file)
            pass
        assert time.monotonic() < deadline, "the proxy was not restarted"
        time.sleep(0.2)
    deadline = time.monotonic() + 30
    while True:  # (the new process binds its port once it has started)
        sent = official(node, "produce", "--topic", "G5Kill", "--count", "2", "--prefix", "after")
        if not [s for s in sent if "error" in s] or time.monotonic() > deadline:
            break
    assert not [s for s in sent if "error" in s], sent
    got = official(node, "simple", "--topic", "G5Kill", "--group", "G5KillG", "--want", "4", "--seconds", "20")
    assert sorted(m["body"] for m in got) == ["after0", "after1", "before0", "before1"]


# -- gRPC consumers as the node's members: what an admin sees of them and asks them ------------------------


def cli(node, *args: str, ok: bool | None = True) -> subprocess.CompletedProcess:
    """`mqnode ...` at the node; `ok`: whether it must succeed (None: either)."""
    done = subprocess.run([sys.executable, "-m", "node.tools.cli", *args, "--endpoint", node.endpoint],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert ok is None or (done.returncode == 0) == ok, done.stdout + done.stderr
    return done


class StreamClient:
    """A push consumer at the protocol's level: its settings and heartbeat, and its Telemetry
    stream, whose commands (`command`) it answers (`send`), as RocketMQ 5's Java client does."""

    def __init__(self, node, client_id: str, group: str, topic: str):
        import queue
        import threading

        self.channel = grpc.insecure_channel(grpc_endpoint(node))
        self.stub = service_pb2_grpc.MessagingServiceStub(self.channel)
        self.meta = (("x-mq-client-id", client_id), ("x-mq-language", "GOLANG"), ("x-mq-client-version", "5.1.2"))
        self.outbox, self.inbox = queue.Queue(), queue.Queue()
        self.stream = self.stub.Telemetry(iter(self.outbox.get, None), metadata=self.meta)
        threading.Thread(target=self._read, daemon=True).start()
        settings = pb.Settings(client_type=pb.PUSH_CONSUMER)
        settings.subscription.group.name = group
        entry = settings.subscription.subscriptions.add()
        entry.topic.name, entry.expression.type, entry.expression.expression = topic, pb.TAG, "TagA"
        self.send(rpc.TelemetryCommand(settings=settings))
        assert self.command().status.code == Code.OK  # (the node's settings)
        beat = self.stub.Heartbeat(rpc.HeartbeatRequest(group=pb.Resource(name=group), client_type=pb.PUSH_CONSUMER),
                                   metadata=self.meta, timeout=10)
        assert beat.status.code == Code.OK

    def _read(self) -> None:
        try:
            for command in self.stream:
                self.inbox.put(command)
        except grpc.RpcError:
            pass  # (closed)

    def send(self, command: rpc.TelemetryCommand) -> None:
        self.outbox.put(command)

    def command(self, timeout: float = 10) -> rpc.TelemetryCommand:
        return self.inbox.get(timeout=timeout)

    def close(self) -> None:
        self.stub.NotifyClientTermination(rpc.NotifyClientTerminationRequest(group=pb.Resource(name="G5AskedG")),
                                          metadata=self.meta, timeout=10)
        self.outbox.put(None)
        self.channel.close()


def test_a_grpc_consumer_is_a_member_an_admin_sees_and_asks_for_its_stacks_and_a_verdict(node):
    import threading

    group, topic = "G5AskedG", "G5Asked"
    with Producer(node.endpoint) as producer:
        stored = producer.send(topic, b"to verify", tags="TagA")
    client = StreamClient(node, "grpc-member-1", group, topic)
    try:
        shown = json.loads(cli(node, "admin", "group", "--group", group).stdout)
        (member,) = shown["members"]
        assert (member["clientId"], member["consumeType"], member["language"], member["version"]) == \
            ("grpc-member-1", "CONSUME_PASSIVELY", "GOLANG", "5.1.2")
        assert member["subscriptions"] == {topic: "TagA"}
        # without stacks: the proxy answers from what it knows of the client
        info = json.loads(cli(node, "admin", "consumer-status", "--group", group).stdout)["consumers"]["grpc-member-1"]
        assert info["subscriptionSet"] == [{"topic": topic, "subString": "TagA", "expressionType": "TAG"}]
        assert info["properties"]["PROP_CLIENT_LANGUAGE"] == "GOLANG" and "jstack" not in info
        assert client.inbox.empty()  # (nothing was asked of the client)
        # with stacks: PrintThreadStackTraceCommand down its stream, its ThreadStackTrace back to the admin
        done = {}
        admin = threading.Thread(target=lambda: done.update(status=cli(node, "admin", "consumer-status", "--group",
                                                                        group, "--client-id", "grpc-member-1", "--stacks")))
        admin.start()
        asked = client.command()
        nonce = asked.print_thread_stack_trace_command.nonce
        assert asked.WhichOneof("command") == "print_thread_stack_trace_command" and nonce
        answer = rpc.TelemetryCommand(status=pb.Status(code=Code.OK))
        answer.thread_stack_trace.nonce, answer.thread_stack_trace.thread_stack_trace = nonce, "goroutine 1 [running]"
        client.send(answer)
        admin.join(60)
        info = json.loads(done["status"].stdout)["consumers"]["grpc-member-1"]
        assert info["jstack"] == "goroutine 1 [running]"
        # a stored message to its listener: VerifyMessageCommand with the message, its verdict back
        for code, verdict, ok in ((Code.OK, "CR_SUCCESS", True), (Code.FAILED_TO_CONSUME_MESSAGE, "CR_LATER", False)):
            admin = threading.Thread(target=lambda ok=ok: done.update(query=cli(
                node, "query", "--msg-id", stored.offset_msg_id, "--group", group, "--client-id", "grpc-member-1", ok=ok)))
            admin.start()
            asked = client.command().verify_message_command
            assert (asked.message.body, asked.message.topic.name, asked.message.system_properties.tag) == \
                (b"to verify", topic, "TagA")
            assert asked.message.system_properties.message_id == stored.msg_id
            result = rpc.TelemetryCommand(status=pb.Status(code=code))
            result.verify_message_result.nonce = asked.nonce
            client.send(result)
            admin.join(60)
            assert json.loads(done["query"].stdout.splitlines()[-1])["consumeResult"]["consumeResult"] == verdict
        client.outbox.put(None)  # its stream closed, the client still a member: nothing to ask it through
        deadline = time.monotonic() + 10
        while True:
            shown = json.loads(cli(node, "admin", "consumer-status", "--group", group, "--stacks").stdout)
            if "no Telemetry stream" in shown["consumers"]["grpc-member-1"].get("remark", ""):
                break
            assert time.monotonic() < deadline, shown
            time.sleep(0.2)
    finally:
        client.close()
    # terminated: no longer a member
    gone = cli(node, "admin", "consumer-status", "--group", group, "--client-id", "grpc-member-1", ok=False)
    assert "not online" in gone.stderr + gone.stdout


# -- the official Node.js client ------------------------------------------------------------------------
# (its tests run where Node.js is; scripts/test installs the client: scripts/_nodejs.sh)

needs_nodejs = pytest.mark.skipif("no Node.js" in nodejs_missing(), reason=nodejs_missing() or "-")


@needs_nodejs
def test_nodejs_sends_and_receives_round_trip_and_read_the_same_in_every_client(node):
    got = round_trip(nodejs, node, "N5Round")
    first = next(g for g in got if g["body"] == "m0")
    # the Python client and the ZeroMQ pull read what Node.js sent as it sent it
    python = official(node, "simple", "--topic", "N5Round", "--group", "N5RoundPy", "--want", "40", "--seconds", "30")
    assert sorted(g["id"] for g in python) == sorted(g["id"] for g in got)
    assert next(g for g in python if g["body"] == "m0") == first
    with PullConsumer(node.endpoint) as consumer:
        pulled = [m for q in range(8) for m in consumer.pull("N5Round", q, 0, max_count=64).messages]
    message = next(m for m in pulled if m.body == b"m0")
    assert (message.msg_id, message.tags, message.keys, message.properties["index"]) == (first["id"], "TagA", ["k1"], "0")


@needs_nodejs
def test_nodejs_what_python_and_zeromq_send_nodejs_reads_the_same(node):
    official(node, "produce", "--topic", "N5Cross", "--count", "1", "--tag", "T1", "--keys", "key1", "--prefix", "py")
    with Producer(node.endpoint) as producer:
        result = producer.send("N5Cross", b"from zmq", tags="T2", keys=["a", "b"], properties={"p": "v"})
    got = nodejs(node, "simple", "--topic", "N5Cross", "--group", "N5CrossG", "--want", "2", "--seconds", "20")
    by_body = {g["body"]: g for g in got}
    assert by_body["py0"]["tag"] == "T1" and by_body["py0"]["keys"] == ["key1"]
    assert by_body["py0"]["properties"] == {"index": "0"}
    zmq = by_body["from zmq"]
    assert (zmq["id"], zmq["tag"], zmq["keys"], zmq["properties"]) == (result.msg_id, "T2", ["a", "b"], {"p": "v"})


@needs_nodejs
def test_nodejs_unacked_messages_come_back_with_the_next_attempt_and_a_change_holds_them_longer(node):
    no_errors(nodejs(node, "produce", "--topic", "N5Back", "--count", "5"))
    began = time.monotonic()
    first = nodejs(node, "simple", "--topic", "N5Back", "--group", "N5BackG", "--want", "5", "--invisible", "2",
                   "--mode", "none")
    assert len(first) == 5 and {m["attempt"] for m in first} == {1}
    again = nodejs(node, "simple", "--topic", "N5Back", "--group", "N5BackG", "--want", "5", "--seconds", "20",
                   "--invisible", "2", "--mode", "change:30")
    assert sorted(m["body"] for m in again) == sorted(m["body"] for m in first)
    assert {m["attempt"] for m in again} == {2} and all(m["changed"] for m in again)
    assert time.monotonic() - began >= 2
    time.sleep(2.5)  # past the 2 s they were taken for: the change holds them 30 s
    assert nodejs(node, "simple", "--topic", "N5Back", "--group", "N5BackG", "--want", "1", "--seconds", "2") == []


@needs_nodejs
def test_nodejs_fifo_messages_of_a_group_keep_one_queue_and_a_fifo_group_consumes_them_in_order(node):
    # the Node.js client backs off only exponentially (with the default, CUSTOMIZED, its FIFO consumer
    # dead-letters a message at its first failure): the group says EXPONENTIAL, through the CLI
    policy = {"type": "EXPONENTIAL", "exponentialRetryPolicy": {"initial": 200, "max": 1000, "multiplier": 2}}
    made = subprocess.run([sys.executable, "-m", "node.tools.cli", "admin", "group", "create", "--endpoint", node.endpoint,
                           "--group", "N5FifoG", "--fifo", "true", "--max-retries", "3",
                           "--retry-policy", json.dumps(policy)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0 and json.loads(made.stdout)["groupRetryPolicy"] == policy, made.stderr
    for group in ("g1", "g2"):
        sent = nodejs(node, "produce", "--topic", "N5Fifo", "--count", "10", "--message-group", group, "--prefix", group)
        assert [s["offset"] for s in sent] == list(range(10)), sent  # one queue, in order
    got = nodejs(node, "push", "--topic", "N5Fifo", "--group", "N5FifoG", "--seconds", "60", "--fail-first", "1",
                 "--successes", "20")
    for group in ("g1", "g2"):
        mine = [m for m in got if m["group"] == group]
        assert [m["body"] for m in mine if m["result"] == "SUCCESS"] == [f"{group}{i}" for i in range(10)], mine
        # each failed once and came back before the next was handed out
        assert [m["body"] for m in mine] == [f"{group}{i}" for i in range(10) for _ in (1, 2)]


@needs_nodejs
def test_nodejs_a_delivery_timestamp_holds_a_message_and_a_recall_takes_one_back(node):
    sent_at = time.time()
    sent = no_errors(nodejs(node, "produce", "--topic", "N5Delay", "--count", "3", "--delay-ms", "3000", "--recall", "1"))
    ids, recalled = [s["id"] for s in sent if "id" in s], [s["recalled"] for s in sent if "recalled" in s]
    assert len(ids) == 3 and recalled == ids[:1]
    got = nodejs(node, "simple", "--topic", "N5Delay", "--group", "N5DelayG", "--want", "2", "--seconds", "20")
    assert sorted(m["id"] for m in got) == sorted(ids[1:]) and time.time() - sent_at >= 2.0
    assert nodejs(node, "simple", "--topic", "N5Delay", "--group", "N5DelayG", "--want", "1", "--seconds", "2") == []


@needs_nodejs
def test_nodejs_the_push_consumer_retries_and_the_node_dead_letters_past_retry_max_times(node):
    admin_group(node, "N5PushG", retryMaxTimes=1)
    no_errors(nodejs(node, "produce", "--topic", "N5Push", "--count", "3", "--prefix", "p"))
    got = nodejs(node, "push", "--topic", "N5Push", "--group", "N5PushG", "--seconds", "10", "--fail-first", "9",
                 "--tries", "6")
    assert sorted((m["body"], m["attempt"]) for m in got) == [(f"p{i}", a) for i in range(3) for a in (1, 2)]
    assert sorted(m.body for m in dead_letters(node, "N5PushG", 3)) == [b"p0", b"p1", b"p2"]


@needs_nodejs
def test_nodejs_a_push_consumer_is_a_member_that_gives_its_stacks_and_declines_a_verify(node):
    from nodes import NODEJS_CLIENT

    group, topic = "N5AskedG", "N5Asked"
    with Producer(node.endpoint) as producer:
        stored = producer.send(topic, b"to verify")
    member = subprocess.Popen(["node", str(NODEJS_CLIENT), "push", "--endpoint", grpc_endpoint(node), "--topic", topic,
                               "--group", group, "--seconds", "40"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline, members = time.monotonic() + 30, []
        while not members:  # (its first heartbeat comes once it has started)
            assert time.monotonic() < deadline and member.poll() is None, "the Node.js consumer never became a member"
            shown = cli(node, "admin", "group", "--group", group, ok=None)
            members = json.loads(shown.stdout)["members"] if shown.returncode == 0 else []
            time.sleep(0.2)
        (client_id,) = [m["clientId"] for m in members]
        assert members[0]["consumeType"] == "CONSUME_PASSIVELY" and members[0]["version"]
        shown = json.loads(cli(node, "admin", "consumer-status", "--group", group, "--stacks").stdout)
        assert shown["consumers"][client_id]["jstack"] == "mock stack"  # (what that client says of its stacks)
        declined = cli(node, "query", "--msg-id", stored.offset_msg_id, "--group", group, "--client-id", client_id,
                       ok=False)
        assert "SYSTEM_ERROR" in declined.stderr and "no verdict on the message: NOT_IMPLEMENTED" in declined.stderr
    finally:
        member.terminate()
        member.wait(30)


@needs_nodejs
def test_nodejs_transactions_commit_roll_back_and_answer_the_nodes_checks(node):
    sent = no_errors(nodejs(node, "transaction", "--topic", "N5Tx", "--count", "3", "--end", "commit", "--prefix", "c"))
    sent += no_errors(nodejs(node, "transaction", "--topic", "N5Tx", "--count", "2", "--end", "rollback", "--prefix", "r"))
    assert len(sent) == 5 and all(s["transaction"] for s in sent)
    lines = nodejs(node, "transaction", "--topic", "N5Tx", "--count", "2", "--end", "none", "--prefix", "u",
                   "--check-answer", "commit", "--seconds", "10", "--checks", "2")
    checked = [line["checked"] for line in lines if "checked" in line]
    assert sorted(set(checked)) == sorted(line["id"] for line in lines if "transaction" in line), lines
    got = nodejs(node, "simple", "--topic", "N5Tx", "--group", "N5TxG", "--want", "5", "--seconds", "20")
    assert sorted(g["body"] for g in got) == ["c0", "c1", "c2", "u0", "u1"]
    assert nodejs(node, "simple", "--topic", "N5Tx", "--group", "N5TxG", "--want", "1", "--seconds", "2") == []


@needs_nodejs
def test_nodejs_a_sql92_filter_selects_and_a_tag_filter_selects(node):
    no_errors(nodejs(node, "produce", "--topic", "N5Sql", "--count", "10", "--tag", "TagA"))
    no_errors(nodejs(node, "produce", "--topic", "N5Sql", "--count", "2", "--tag", "TagB", "--prefix", "b"))
    got = nodejs(node, "simple", "--topic", "N5Sql", "--group", "N5SqlG", "--want", "3", "--seconds", "30",
                 "--filter", "index >= 7 AND TAGS = 'TagA'", "--sql")
    assert sorted(int(g["properties"]["index"]) for g in got) == [7, 8, 9], got
    tagged = nodejs(node, "simple", "--topic", "N5Sql", "--group", "N5TagG", "--want", "2", "--seconds", "30",
                    "--filter", "TagB")
    assert sorted(g["body"] for g in tagged) == ["b0", "b1"]
