"""The gRPC proxy's core without I/O (actors.proxy.core, actors.proxy.auth): what each message
and request means for the node, the statuses, the routes and settings, the signature; and that
nothing a client can put into a message makes it raise anything but Refused."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors import edge
from actors.proxy import auth, core, delivery, sessions
from actors.proxy.apis import definition_pb2 as pb
from actors.proxy.apis import service_pb2 as rpc
from actors.proxy.core import Code, Refused
from node import protocol
from shm import settings as settings_module

NOW = 1_700_000_000_000
MAX_BODY, MAX_DELAY = 4 << 20, 3 * 86_400_000


def message(topic="T", body=b"b", **system) -> pb.Message:
    out = pb.Message(topic=pb.Resource(name=topic), body=body)
    out.system_properties.message_id = system.pop("message_id", "ID1")
    for name, value in system.items():
        setattr(out.system_properties, name, value)
    return out


def refused(m: pb.Message) -> int:
    with pytest.raises(Refused) as e:
        core.outgoing(m, MAX_BODY, MAX_DELAY, NOW)
    return e.value.code


def test_a_plain_message_keeps_its_id_tag_keys_and_properties():
    m = message(tag="TagA", message_type=pb.NORMAL)
    m.system_properties.keys.extend(["k1", "k2"])
    m.user_properties["color"] = "red"
    out = core.outgoing(m, MAX_BODY, MAX_DELAY, NOW)
    assert (out.message_id, out.shard_key, out.message.tags, out.message.keys) == ("ID1", None, "TagA", "k1 k2")
    assert out.message.properties == {"color": "red", "UNIQ_KEY": "ID1"} and out.message.deliver_at_ms is None


def test_fifo_and_delay_messages_carry_their_group_and_time():
    fifo = core.outgoing(message(message_type=pb.FIFO, message_group="g1"), MAX_BODY, MAX_DELAY, NOW)
    assert fifo.shard_key == "g1" and fifo.message.properties[core.PROPERTY_SHARDING_KEY] == "g1"
    delayed = message(message_type=pb.DELAY)
    delayed.system_properties.delivery_timestamp.FromMilliseconds(NOW + 5000)
    assert core.outgoing(delayed, MAX_BODY, MAX_DELAY, NOW).message.deliver_at_ms == NOW + 5000


def test_a_transactional_message_is_a_half_of_its_topics_producer_group_sent_alone():
    m = message(topic="TxT", message_type=pb.TRANSACTION)
    m.system_properties.orphaned_transaction_recovery_duration.seconds = 30
    out = core.outgoing(m, MAX_BODY, MAX_DELAY, NOW)
    assert out.transactional and out.message.properties == {"UNIQ_KEY": "ID1", "TRAN_MSG": "true", "PGROUP": "TxT",
                                                            "CHECK_IMMUNITY_TIME_IN_SECONDS": "30"}
    plain = core.outgoing(message(topic="TxT"), MAX_BODY, MAX_DELAY, NOW)
    grouped, single = core.batches([plain, out], lambda plan: 0)
    assert grouped == [("TxT", 0, [0])] and single == [1]
    m.system_properties.orphaned_transaction_recovery_duration.seconds = 7200
    assert refused(m) == Code.BAD_REQUEST


def test_a_transaction_id_names_its_half_and_ends_it():
    tid = core.transaction_id("7F0000010000326F0000000000001000", 17)
    assert core.half_of(tid) == (0x1000, 17)
    request = rpc.EndTransactionRequest(topic=pb.Resource(name="TxT"), message_id="ID1", transaction_id=tid,
                                        resolution=pb.ROLLBACK, source=pb.SOURCE_SERVER_CHECK)
    assert core.end_transaction(request) == {
        "code": 37, "producerGroup": "TxT", "tranStateTableOffset": 17, "commitLogOffset": 0x1000,
        "commitOrRollback": 12, "msgId": "ID1", "transactionId": tid, "fromTransactionCheck": True}
    for bad in ("", "nothex-1", "7F0000010000326F0000000000001000-x", "7F00-1"):
        request.transaction_id = bad
        with pytest.raises(Refused) as e:
            core.end_transaction(request)
        assert e.value.code == Code.INVALID_TRANSACTION_ID
    request.transaction_id, request.resolution = tid, pb.TRANSACTION_RESOLUTION_UNSPECIFIED
    with pytest.raises(Refused) as e:
        core.end_transaction(request)
    assert e.value.code == Code.BAD_REQUEST


@pytest.mark.parametrize("bad, code", [
    (message(topic=""), Code.ILLEGAL_TOPIC), (message(topic="a b"), Code.ILLEGAL_TOPIC),
    (message(topic="RMQ_SYS_TRANS_HALF_TOPIC"), Code.ILLEGAL_TOPIC),
    (message(body=b""), Code.MESSAGE_BODY_EMPTY), (message(body=b"x" * (MAX_BODY + 1)), Code.MESSAGE_BODY_TOO_LARGE),
    (message(message_id=""), Code.ILLEGAL_MESSAGE_ID), (message(message_id="a\nb"), Code.ILLEGAL_MESSAGE_ID),
    (message(tag=" "), Code.ILLEGAL_MESSAGE_TAG), (message(tag="a||b"), Code.ILLEGAL_MESSAGE_TAG),
    (message(message_type=pb.TRANSACTION, message_group="g"), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (message(message_type=pb.LITE), Code.UNSUPPORTED),
    (message(message_type=77), Code.UNSUPPORTED),  # (proto3 enums are open)
    (message(message_type=pb.FIFO), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (message(message_type=pb.NORMAL, message_group="g"), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (message(message_type=pb.DELAY), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (message(message_type=pb.FIFO, message_group=" "), Code.ILLEGAL_MESSAGE_GROUP),
    (message(body_encoding=pb.GZIP), Code.UNSUPPORTED),
])
def test_what_rocketmq_5s_proxy_refuses_is_refused_with_its_code(bad, code):
    assert refused(bad) == code


def test_properties_that_are_reserved_or_hold_separators_or_are_too_many_are_refused():
    for key, value in (("UNIQ_KEY", "x"), ("TAGS", "x"), ("", "x"), ("a\x01", "x"), ("a", "b\x02"), ("a", "\n")):
        m = message()
        m.user_properties[key] = value
        assert refused(m) == Code.ILLEGAL_MESSAGE_PROPERTY_KEY, key
    m = message()
    m.user_properties.update({"empty": "", "kept": "v"})  # (the node's parser drops an empty value: so does the proxy)
    assert "empty" not in core.outgoing(m, MAX_BODY, MAX_DELAY, NOW).message.properties
    m = message()
    for i in range(2000):
        m.user_properties[f"key{i}"] = "v" * 20
    assert refused(m) == Code.MESSAGE_PROPERTIES_TOO_LARGE
    far = message(message_type=pb.DELAY)
    far.system_properties.delivery_timestamp.FromMilliseconds(NOW + MAX_DELAY + 1)
    assert refused(far) == Code.ILLEGAL_DELIVERY_TIME


def test_batches_keep_a_topic_and_queue_together_and_send_timed_messages_alone():
    plans = [core.outgoing(message(topic=t, message_id=str(i)), MAX_BODY, MAX_DELAY, NOW)
             for i, t in enumerate("AABAB")]
    delayed = message(message_type=pb.DELAY, message_id="d")
    delayed.system_properties.delivery_timestamp.FromMilliseconds(NOW + 10)
    plans += [core.outgoing(delayed, MAX_BODY, MAX_DELAY, NOW), Refused(Code.BAD_REQUEST, "no")]
    grouped, single = core.batches(plans, lambda plan: 3)
    assert grouped == [("A", 3, [0, 1, 3]), ("B", 3, [2, 4])] and single == [5]
    many = [core.outgoing(message(message_id=str(i)), MAX_BODY, MAX_DELAY, NOW) for i in range(600)]
    grouped, _ = core.batches(many, lambda plan: 0)
    assert [len(indices) for _, _, indices in grouped] == [256, 256, 88]


def test_node_statuses_map_as_rocketmq_5s_proxy_maps_them():
    assert core.status_of("PUT_OK").code == Code.OK
    assert core.status_of("FLUSH_DISK_TIMEOUT").code == Code.MASTER_PERSISTENCE_TIMEOUT
    assert core.status_of("SYSTEM_BUSY", "queue full").code == Code.TOO_MANY_REQUESTS
    assert core.status_of("TOPIC_NOT_EXIST", "x").code == Code.TOPIC_NOT_FOUND
    assert core.status_of("NO_PERMISSION", "no").code == Code.FORBIDDEN
    assert core.status_of("MESSAGE_ILLEGAL", "the body of 5 bytes exceeds 4").code == Code.MESSAGE_BODY_TOO_LARGE
    assert core.status_of("MESSAGE_ILLEGAL", "something else").code == Code.BAD_REQUEST
    assert core.status_of("RECEIPT_HANDLE_EXPIRED").code == Code.INVALID_RECEIPT_HANDLE
    assert core.status_of("NEVER_HEARD_OF_IT").code == Code.INTERNAL_SERVER_ERROR
    assert "queue full" in core.status_of("SYSTEM_BUSY", "queue full").message


def receive(**fields) -> rpc.ReceiveMessageRequest:
    request = rpc.ReceiveMessageRequest(group=pb.Resource(name="G"), batch_size=fields.pop("batch_size", 16),
                                        message_queue=pb.MessageQueue(topic=pb.Resource(name="T"),
                                                                      id=fields.pop("queue", -1)))
    for name, ms in fields.items():
        getattr(request, name).FromMilliseconds(ms)
    return request


def test_a_receive_pops_from_any_queue_unless_the_group_is_fifo_and_answers_before_the_deadline():
    auto = receive(invisible_duration=1000)
    auto.auto_renew = True
    assert delivery.receive_plan(auto, None, fifo=False, default_invisible_ms=7000).invisible_ms == 7000
    plan = delivery.receive_plan(receive(queue=5, long_polling_timeout=20_000), 15_000, fifo=False)
    assert (plan.queue_id, plan.wait_ms, plan.invisible_ms, plan.max_count, plan.expression) == (-1, 14_000, 60_000, 16, "*")
    assert delivery.receive_plan(receive(queue=5), None, fifo=True).queue_id == 5
    assert delivery.receive_plan(receive(long_polling_timeout=5000), 500, fifo=False).wait_ms == 0


@pytest.mark.parametrize("request_, code", [
    (receive(batch_size=0), Code.BAD_REQUEST), (receive(batch_size=5000), Code.BAD_REQUEST),
    (receive(invisible_duration=10), Code.ILLEGAL_INVISIBLE_TIME),
    (receive(invisible_duration=13 * 3600_000), Code.ILLEGAL_INVISIBLE_TIME),
    (receive(long_polling_timeout=3600_000), Code.ILLEGAL_POLLING_TIME),
])
def test_a_receive_out_of_bounds_is_refused(request_, code):
    with pytest.raises(Refused) as e:
        delivery.receive_plan(request_, None, fifo=False)
    assert e.value.code == code


def test_filter_expressions():
    assert delivery.filter_of(pb.FilterExpression(type=pb.TAG, expression="a || b"), False) == ("a || b", "TAG")
    assert delivery.filter_of(pb.FilterExpression(), False) == ("*", "TAG")
    for bad, code in (("a ||", Code.ILLEGAL_FILTER_EXPRESSION), ("a\x00b", Code.ILLEGAL_FILTER_EXPRESSION)):
        with pytest.raises(Refused) as e:
            delivery.filter_of(pb.FilterExpression(type=pb.TAG, expression=bad), True)
        assert e.value.code == code
    sql = pb.FilterExpression(type=pb.SQL, expression="a > 1")
    with pytest.raises(Refused) as e:
        delivery.filter_of(sql, False)  # enablePropertyFilter off
    assert e.value.code == Code.UNSUPPORTED
    assert delivery.filter_of(sql, True) == ("a > 1", "SQL92")
    with pytest.raises(Refused) as e:
        delivery.filter_of(pb.FilterExpression(type=pb.SQL, expression="a > 'x'"), True)
    assert e.value.code == Code.ILLEGAL_FILTER_EXPRESSION


def pull_request(**fields) -> rpc.PullMessageRequest:
    request = rpc.PullMessageRequest(group=pb.Resource(name="G"), batch_size=fields.pop("batch_size", 16),
                                     offset=fields.pop("offset", 0),
                                     message_queue=pb.MessageQueue(topic=pb.Resource(name="T"), id=fields.pop("queue", 3)))
    for name, ms in fields.items():
        getattr(request, name).FromMilliseconds(ms)
    return request


def test_a_pull_reads_one_queue_from_its_offset_and_answers_before_the_deadline():
    plan = delivery.pull_plan(pull_request(offset=42, long_polling_timeout=20_000), 15_000)
    assert (plan.topic, plan.group, plan.queue_id, plan.offset, plan.max_count, plan.wait_ms, plan.expression) == (
        "T", "G", 3, 42, 16, 14_000, "*")
    assert delivery.pull_plan(pull_request(long_polling_timeout=5000), None).wait_ms == 5000


@pytest.mark.parametrize("request_, code", [
    (pull_request(offset=-1), Code.ILLEGAL_OFFSET), (pull_request(queue=-1), Code.BAD_REQUEST),
    (pull_request(batch_size=0), Code.BAD_REQUEST), (pull_request(batch_size=1025), Code.BAD_REQUEST),
    (pull_request(long_polling_timeout=3600_000), Code.ILLEGAL_POLLING_TIME),
])
def test_a_pull_out_of_bounds_is_refused(request_, code):
    with pytest.raises(Refused) as e:
        delivery.pull_plan(request_, None)
    assert e.value.code == code


def received_message(body: bytes, properties: dict[str, str], sys_flag: int = 0):
    """A stored record as the node's pull hands it to the proxy (node.client.received)."""
    from node.client.received import decode_messages
    from shm import codec

    record = codec.encode(topic="T", body=body, queue_id=3, born_timestamp=111, queue_offset=7, physical_offset=4096,
                          born_host=codec.encode_host("10.1.2.3", 5000), store_host=codec.encode_host("127.0.0.1", 10911),
                          properties=codec.properties_string(properties), store_timestamp=222, reconsume_times=0,
                          sys_flag=sys_flag)
    return decode_messages(record)[0]


def test_a_stored_body_carries_rocketmq_5s_md5_digest_and_a_compressed_one_says_gzip():
    """MD5 in upper-case hex, as RocketMQ 5's proxy (the Node.js client rejected a hex CRC32 as
    corrupt); a body RocketMQ's clients compressed is GZIP, digested as stored."""
    import hashlib
    import zlib

    from node.client.consumer import PullResult
    from shm import codec

    for body, sys_flag, encoding in ((b"plain body", 0, pb.IDENTITY),
                                     (zlib.compress(b"x" * 5000), codec.FLAG_COMPRESSED, pb.GZIP)):
        stored = received_message(body, {"UNIQ_KEY": "0A00000100002A9F0000000000000001"}, sys_flag)
        system = delivery.pulled(PullResult("FOUND", 8, 0, 9, [stored]))[1].message.system_properties
        assert system.body_digest.type == pb.MD5 and system.body_encoding == encoding
        assert system.body_digest.checksum == hashlib.md5(body).hexdigest().upper()


def test_a_pulls_stream_is_its_status_its_messages_and_the_next_offset():
    from node.client.consumer import PullResult

    stored = received_message(b"body", {"TAGS": "t", "UNIQ_KEY": "0A00000100002A9F0000000000000001"})
    stream = delivery.pulled(PullResult("FOUND", 8, 0, 9, [stored]))
    assert [r.WhichOneof("content") for r in stream] == ["status", "message", "next_offset"]
    assert stream[0].status.code == Code.OK and stream[2].next_offset == 8
    system = stream[1].message.system_properties
    assert (stream[1].message.body, system.tag, system.message_id, system.delivery_attempt) == (
        b"body", "t", "0A00000100002A9F0000000000000001", 1)
    assert not system.receipt_handle and not system.HasField("invisible_duration")
    assert (system.queue_id, system.queue_offset, system.store_timestamp.ToMilliseconds()) == (3, 7, 222)
    for status, code in (("NO_NEW_MSG", Code.MESSAGE_NOT_FOUND), ("NO_MATCHED_MSG", Code.MESSAGE_NOT_FOUND),
                         ("FOUND", Code.MESSAGE_NOT_FOUND), ("OFFSET_ILLEGAL", Code.ILLEGAL_OFFSET)):
        stream = delivery.pulled(PullResult(status, 5, 0, 5, []))  # (FOUND, none left by the exact tag check)
        assert [r.WhichOneof("content") for r in stream] == ["status", "next_offset"]
        assert stream[0].status.code == code and stream[1].next_offset == 5


def test_receipt_handles_the_node_gave_are_taken_apart_and_others_refused():
    assert core.handle_position("12 TopicA 3 4567") == ("TopicA", 3, 4567)
    for bad in ("", "x", "1 T a 2", "1 T 2", "1 T -1 2"):
        with pytest.raises(Refused):
            core.handle_position(bad)


def test_routes_and_assignments_follow_the_topic_table():
    node = pb.Broker(name="broker-a")
    topic = pb.Resource(name="T")
    queues = core.route(topic, [(node, {"perm": 6, "readQueueNums": 2, "writeQueueNums": 4})]).message_queues
    assert [(q.id, q.permission) for q in queues] == [(0, pb.READ_WRITE), (1, pb.READ_WRITE), (2, pb.WRITE),
                                                      (3, pb.WRITE)]
    assert [(q.id, q.permission) for q in core.route(topic, [(node, {"perm": 4, "readQueueNums": 1,
                                                                     "writeQueueNums": 1})]).message_queues] == [(0, pb.READ)]
    info = {"perm": 6, "readQueueNums": 3, "writeQueueNums": 3}
    assert [a.message_queue.id for a in core.assignments(topic, [(node, info)], fifo=False).assignments] == [-1]
    assert [a.message_queue.id for a in core.assignments(topic, [(node, info)], fifo=True).assignments] == [0, 1, 2]
    assert core.assignments(topic, [(node, {"perm": 2, "readQueueNums": 3, "writeQueueNums": 3})],
                            fifo=False).status.code == Code.FORBIDDEN


def test_in_a_cluster_each_group_whose_master_serves_grpc_is_a_broker_at_its_proxy():
    """A name service's route (with mqnode's grpcAddrs) as RocketMQ 5 brokers: this node's group
    where the client reached it, another at its proxy's address, one without a gRPC master left out."""
    here = pb.Broker(name="broker-a", endpoints=pb.Endpoints(addresses=[pb.Address(host="h", port=1)]))
    route = {"queueDatas": [{"brokerName": n, "perm": 6, "readQueueNums": 2, "writeQueueNums": 2, "topicSysFlag": 0}
                            for n in ("broker-a", "broker-b", "broker-c", "broker-d")],
             "brokerDatas": [
                 {"brokerName": "broker-a", "brokerAddrs": {"0": "10.0.0.1:10911"}},
                 {"brokerName": "broker-b", "brokerAddrs": {"0": "10.0.0.2:10911", "1": "10.0.0.3:10911"},
                  "grpcAddrs": {"0": "10.0.0.2:8081", "1": "10.0.0.3:8081"}},
                 {"brokerName": "broker-c", "brokerAddrs": {"1": "10.0.0.4:10911"}, "grpcAddrs": {"1": "10.0.0.4:8081"}},
                 {"brokerName": "broker-d", "brokerAddrs": {"0": "[fe80::1]:10911"}, "grpcAddrs": {"0": "[fe80::1]:8081"}}]}
    placed = core.placements(route, "broker-a", "10.0.0.1:8081", here)
    assert [(b.name, [(a.host, a.port) for a in b.endpoints.addresses], b.endpoints.scheme) for b, _ in placed] == [
        ("broker-a", [("h", 1)], pb.ADDRESS_SCHEME_UNSPECIFIED), ("broker-b", [("10.0.0.2", 8081)], pb.IPv4),
        ("broker-d", [("fe80::1", 8081)], pb.IPv6)]
    topic = pb.Resource(name="T")
    assert [(q.broker.name, q.id) for q in core.route(topic, placed).message_queues] == [
        ("broker-a", 0), ("broker-a", 1), ("broker-b", 0), ("broker-b", 1), ("broker-d", 0), ("broker-d", 1)]
    assert [(a.message_queue.broker.name, a.message_queue.id)
            for a in core.assignments(topic, placed, fifo=False).assignments] == [
        ("broker-a", -1), ("broker-b", -1), ("broker-d", -1)]
    assert core.endpoints_of("mq.example.com:8081").scheme == pb.DOMAIN_NAME
    # broker-b's slave (10.0.0.3) sends its clients to its master's proxy; broker-a's the same
    as_slave = core.placements(route, "broker-b", "10.0.0.3:8081", here)
    assert [(b.name, b.endpoints.addresses[0].host) for b, _ in as_slave] == [
        ("broker-b", "10.0.0.2"), ("broker-d", "fe80::1")]  # (broker-a registered no gRPC address here)


def test_settings_answer_a_producer_with_the_largest_body_and_a_consumer_with_its_groups_retries():
    node_settings = settings_module.load(None, {})
    producer = core.settings_for(pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing()), node_settings, None)
    assert producer.publishing.max_body_size == node_settings.maxMessageSize
    consumer = core.settings_for(pb.Settings(client_type=pb.PUSH_CONSUMER, subscription=pb.Subscription()),
                                 node_settings, {"retryMaxTimes": 3, "consumeMessageOrderly": True})
    assert consumer.backoff_policy.max_attempts == 4 and consumer.subscription.fifo
    assert [d.seconds for d in consumer.backoff_policy.customized_backoff.next][:3] == [10, 30, 60]
    assert consumer.subscription.long_polling_timeout.seconds == 20  # (grpcClientConsumerMaxLongPollingTimeoutMillis)


def test_a_groups_retry_policy_is_the_backoff_its_consumers_are_told():
    node_settings = settings_module.load(None, {"grpcClientConsumerMaxLongPollingTimeoutMillis": 3000})
    asked = pb.Settings(client_type=pb.PUSH_CONSUMER, subscription=pb.Subscription())
    exponential = {"type": "EXPONENTIAL", "exponentialRetryPolicy": {"initial": 500, "max": 8000, "multiplier": 2}}
    told = core.settings_for(asked, node_settings, {"retryMaxTimes": 2, "groupRetryPolicy": exponential})
    backoff = told.backoff_policy
    assert backoff.max_attempts == 3 and backoff.WhichOneof("strategy") == "exponential_backoff"
    assert (backoff.exponential_backoff.initial.ToMilliseconds(), backoff.exponential_backoff.max.ToMilliseconds(),
            backoff.exponential_backoff.multiplier) == (500, 8000, 2.0)
    assert told.subscription.long_polling_timeout.ToMilliseconds() == 3000
    customized = {"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": [1000, 0, 2500]}}
    told = core.settings_for(asked, node_settings, {"groupRetryPolicy": customized})
    assert [d.ToMilliseconds() for d in told.backoff_policy.customized_backoff.next] == [1000, 0, 2500]
    assert told.backoff_policy.max_attempts == 17


@pytest.mark.parametrize("policy", [
    "EXPONENTIAL", {"type": "LINEAR"}, {"type": "EXPONENTIAL"},
    {"type": "EXPONENTIAL", "exponentialRetryPolicy": {"initial": 5000, "max": 1000, "multiplier": 2}},
    {"type": "EXPONENTIAL", "exponentialRetryPolicy": {"initial": 1, "max": 2, "multiplier": 0}},
    {"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": []}},
    {"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": [1000, -1]}},
    {"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": [1000] * 65}},
    {"type": "CUSTOMIZED", "customizedRetryPolicy": "1s 5s"},
])
def test_a_retry_policy_that_is_not_rocketmq_5s_is_refused_at_the_edge(policy):
    assert edge.retry_policy_problem(policy)
    assert edge.CHECKS[protocol.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP]({"groupName": "g", "groupRetryPolicy": policy})


def test_clients_are_forgotten_after_their_silence_and_bounded():
    now = [0.0]
    clients = sessions.Clients(clock=lambda: now[0])
    clients.heard(clients.seen("a", {}), pb.PRODUCER, None)
    clients.seen("b", {})
    now[0] = sessions.CLIENT_EXPIRY_S + 1
    clients.seen("b", {})
    assert [c.client_id for c in clients.expire()] == ["a"] and list(clients.by_id) == ["b"]
    assert clients.terminated_by("b").client_id == "b" and clients.terminated_by("b") is None
    assert clients.statistics()["clients"] == 0 and clients.statistics()["clientsTerminated"] == 1


def test_renewals_come_due_ahead_of_the_end_follow_the_latest_handle_and_stop_at_the_limit():
    renewals = sessions.Renewals(ahead_ms=1000, max_ms=10_000)
    assert renewals.add("h1", "G", None, "c1", visible_at_ms=5000, now_ms=0)
    renewals.add("h2", "G", "ak", "c2", visible_at_ms=9000, now_ms=0)
    assert renewals.due(3000) == [] and [h for h, _ in renewals.due(4200)] == ["h1"]
    renewals.renewed("h1", "h1b", 8000)
    assert renewals.current("h1") == "h1b" and renewals.current("other") == "other"
    assert [h for h, _ in renewals.due(7500)] == ["h1"]  # (h2: 1.5 s left, more than 1 s ahead)
    renewals.renewed("h1", "h1c", 10_500)
    assert [h for h, _ in renewals.due(8200)] == ["h2"]
    assert renewals.due(10_000) == []  # h1: held 10 s, let go; h2 not renewed: visible again, too late
    assert renewals.current("h1") == "h1" and renewals.statistics()["renewalsEnded"] == 2
    renewals.add("h4", "G", "ak", "c2", visible_at_ms=99_000, now_ms=10_000)
    assert renewals.forget_client("c2") == 1 and renewals.statistics()["renewing"] == 0
    renewals.add("h3", "G", None, "c1", 5000, 0)
    assert renewals.due(6000) == [] and renewals.statistics()["renewing"] == 0  # already visible: too late


def test_the_renewals_of_a_client_gone_silent_are_let_go_and_the_others_go_on():
    """A killed push consumer's messages come back after their invisible time, not after
    renewMaxTimeMillis: once the proxy forgets the client (CLIENT_EXPIRY_S of silence, no stream),
    its renewals end at their next turn."""
    now = [0.0]
    clients = sessions.Clients(clock=lambda: now[0])
    clients.seen("dead", {}), clients.seen("alive", {})
    renewals = sessions.Renewals(ahead_ms=1000, max_ms=3_600_000)
    renewals.add("h1", "G", None, "dead", visible_at_ms=5000, now_ms=0)
    renewals.add("h2", "G", None, "alive", visible_at_ms=5000, now_ms=0)
    assert [h for h, _ in renewals.due(4500, alive=clients.by_id.__contains__)] == ["h1", "h2"]
    renewals.renewed("h1", "h1b", 8000), renewals.renewed("h2", "h2b", 8000)
    now[0] = sessions.CLIENT_EXPIRY_S + 1
    clients.seen("alive", {})
    clients.expire()
    assert [h for h, _ in renewals.due(7500, alive=clients.by_id.__contains__)] == ["h2"]
    assert renewals.current("h1") == "h1" and renewals.statistics()["renewalsEnded"] == 1


def test_the_signature_is_rocketmq_5s_and_malformed_authorizations_are_told_apart():
    date = "20261127T120000Z"
    header = f"MQv2-HMAC-SHA1 Credential=ak1, SignedHeaders=x-mq-date-time, Signature={auth.signature('sk1', date)}"
    assert auth.parse(header)[:2] == ("ak1", "x-mq-date-time")
    assert auth.signature("sk1", date) == __import__("hmac").new(b"sk1", date.encode(), "sha1").hexdigest()
    for bad in ("Basic abc", "MQv2-HMAC-SHA1 Credential=ak1", "MQv2-HMAC-SHA1 nonsense"):
        with pytest.raises(ValueError):
            auth.parse(bad)


@settings(max_examples=300, deadline=None)
@given(topic=st.text(max_size=20), body=st.binary(max_size=64), message_id=st.text(max_size=40),
       tag=st.one_of(st.none(), st.text(max_size=10)), keys=st.lists(st.text(max_size=8), max_size=3),
       properties=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4),
       kind=st.integers(-1, 40), group=st.one_of(st.none(), st.text(max_size=70)),
       deliver=st.one_of(st.none(), st.integers(-2**40, 2**40)))
def test_nothing_in_a_message_makes_outgoing_raise_anything_but_refused(topic, body, message_id, tag, keys,
                                                                        properties, kind, group, deliver):
    m = message(topic=topic, body=body, message_id=message_id, message_type=kind)
    if tag is not None:
        m.system_properties.tag = tag
    m.system_properties.keys.extend(keys)
    m.user_properties.update(properties)
    if group is not None:
        m.system_properties.message_group = group
    if deliver is not None:
        m.system_properties.delivery_timestamp.FromMilliseconds(NOW + deliver)
    try:
        out = core.outgoing(m, MAX_BODY, MAX_DELAY, NOW)
    except Refused as e:
        assert e.code in Code.values() and e.message
        return
    assert out.message.body == body and out.message.properties["UNIQ_KEY"] == message_id
    assert "\x01" not in "".join(out.message.properties) and "\x02" not in "".join(out.message.properties.values())
    out.message.wire_properties_string("K")  # (and the node's client sends it: nothing it refuses)


@settings(max_examples=200, deadline=None)
@given(batch=st.integers(-5, 5000), invisible=st.integers(-10, 2**40), wait=st.integers(-10, 2**40),
       queue=st.integers(-2**31, 2**31 - 1), expression=st.text(max_size=12), remaining=st.one_of(
           st.none(), st.integers(-1000, 100_000)))
def test_nothing_in_a_receive_makes_receive_plan_raise_anything_but_refused(batch, invisible, wait, queue, expression,
                                                                            remaining):
    request = receive(batch_size=batch, queue=queue, invisible_duration=invisible, long_polling_timeout=wait)
    request.filter_expression.expression = expression
    try:
        plan = delivery.receive_plan(request, remaining, fifo=queue % 2 == 0)
    except Refused:
        return
    assert 0 <= plan.wait_ms <= delivery.MAX_POLLING_MS and 0 < plan.max_count <= core.MAX_RECEIVE_BATCH
    assert plan.queue_id >= -1 and time.time() > 0
