"""The front door, as a client written from docs/protocol.md alone sees it: every malformed
request gets its documented reply and the node goes on serving (a good send right after each);
what a client was told is stored can be read back at once, with the dispatcher slowed down; the
store host in offsetMsgId is where the node listens; batches store what RocketMQ 4.9 stores.

One node for the module (Ray takes seconds to start), in the default topology, on a listen port
of its own with `listenPort` left at its default.
"""

from __future__ import annotations

import itertools
import time

import orjson
import pytest
import zmq
from helpers import read_statistics
from nodes import in_process_node

from node import protocol
from shm.codec import decode, decode_msg_id
from shm.store import MessageStore

# the dispatcher looks at the written end only every 3 ms while records come: reads race it
SLOW_DISPATCH = {"dispatcherPollMillis": 3, "dispatcherPollHoldMillis": 50}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    yield from in_process_node(tmp_path_factory.mktemp("door"), listenPort=10911, **SLOW_DISPATCH)


class Client:
    """A DEALER speaking the wire protocol by hand."""

    def __init__(self, endpoint: str):
        self.context = zmq.Context()
        self.sock = self.context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.opaques = itertools.count(1)

    def ask(self, header: dict | bytes, body: bytes | None = None, *, timeout_ms: int = 20000) -> tuple[dict, bytes]:
        if isinstance(header, dict):
            header = orjson.dumps({"opaque": next(self.opaques), **header})
        self.sock.send_multipart([header] if body is None else [header, body])
        assert self.sock.poll(timeout_ms), "no reply: the node must answer every request"
        frames = self.sock.recv_multipart()
        return orjson.loads(frames[0]), frames[1] if len(frames) > 1 else b""

    def close(self) -> None:
        self.sock.close(0)
        self.context.term()


@pytest.fixture(scope="module")
def client(node):
    c = Client(node.settings.listen)
    yield c
    c.close()


def good_send(client: Client) -> None:
    reply, _ = client.ask({"code": protocol.SEND_MESSAGE, "topic": "DoorTopic", "queueId": 0}, b"after")
    assert reply["status"] == "PUT_OK" and reply["code"] == 0, reply


LONG = "é" * 128  # 128 characters, 256 UTF-8 bytes: once reached the file system as a path
SEND = {"code": protocol.SEND_MESSAGE, "queueId": 0}
BATCH = {"code": protocol.SEND_BATCH_MESSAGE, "queueId": 0}
ONE_BATCH_BODY = protocol.encode_batch_body([(b"a", 0, "")])
PULL = {"code": protocol.PULL_MESSAGE, "topic": "DoorTopic", "queueId": 0, "queueOffset": 0}
QUEUE = {"topic": "DoorTopic", "queueId": 0}
OFFSET = {"code": protocol.UPDATE_CONSUMER_OFFSET, "consumerGroup": "door", "topic": "DoorTopic", "queueId": 0,
          "commitOffset": 1}


def messages(*overrides: dict) -> dict:
    return {"code": protocol.SEND_MESSAGES, "messages": [{"topic": "DoorTopic", "queueId": 0, "bodySize": 1} | o
                                                         for o in overrides]}


# (request header, body, the status every case expects)
CASES = {
    # defect 1: a topic that is a list or an object
    "route-topic-list": ({"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": ["a"]}, None, "MESSAGE_ILLEGAL"),
    "route-topic-object": ({"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": {"a": 1}}, None, "MESSAGE_ILLEGAL"),
    "route-create-string": ({"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": "RouteX", "create": "no"}, None,
                            "SYSTEM_ERROR"),
    "send-topic-list": (SEND | {"topic": ["a"]}, b"x", "MESSAGE_ILLEGAL"),
    "send-topic-object": (SEND | {"topic": {"a": 1}}, b"x", "MESSAGE_ILLEGAL"),
    "batch-topic-list": (BATCH | {"topic": ["a"]}, ONE_BATCH_BODY, "MESSAGE_ILLEGAL"),
    "batch-topic-object": (BATCH | {"topic": {"a": 1}}, ONE_BATCH_BODY, "MESSAGE_ILLEGAL"),
    # defect 1: 256 UTF-8 bytes of topic on reads
    "pull-long-topic": (PULL | {"topic": LONG}, None, "SYSTEM_ERROR"),
    "search-long-topic": ({"code": protocol.SEARCH_OFFSET_BY_TIMESTAMP, "topic": LONG, "queueId": 0,
                           "timestamp": 0}, None, "SYSTEM_ERROR"),
    "max-long-topic": ({"code": protocol.GET_MAX_OFFSET, "topic": LONG, "queueId": 0}, None, "SYSTEM_ERROR"),
    "min-long-topic": ({"code": protocol.GET_MIN_OFFSET, "topic": LONG, "queueId": 0}, None, "SYSTEM_ERROR"),
    "max-ascii-256": ({"code": protocol.GET_MAX_OFFSET, "topic": "a" * 256, "queueId": 0}, None, "SYSTEM_ERROR"),
    "pull-bad-name": (PULL | {"topic": "bad topic!"}, None, "SYSTEM_ERROR"),
    "pull-topic-list": (PULL | {"topic": ["a"]}, None, "SYSTEM_ERROR"),
    "query-bad-name": ({"code": protocol.QUERY_MESSAGE, "topic": "bad topic!", "key": "k"}, None, "SYSTEM_ERROR"),
    "offset-long-topic": (OFFSET | {"topic": "t" * 256}, None, "SYSTEM_ERROR"),
    "offset-bad-group": (OFFSET | {"consumerGroup": "bad group!"}, None, "SYSTEM_ERROR"),
    "offset-group-list": (OFFSET | {"consumerGroup": ["g"]}, None, "SYSTEM_ERROR"),
    "offset-queue-string": (OFFSET | {"queueId": "0"}, None, "SYSTEM_ERROR"),
    "offset-commit-float": (OFFSET | {"commitOffset": 1.5}, None, "SYSTEM_ERROR"),
    "query-offset-bad-group": ({"code": protocol.QUERY_CONSUMER_OFFSET, "consumerGroup": "", **QUEUE}, None,
                               "SYSTEM_ERROR"),
    "consume-stats-group-object": ({"code": protocol.GET_CONSUME_STATS, "consumerGroup": {}}, None, "SYSTEM_ERROR"),
    # every other field of the reads
    "pull-queue-negative": (PULL | {"queueId": -1}, None, "SYSTEM_ERROR"),
    "pull-queue-bool": (PULL | {"queueId": True}, None, "SYSTEM_ERROR"),
    "pull-offset-float": (PULL | {"queueOffset": 1.0}, None, "SYSTEM_ERROR"),
    "pull-offset-missing": ({"code": protocol.PULL_MESSAGE, **QUEUE}, None, "SYSTEM_ERROR"),
    "pull-count-zero": (PULL | {"maxMsgNums": 0}, None, "SYSTEM_ERROR"),
    "pull-count-1025": (PULL | {"maxMsgNums": 1025}, None, "SYSTEM_ERROR"),
    "pull-suspend-string": (PULL | {"suspend": "yes"}, None, "SYSTEM_ERROR"),
    "pull-subscription-number": (PULL | {"subscription": 5}, None, "SYSTEM_ERROR"),
    "pull-subscription-dangling": (PULL | {"subscription": "TagA ||"}, None, "SUBSCRIPTION_PARSE_FAILED"),
    "query-key-list": ({"code": protocol.QUERY_MESSAGE, "topic": "DoorTopic", "key": []}, None, "SYSTEM_ERROR"),
    "query-max-string": ({"code": protocol.QUERY_MESSAGE, "topic": "DoorTopic", "key": "k", "maxNum": "x"}, None,
                         "SYSTEM_ERROR"),
    "search-timestamp-string": ({"code": protocol.SEARCH_OFFSET_BY_TIMESTAMP, **QUEUE, "timestamp": "now"}, None,
                                "SYSTEM_ERROR"),
    "view-id-short": ({"code": protocol.VIEW_MESSAGE_BY_ID, "offsetMsgId": "zz"}, None, "SYSTEM_ERROR"),
    "view-id-number": ({"code": protocol.VIEW_MESSAGE_BY_ID, "offsetMsgId": 5}, None, "SYSTEM_ERROR"),
    "view-id-not-hex": ({"code": protocol.VIEW_MESSAGE_BY_ID, "offsetMsgId": "Z" * 32}, None, "SYSTEM_ERROR"),
    # defect 7: silent coercions
    **{f"pull-suspend-timeout-{name}": (PULL | {"suspend": True, "suspendTimeoutMillis": value}, None, "SYSTEM_ERROR")
       for name, value in (("negative", -1), ("2^31", 2**31), ("string", "x"), ("null", None))},
    "send-born-host-garbage": (SEND | {"topic": "DoorTopic", "bornHost": "garbage"}, b"x", "MESSAGE_ILLEGAL"),
    "send-born-host-port": (SEND | {"topic": "DoorTopic", "bornHost": "1.2.3.4:99999"}, b"x", "MESSAGE_ILLEGAL"),
    "send-born-host-number": (SEND | {"topic": "DoorTopic", "bornHost": 5}, b"x", "MESSAGE_ILLEGAL"),
    "send-oneway-string": (SEND | {"topic": "DoorTopic", "oneway": "yes"}, b"x", "MESSAGE_ILLEGAL"),
    "send-flag-beyond-int32": (SEND | {"topic": "DoorTopic", "flag": 2**31}, b"x", "MESSAGE_ILLEGAL"),
    "send-queue-float": (SEND | {"topic": "DoorTopic", "queueId": 0.0}, b"x", "MESSAGE_ILLEGAL"),
    "send-properties-list": (SEND | {"topic": "DoorTopic", "properties": ["a"]}, b"x", "MESSAGE_ILLEGAL"),
    "send-property-number": (SEND | {"topic": "DoorTopic", "properties": {"a": 1}}, b"x", "MESSAGE_ILLEGAL"),
    "send-born-timestamp-string": (SEND | {"topic": "DoorTopic", "bornTimestamp": "now"}, b"x", "MESSAGE_ILLEGAL"),
    "code-float": ({"code": 10.0, "topic": "DoorTopic", "queueId": 0}, b"x", "SYSTEM_ERROR"),
    "code-unknown": ({"code": 4242}, None, "REQUEST_CODE_NOT_SUPPORTED"),
    # defect 6: batches
    "batch-delay-in-message": (BATCH | {"topic": "DoorTopic"},
                               protocol.encode_batch_body([(b"a", 0, "DELAY\x012")]), "MESSAGE_ILLEGAL"),
    "batch-delay-in-header": (BATCH | {"topic": "DoorTopic", "properties": {"DELAY": "2"}}, ONE_BATCH_BODY,
                              "MESSAGE_ILLEGAL"),
    "batch-magic-7": (BATCH | {"topic": "DoorTopic"},
                      ONE_BATCH_BODY[:4] + (7).to_bytes(4, "big") + ONE_BATCH_BODY[8:], "SYSTEM_ERROR"),
    "batch-sizes-off": (BATCH | {"topic": "DoorTopic"}, b"\x00\x00\x00\x05garbage", "SYSTEM_ERROR"),
    # the SEND_MESSAGES structure
    "messages-empty": ({"code": protocol.SEND_MESSAGES, "messages": []}, b"", "SYSTEM_ERROR"),
    "messages-4097": ({"code": protocol.SEND_MESSAGES,
                       "messages": [{"topic": "DoorTopic", "queueId": 0, "bodySize": 0}] * 4097}, b"", "SYSTEM_ERROR"),
    "messages-not-objects": ({"code": protocol.SEND_MESSAGES, "messages": [1]}, b"", "SYSTEM_ERROR"),
    "messages-sizes-short": (messages({}), b"", "SYSTEM_ERROR"),
    "messages-body-size-string": (messages({"bodySize": "1"}), b"x", "SYSTEM_ERROR"),
    "messages-compact-string": (messages({}) | {"compact": "yes"}, b"x", "SYSTEM_ERROR"),
    "messages-born-host-per-message": (messages({"bornHost": "1.2.3.4:5"}), b"x", "MESSAGE_ILLEGAL"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_malformed_request_gets_its_documented_reply(node, client, name):
    header, body, status = CASES[name]
    reply, _ = client.ask(header, body)
    assert reply["status"] == status, reply
    assert reply["code"] == protocol.STATUS_CODES[status], reply  # code and status agree
    assert reply.get("remark") or status == "OK", reply
    good_send(client)


def test_a_consumers_route_ask_makes_no_topic_and_a_producers_does(node, client):
    ask = {"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": "NotYetMade"}
    reply, _ = client.ask(ask | {"create": False})  # (a consumer's typo made a topic)
    assert reply["status"] == "TOPIC_NOT_EXIST" and "NotYetMade" in reply["remark"]
    topics, _ = client.ask({"code": protocol.GET_ALL_TOPIC_CONFIG})
    assert "NotYetMade" not in str(topics)
    assert client.ask(ask | {"create": True})[0]["writeQueueNums"] > 0  # (autoCreateTopicEnable: as a send would)
    assert client.ask(ask | {"create": False})[0]["status"] == "OK"
    assert client.ask(ask | {"topic": "bad topic!", "create": False})[0]["status"] == "MESSAGE_ILLEGAL"


@pytest.mark.parametrize("topic", [["a"], {"a": 1}, LONG, "bad topic!"])
def test_a_bad_topic_inside_send_messages_refuses_only_that_message(node, client, topic):
    reply, _ = client.ask(messages({}, {"topic": topic}), b"ab")
    assert [r["status"] for r in reply["results"]] == ["PUT_OK", "MESSAGE_ILLEGAL"]
    # defect 5: the first status that is not PUT_OK, with its own code
    assert reply["status"] == "MESSAGE_ILLEGAL" and reply["code"] == protocol.MESSAGE_ILLEGAL
    good_send(client)


def test_offset_commits_are_validated_and_nothing_bad_is_stored(node, client):
    for name in ("offset-long-topic", "offset-bad-group", "offset-queue-string"):
        client.ask(*CASES[name][:2])
    reply, _ = client.ask({"code": protocol.GET_CONSUME_STATS, "consumerGroup": "door"})
    assert all(len(topic) <= 127 for topic in reply["offsetTable"])


# -- defect 3: reading what was just acknowledged ---------------------------------------------------


def test_a_pull_at_an_acknowledged_offset_never_rewinds(node, client):
    """Single sends into fresh queues, each followed at once by a pull at its queueOffset: FOUND
    or NO_NEW_MSG ("not yet", nextBeginOffset the same), never OFFSET_ILLEGAL; held, it finds it."""
    outcomes = {}
    for i in range(1000):
        queue = {"topic": f"Fresh{i % 50}", "queueId": i % 8}
        for _ in range(2):  # the pull then often asks past the indexed end, not just at it
            sent, _ = client.ask({"code": protocol.SEND_MESSAGE, **queue}, b"x%d" % i)
            assert sent["status"] == "PUT_OK"
        suspend = i % 10 == 0
        pulled, body = client.ask({"code": protocol.PULL_MESSAGE, **queue, "queueOffset": sent["queueOffset"],
                                   "suspend": suspend, "suspendTimeoutMillis": 5000})
        outcomes[pulled["status"]] = outcomes.get(pulled["status"], 0) + 1
        assert pulled["status"] in ("FOUND", "NO_NEW_MSG"), (i, sent, pulled)
        if pulled["status"] == "NO_NEW_MSG":
            assert pulled["nextBeginOffset"] == sent["queueOffset"] and not suspend, pulled
        else:
            assert decode(body).body == b"x%d" % i
    assert outcomes.get("FOUND", 0) >= 100, outcomes  # held pulls, at least, find theirs
    deadline = time.monotonic() + 5  # (a pull worker's statistics come once a second)
    while _reads(client)["deferrals"] == 0:  # the race was run: some pulls waited for the dispatcher
        assert time.monotonic() < deadline, _reads(client)
        time.sleep(0.2)


def _reads(client: Client) -> dict:
    info, _ = client.ask({"code": protocol.GET_BROKER_RUNTIME_INFO})
    return read_statistics(info)


def test_a_pull_right_after_a_batch_into_an_empty_queue(node, client):
    for i in range(32):
        queue = {"topic": f"BatchFresh{i}", "queueId": i % 4}
        for round_ in range(2):
            sent, _ = client.ask({"code": protocol.SEND_BATCH_MESSAGE, **queue},
                                 protocol.encode_batch_body([(b"m%d" % j, 0, "") for j in range(8)]))
            assert sent["status"] == "PUT_OK" and sent["queueOffset"] == 8 * round_
            pulled, _ = client.ask({"code": protocol.PULL_MESSAGE, **queue, "queueOffset": sent["queueOffset"] + 7})
            assert pulled["status"] in ("FOUND", "NO_NEW_MSG"), pulled
            assert pulled["nextBeginOffset"] >= sent["queueOffset"] + 7, pulled


def test_an_offset_past_everything_assigned_is_still_illegal(node, client):
    sent, _ = client.ask({"code": protocol.SEND_MESSAGE, "topic": "Beyond", "queueId": 0}, b"x")
    pulled, _ = client.ask({"code": protocol.PULL_MESSAGE, "topic": "Beyond", "queueId": 0, "queueOffset": 10**6})
    assert pulled["status"] == "OFFSET_ILLEGAL" and pulled["nextBeginOffset"] == sent["queueOffset"] + 1


def test_view_and_max_offset_see_every_acknowledged_send(node, client):
    for i in range(1000):
        queue = {"topic": f"Seen{i % 20}", "queueId": i % 4}
        sent, _ = client.ask({"code": protocol.SEND_MESSAGE, **queue, "properties": {"KEYS": f"seen-{i}"}}, b"v%d" % i)
        viewed, body = client.ask({"code": protocol.VIEW_MESSAGE_BY_ID, "offsetMsgId": sent["offsetMsgId"]})
        assert viewed["status"] == "OK" and decode(body).body == b"v%d" % i, viewed
        top, _ = client.ask({"code": protocol.GET_MAX_OFFSET, **queue})
        assert top["offset"] == sent["queueOffset"] + 1, (sent, top)
        if i % 50 == 0:
            found, _ = client.ask({"code": protocol.QUERY_MESSAGE, "topic": queue["topic"], "key": f"seen-{i}"})
            assert found["status"] == "OK" and found["count"] == 1, found


def test_the_indexed_max_offset_is_there_when_asked_for(node, client):
    sent, _ = client.ask({"code": protocol.SEND_MESSAGE, "topic": "Indexed", "queueId": 0}, b"x")
    top, _ = client.ask({"code": protocol.GET_MAX_OFFSET, "topic": "Indexed", "queueId": 0, "indexed": True})
    assert top["status"] == "OK" and top["offset"] in (sent["queueOffset"], sent["queueOffset"] + 1)


# -- defect 4: the store host is where the node listens ----------------------------------------------


def test_offset_msg_id_encodes_the_listen_port(node, client):
    port = int(node.settings.listen.rsplit(":", 1)[1])
    assert port != 10911 and node.settings.listenPort == 10911  # left at its default
    sent, _ = client.ask({"code": protocol.SEND_MESSAGE, "topic": "DoorTopic", "queueId": 0}, b"where")
    host, offset = decode_msg_id(sent["offsetMsgId"])
    assert (host.ip, host.port) == ("127.0.0.1", port)
    batch, _ = client.ask({"code": protocol.SEND_BATCH_MESSAGE, "topic": "DoorTopic", "queueId": 1}, ONE_BATCH_BODY)
    assert all(decode_msg_id(i)[0].port == port for i in batch["offsetMsgId"].split(","))
    with MessageStore(node.settings, readonly=True) as store:
        assert store.commitlog.read(offset).store_host.port == port


# -- defect 6: what a batch stores ---------------------------------------------------------------------


def test_batch_properties_are_stored_as_rocketmq_49_stores_them(node, client):
    """Own properties, then a 0x02 only when they are non-empty and do not end in one, then the
    batch's (header properties plus CLUSTER): RocketMQ's needAppendLastPropertySeparator."""
    own = ["", "TAGS\x01A", "TAGS\x01A\x02", "KEYS\x01k\x02TAGS\x01B"]
    sent, _ = client.ask({"code": protocol.SEND_BATCH_MESSAGE, "topic": "BatchProps", "queueId": 0,
                          "properties": {"p": "q"}}, protocol.encode_batch_body([(b"b", 0, p) for p in own]))
    assert sent["status"] == "PUT_OK"
    with MessageStore(node.settings, readonly=True) as store:
        stored = [store.commitlog.read(decode_msg_id(i)[1]).properties_string for i in sent["offsetMsgId"].split(",")]
    batch_props = stored[0]  # the batch's own string, as the message without properties stores it
    assert sorted(batch_props.split("\x02")) == sorted(["p\x01q", f"CLUSTER\x01{node.settings.brokerClusterName}"])
    assert stored == [batch_props, "TAGS\x01A\x02" + batch_props, "TAGS\x01A\x02" + batch_props,
                      "KEYS\x01k\x02TAGS\x01B\x02" + batch_props]
