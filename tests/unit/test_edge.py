"""The edge's promise, fuzzed: a send request that actors.edge lets through is encoded or refused
by the write path with a status, never by an exception (which would now stop the front)."""

from __future__ import annotations

import time

import orjson
from helpers import small_settings
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from actors.ingress import RequestBatcher
from node import protocol
from actors import edge

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=6)
PROPERTY_TEXT = st.lists(st.sampled_from(["a", "K", "\x01", "\x02", "é", "DELAY", "WAIT", "1"]), max_size=8).map("".join)
FIELDS = {
    "topic": st.sampled_from(["TopicA", "", "bad topic", "é", "t" * 130]) | JSON_VALUES,
    "queueId": st.sampled_from([0, 1, -1, 2**31, 2**40]) | JSON_VALUES,
    "flag": st.integers(-2**33, 2**33) | JSON_VALUES,
    "reconsumeTimes": st.integers(-2**33, 2**33) | JSON_VALUES,
    "bornTimestamp": st.integers(-2**65, 2**65) | JSON_VALUES,
    "properties": st.dictionaries(PROPERTY_TEXT, PROPERTY_TEXT | JSON_VALUES, max_size=4) | PROPERTY_TEXT | JSON_VALUES,
    "bornHost": st.sampled_from(["1.2.3.4:5", "[::1]:80", "1.2.3.4:99999", "x", ""]) | JSON_VALUES,
    "oneway": st.booleans() | JSON_VALUES,
}
MESSAGE = st.fixed_dictionaries({}, optional=FIELDS)
BATCH_BODIES = st.lists(st.tuples(st.binary(max_size=8), st.integers(-2**31, 2**31 - 1), PROPERTY_TEXT),
                        min_size=1, max_size=4).map(protocol.encode_batch_body) | st.binary(max_size=40)


def _front_refusals(header: dict) -> dict | None:
    """What the front does before the write core: None when it refuses the request whole."""
    try:
        if edge.send_refusal(header):
            return None
    except protocol.ProtocolError:
        return None
    if header["code"] != protocol.SEND_MESSAGES:
        return {}
    refusals = {}
    for i, message in enumerate(header["messages"]):
        remark = edge.send_problem(message)
        if remark:
            refusals[str(i)] = ["MESSAGE_ILLEGAL", remark]
    return refusals


def _write(tmp_path, header: dict, body: bytes) -> None:
    refusals = _front_refusals(header)
    if refusals is None:
        return
    batcher = RequestBatcher(small_settings(tmp_path))
    groups, replies = batcher.build([[b"client", {"t": time.monotonic_ns(), "refused": refusals}, header, body]])
    assert len(groups) + len(replies) == (0 if header.get("oneway") is True and not groups else 1)  # oneway: no reply
    for reply in replies:
        assert orjson.loads(reply[2])["status"]


FUZZ = hypothesis_settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(message=MESSAGE, body=st.binary(max_size=16))
@example(message={"topic": "TopicA", "queueId": 0, "properties": {"a\x01": "v"}}, body=b"x")
def test_single_sends_past_the_edge_never_raise(tmp_path, message, body):
    _write(tmp_path, {"code": protocol.SEND_MESSAGE, **message}, body)


@FUZZ
@given(message=MESSAGE, body=BATCH_BODIES)
@example(message={"topic": "TopicA", "queueId": 0, "properties": {"a\x01": "v"}},
         body=protocol.encode_batch_body([(b"a", 0, "")]))
def test_batches_past_the_edge_never_raise(tmp_path, message, body):
    _write(tmp_path, {"code": protocol.SEND_BATCH_MESSAGE, **message}, body)


@FUZZ
@given(messages=st.lists(MESSAGE, min_size=1, max_size=4), sizes=st.lists(st.integers(0, 4), min_size=4, max_size=4),
       compact=st.booleans())
def test_coalesced_sends_past_the_edge_never_raise(tmp_path, messages, sizes, compact):
    for message, size in zip(messages, sizes):
        message["bodySize"] = size
        message.pop("bornHost", None)
    body = bytes(sum(sizes[:len(messages)]))
    _write(tmp_path, {"code": protocol.SEND_MESSAGES, "messages": messages, "compact": compact}, body)


@given(header=st.dictionaries(st.sampled_from(["topic", "queueId", "queueOffset", "maxMsgNums", "suspend",
                                                "suspendTimeoutMillis", "subscription", "key", "maxNum",
                                                "offsetMsgId", "timestamp", "consumerGroup", "commitOffset",
                                                "indexed"]), JSON_VALUES),
       code=st.sampled_from(sorted(edge.CHECKS)))
def test_every_other_request_is_checked_or_refused_by_name(header, code):
    try:
        edge.check_request(protocol.Request({"code": code, **header}, b""))
    except protocol.ProtocolError as e:
        assert str(e)


def problem(header: dict) -> str | None:
    """What the edge says of a request: None when it takes it."""
    try:
        edge.check_request(protocol.Request(header, b""))
    except protocol.ProtocolError as e:
        return str(e)
    return None


def test_transaction_requests_are_checked_field_by_field():
    end = {"code": protocol.END_TRANSACTION, "producerGroup": "PG", "tranStateTableOffset": 3, "commitLogOffset": 0,
           "commitOrRollback": 8}
    assert problem(end) is None
    for bad, named in ((dict(commitOrRollback=4), "commitOrRollback"), (dict(commitOrRollback=True), "commitOrRollback"),
                       (dict(producerGroup="a b"), "producerGroup"), (dict(tranStateTableOffset=-1), "tranStateTableOffset"),
                       (dict(commitLogOffset="0"), "commitLogOffset"), (dict(fromTransactionCheck="yes"), "fromTransactionCheck"),
                       (dict(msgId=7), "msgId")):
        assert named in (problem(end | bad) or ""), bad
    many = {"code": protocol.END_TRANSACTIONS, "producerGroup": "PG", "ends": [end] * 2}
    assert problem(many) is None
    assert "ends" in problem(many | {"ends": []}) and "ends" in problem(many | {"ends": [end] * 1025})
    assert "commitOrRollback" in problem(many | {"ends": [end | {"commitOrRollback": 1}]})
    assert problem({"code": protocol.END_TRANSACTIONS, "producerGroup": "PG", "openOfGroup": True,
                    "commitOrRollback": 12}) is None
    assert "openOfGroup" in problem({"code": protocol.END_TRANSACTIONS, "producerGroup": "PG", "openOfGroup": True,
                                     "commitOrRollback": 8})
    assert "limit" in problem({"code": protocol.GET_TRANSACTION_STATE, "limit": 10**9})
    assert "producerDataSet" in problem({"code": protocol.HEART_BEAT, "clientID": "c", "producerDataSet": {}})
    assert "groupName" in problem({"code": protocol.HEART_BEAT, "clientID": "c", "producerDataSet": [{"groupName": ""}]})


def test_a_heartbeats_language_and_version_are_short_strings():
    beat = {"code": protocol.HEART_BEAT, "clientID": "c", "consumerDataSet": [{"groupName": "g"}]}
    assert problem(beat | {"language": "JAVA", "version": "5.0.7"}) is None
    assert "language" in problem(beat | {"language": 3}) and "version" in problem(beat | {"version": "v" * 65})


def test_a_reset_names_its_group_topic_and_each_queues_offset():
    reset = {"code": protocol.RESET_CONSUMER_CLIENT_OFFSET, "consumerGroup": "g", "topic": "T"}
    assert problem(reset | {"offsetTable": {"0": 3, "7": 0}}) is None
    for bad in ({}, {"x": 1}, {"07": 1}, {"0": -1}, {"0": "3"}, {"0": True}, [3], {str(q): 0 for q in range(4097)}):
        assert "offsetTable" in problem(reset | {"offsetTable": bad}), bad
    assert "topic" in problem(reset | {"offsetTable": {"0": 1}, "topic": "bad topic!"})
