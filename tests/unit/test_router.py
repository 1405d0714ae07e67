"""The router's core without a socket: where each request goes, and the answers it gives itself."""

from __future__ import annotations

import orjson
import pytest
from helpers import small_settings

from actors.router import Router, To
from node import protocol
from actors.offsets import ConsumerOffsets, SubscriptionGroups
from actors import config_files
from actors.topics import TopicTable, deleted_topics, deletion_floors


@pytest.fixture
def router(tmp_path):
    settings = small_settings(tmp_path / "store", autoCreateTopicEnable=False)
    config = tmp_path / "config"
    topics = TopicTable(config, auto_create=False, default_queues=4)
    topics.create("Known", 4)
    return Router(settings, topics, ConsumerOffsets(config), SubscriptionGroups(config))


def _request(code: int, **fields) -> protocol.Request:
    return protocol.Request({"code": code, "opaque": 9, **fields}, b"")


def _answer(route) -> dict:
    assert route.to is To.ANSWER
    return orjson.loads(route.frames[0])


def test_requests_go_to_their_service(router):
    assert router.route(_request(protocol.SEND_MESSAGE, topic="Known")).to is To.SEND
    assert router.route(_request(protocol.PULL_MESSAGE, topic="Known", queueId=0, queueOffset=0)).to is To.READ
    assert router.route(_request(protocol.DELETE_EXPIRED_COMMITLOG)).to is To.CLEAN
    assert router.route(_request(protocol.GET_BROKER_RUNTIME_INFO)).to is To.RUNTIME
    assert _answer(router.route(_request(4242)))["status"] == "REQUEST_CODE_NOT_SUPPORTED"
    with pytest.raises(protocol.ProtocolError, match="queueOffset"):
        router.route(_request(protocol.PULL_MESSAGE, topic="Known", queueId=0))


def test_the_router_answers_offsets_and_routes_from_its_tables(router):
    commit = dict(consumerGroup="g", topic="Known", queueId=1)
    assert _answer(router.route(_request(protocol.QUERY_CONSUMER_OFFSET, **commit)))["status"] == "QUERY_NOT_FOUND"
    assert _answer(router.route(_request(protocol.UPDATE_CONSUMER_OFFSET, commitOffset=7, **commit)))["status"] == "OK"
    assert _answer(router.route(_request(protocol.QUERY_CONSUMER_OFFSET, **commit)))["offset"] == 7
    stats = _answer(router.route(_request(protocol.GET_CONSUME_STATS, consumerGroup="g")))
    assert stats["offsetTable"] == {"Known": {"1": 7}}
    route = _answer(router.route(_request(protocol.GET_ROUTEINFO_BY_TOPIC, topic="Known")))
    assert (route["writeQueueNums"], route["readQueueNums"]) == (4, 4)
    assert _answer(router.route(_request(protocol.GET_ROUTEINFO_BY_TOPIC, topic="Unknown")))["status"] == "TOPIC_NOT_EXIST"
    assert "Known" in _answer(router.route(_request(protocol.GET_ALL_TOPIC_CONFIG)))["topicConfigTable"]


def test_a_pop_learns_the_topics_queues_the_groups_offsets_and_retries(router):
    router.route(_request(protocol.UPDATE_CONSUMER_OFFSET, consumerGroup="g", topic="Known", queueId=2, commitOffset=5))
    router.route(_request(protocol.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, groupName="g", retryMaxTimes=3))
    pop = _request(protocol.POP_MESSAGE, consumerGroup="g", topic="Known", queueId=-1, invisibleTime=1000)
    assert router.route(pop).to is To.POP
    assert (pop.header["_queues"], pop.header["_start"], pop.header["_retryMax"]) == ([0, 1, 2, 3], {"2": 5}, 3)
    one = _request(protocol.POP_MESSAGE, consumerGroup="g", topic="Known", queueId=1)
    assert router.route(one).to is To.POP and one.header["_queues"] == [1]
    assert _answer(router.route(_request(protocol.POP_MESSAGE, consumerGroup="g", topic="Nope")))["status"] == "TOPIC_NOT_EXIST"
    assert _answer(router.route(_request(protocol.POP_MESSAGE, consumerGroup="g", topic="Known", queueId=4)))["status"] == \
        "MESSAGE_ILLEGAL"
    ack = _request(protocol.ACK_MESSAGE, consumerGroup="g", extraInfo="1 Known 0 0")
    assert router.route(ack).to is To.POP and ack.header["_retryMax"] == 3
    for bad in ({"maxMsgNums": 0}, {"invisibleTime": 0}, {"queueId": -2}, {"exp": 5}, {"expType": "SQL"},
                {"order": "yes"}):
        with pytest.raises(protocol.ProtocolError):
            router.route(_request(protocol.POP_MESSAGE, consumerGroup="g", topic="Known", **bad))
    change = _request(protocol.CHANGE_MESSAGE_INVISIBLETIME, consumerGroup="g", extraInfo="1 Known 0 0", invisibleTime=0)
    assert router.route(change).to is To.POP  # (0: visible at once, a retry with no backoff)
    with pytest.raises(protocol.ProtocolError, match="invisibleTime"):
        router.route(_request(protocol.CHANGE_MESSAGE_INVISIBLETIME, consumerGroup="g", extraInfo="1 Known 0 0",
                              invisibleTime=-1))
    with pytest.raises(protocol.ProtocolError, match="extraInfos"):
        router.route(_request(protocol.BATCH_ACK_MESSAGE, consumerGroup="g", extraInfos=[]))
    with pytest.raises(protocol.ProtocolError, match="extraInfo"):
        router.route(_request(protocol.ACK_MESSAGE, consumerGroup="g", extraInfo=7))


def test_deleted_topics_are_those_clients_sent_to_that_the_table_no_longer_holds(tmp_path):
    """What recovery and the dispatcher may drop the queues of (MessageStore.drop_queues_of), with
    each one's deletion floor: never a topic the node makes itself unless deleted by name, and
    nothing while there is no table to go by."""
    assert deleted_topics(tmp_path) is None
    table = TopicTable(tmp_path, auto_create=True, default_queues=4)
    table.create("Kept", 4)
    deleted = deleted_topics(tmp_path)
    assert deleted("Gone") == 0 and deleted("Kept") is None  # (0: no floor kept, cleaning decides)
    for stored_by_the_node in ("%RETRY%group", "%DLQ%group", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC",
                               "rmq_sys_wheel_timer", "DefaultCluster_REPLY_TOPIC"):
        assert deleted(stored_by_the_node) is None, stored_by_the_node
    table.create("%RETRY%group", 1)
    table.log_span = lambda: (100, 5000)
    table.delete("%RETRY%group")
    assert deleted_topics(tmp_path)("%RETRY%group") == 5000  # deleted by name: it counts
    (tmp_path / "topics.json").write_text("not json")
    (tmp_path / "topics.json.bak").write_text("not json either")
    assert deleted_topics(tmp_path) is None


def test_a_deleted_topic_keeps_its_floor_in_the_table_file_until_cleaning_passes_it(tmp_path):
    """TopicTable.delete: the CommitLog's end at the deletion, kept under `deletedTopics` (the
    readers' actors.topics.deletion_floors), the higher of two deletions; a floor at or below the
    CommitLog's min offset is forgotten at the next deletion. RocketMQ's loader passes over the key."""
    table = TopicTable(tmp_path, auto_create=True, default_queues=4)
    for name in ("A", "B"):
        table.create(name, 2)
    table.log_span = lambda: (0, 700)
    table.delete("A")
    table.create("A", 2)  # made again: the floor stays, below it the deleted topic's messages
    assert deletion_floors(tmp_path) == {"A": 700}
    table.log_span = lambda: (800, 900)
    table.delete("B")
    assert deletion_floors(tmp_path) == {"B": 900} and TopicTable(tmp_path, auto_create=True, default_queues=4).deleted == {"B": 900}
    data = config_files.read(tmp_path / "topics.json")
    assert set(data) == {"dataVersion", "topicConfigTable", "deletedTopics"} and set(data["topicConfigTable"]) == {"A"}
    table.log_span = lambda: (800, 850)
    table.create("B", 2)
    table.delete("B")
    assert deletion_floors(tmp_path) == {"B": 900}  # never lowered
