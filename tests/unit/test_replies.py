"""Request-reply without a node: the reply made from a request (createReplyMessage's rules), what
the front pushes of a reply (actors.replies), the producer table's lookup by clientID, and the
requester matching pushed replies to its requests by CORRELATION_ID (the node's side played by
plain functions)."""

from __future__ import annotations

import asyncio

import pytest

from actors import replies
from actors.producers import ProducerGroups
from node import protocol
from node.client.message import create_reply
from node.client.replies import AsyncRequester, RequestTimeout
from node.client.producer import SendResult

REQUEST_PROPS = {"CLUSTER": "Blue", protocol.PROPERTY_REPLY_TO_CLIENT: "host@1@a", protocol.PROPERTY_CORRELATION_ID: "c-1",
                 protocol.PROPERTY_MESSAGE_TTL: "3000", "UNIQ_KEY": "K1", "TAGS": "TagA"}


class Asked:
    def __init__(self, properties: dict):
        self.properties = properties


def test_a_reply_goes_to_its_clusters_reply_topic_carrying_what_matches_it_to_the_request():
    reply = create_reply(Asked(REQUEST_PROPS), "pong", properties={"k": "v"})
    assert reply.topic == "Blue_REPLY_TOPIC" and reply.body == b"pong"
    assert reply.properties == {"k": "v", "MSG_TYPE": "reply", protocol.PROPERTY_REPLY_TO_CLIENT: "host@1@a",
                                protocol.PROPERTY_CORRELATION_ID: "c-1", protocol.PROPERTY_MESSAGE_TTL: "3000"}


def test_a_reply_to_a_request_without_a_ttl_or_correlation_id_carries_none():
    props = {k: v for k, v in REQUEST_PROPS.items() if k not in (protocol.PROPERTY_MESSAGE_TTL, protocol.PROPERTY_CORRELATION_ID)}
    reply = create_reply(Asked(props), "pong")
    assert reply.properties == {"MSG_TYPE": "reply", protocol.PROPERTY_REPLY_TO_CLIENT: "host@1@a"}
    reply.wire_properties("K")  # (an empty one was sent: a message stores none)


@pytest.mark.parametrize("missing", ["CLUSTER", protocol.PROPERTY_REPLY_TO_CLIENT])
def test_no_reply_is_made_for_a_message_that_is_no_request(missing):
    props = {k: v for k, v in REQUEST_PROPS.items() if k != missing}
    with pytest.raises(ValueError, match=missing):
        create_reply(Asked(props), b"x")


def test_the_pushed_reply_carries_the_message_and_when_the_node_pushed_it():
    header = {"code": protocol.SEND_MESSAGE, "opaque": 7, "topic": "Blue_REPLY_TOPIC", "queueId": 0, "flag": 3,
              "bornTimestamp": 11, "properties": {"A": "1"}, "producerGroup": "PG", "signature": "x"}
    pushed = replies.push_header(header, "10.0.0.1:10911", 99)
    assert pushed == {"code": protocol.PUSH_REPLY_MESSAGE_TO_CLIENT, "topic": "Blue_REPLY_TOPIC", "queueId": 0,
                      "flag": 3, "bornTimestamp": 11, "producerGroup": "PG", "storeHost": "10.0.0.1:10911",
                      "storeTimestamp": 99, "properties": {"A": "1", protocol.PROPERTY_PUSH_REPLY_TIME: "99"}}
    assert "opaque" not in pushed  # (a request of the node's: no reply of the client's to match)
    assert header["properties"] == {"A": "1"}  # (the stored copy keeps the replier's properties)


@pytest.mark.parametrize("properties", [None, {}, {protocol.PROPERTY_REPLY_TO_CLIENT: ""}, "A\x01b"])
def test_a_reply_naming_no_requester_says_so(properties):
    client_id, why = replies.requester({"properties": properties})
    assert client_id is None and why == "reply message properties[REPLY_TO_CLIENT] is null"


def test_a_reply_with_rocketmqs_properties_string_names_its_requester_too():
    header = {"properties": "MSG_TYPE\x01reply\x02REPLY_TO_CLIENT\x01host@1@a"}
    assert replies.requester(header) == ("host@1@a", "")
    assert replies.push_header(header, "h:1", 9)["properties"] == {"MSG_TYPE": "reply", "REPLY_TO_CLIENT": "host@1@a",
                                                                   protocol.PROPERTY_PUSH_REPLY_TIME: "9"}


def test_a_requester_is_found_by_its_client_id_in_any_group_and_forgotten_in_all():
    producers = ProducerGroups(30_000)
    producers.heartbeat("c1", b"r1", [{"groupName": "G1"}, {"groupName": "G2"}], 0)
    producers.heartbeat("c2", b"r2", [{"groupName": "G2"}], 0)
    assert producers.find("c1") == b"r1" and producers.find("c2") == b"r2" and producers.find("c3") is None
    producers.forget("c1")
    assert producers.find("c1") is None and producers.table() == {"G2": ["c2"]}
    producers.heartbeat("c3", b"r3", [{"groupName": "G2"}], 400)
    assert producers.connections("G2", 1000) == [{"clientId": "c2", "lastHeartbeatMillisAgo": 1000},
                                                 {"clientId": "c3", "lastHeartbeatMillisAgo": 600}]
    assert producers.connections("G1", 1000) == []  # (GET_PRODUCER_CONNECTION_LIST: none connected now)


def _pushed(correlation: str, body: bytes = b"re") -> tuple[dict, bytes]:
    return {"code": protocol.PUSH_REPLY_MESSAGE_TO_CLIENT, "topic": "Blue_REPLY_TOPIC", "queueId": 0,
            "storeTimestamp": 5, "properties": {protocol.PROPERTY_CORRELATION_ID: correlation}}, body


def test_each_request_gets_the_reply_of_its_correlation_id_and_a_stray_one_is_counted():
    async def scenario() -> None:
        requester = AsyncRequester("tcp://127.0.0.1:1", "RG")
        requester.membership.task = asyncio.get_running_loop().create_future()  # (started: no node to greet)
        sent = []

        async def send_message(message, queue_id=None):  # the node: stores it; the replier answers later
            sent.append(message)
            return SendResult("PUT_OK", "id", "oid", 0, len(sent) - 1, message.topic)

        requester.producer.send_message = send_message
        waits = [asyncio.ensure_future(requester.request("Rpc", f"q{i}", timeout=5)) for i in range(3)]
        while len(sent) < 3:
            await asyncio.sleep(0)
        props = [m.properties for m in sent]
        assert {p[protocol.PROPERTY_REPLY_TO_CLIENT] for p in props} == {requester.client_id}
        assert len({p[protocol.PROPERTY_CORRELATION_ID] for p in props}) == 3 and props[0]["TTL"] == "5000"
        requester._on_request(*_pushed("stray"))
        for i in (2, 0, 1):  # (replies come in any order)
            requester._on_request(*_pushed(props[i][protocol.PROPERTY_CORRELATION_ID], f"re{i}".encode()))
        got = await asyncio.gather(*waits)
        assert [m.body for m in got] == [b"re0", b"re1", b"re2"]
        assert protocol.PROPERTY_REPLY_ARRIVE_TIME in got[0].properties and got[0].store_timestamp == 5
        assert requester.statistics() == {"waiting": 0, "replied": 3, "unmatched": 1, "timedOut": 0}
        late = asyncio.ensure_future(requester.request("Rpc", "late", timeout=0.05))
        with pytest.raises(RequestTimeout, match="wait reply message timeout, 50 ms"):
            await late
        requester._on_request(*_pushed(sent[-1].properties[protocol.PROPERTY_CORRELATION_ID]))  # after its time
        assert requester.statistics() == {"waiting": 0, "replied": 3, "unmatched": 2, "timedOut": 1}
        for timeout in (0, -1, "3", True, float("nan")):  # (nothing sent: no reply could come in time)
            with pytest.raises(ValueError, match="timeout must be a number of seconds above 0"):
                await requester.request("Rpc", "never", timeout=timeout)
        assert len(sent) == 4
        requester.membership.task = None
        await requester.close()

    asyncio.run(scenario())


def test_a_reply_needs_what_a_send_to_its_topic_needs_under_the_acl():
    from actors import acl

    header = {"code": protocol.SEND_REPLY_MESSAGE, "topic": "Blue_REPLY_TOPIC"}
    assert acl.needed(header) == acl.needed({**header, "code": protocol.SEND_MESSAGE}) == [("topic", "Blue_REPLY_TOPIC",
                                                                                           acl.PUB)]
