"""SQL92 filters (RocketMQ's MessageSelector.bySql, expression type SQL92) on a real node with
enablePropertyFilter: pulls, consume, push consumers, pops and the CLI select by the messages'
properties, step over the rest, and refuse what does not parse. (A node with the setting off
refuses SQL92: tests/integration/test_pop.py; over gRPC: test_grpc.py.)"""

from __future__ import annotations

import subprocess
import threading
import time

import orjson
import pytest
from nodes import ROOT, running_node

from node.client import CONSUME_SUCCESS, Producer, PullConsumer, PushConsumer, SendError

pytestmark = pytest.mark.slow
SQL92 = "SQL92"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    yield from running_node(tmp_path_factory.mktemp("filters"), enablePropertyFilter=True)


@pytest.fixture(scope="module")
def consumer(node):
    with PullConsumer(node.endpoint) as client:
        yield client


def produce(node, topic: str, count: int, *, queue_id: int | None = 0) -> None:
    """Message i: body m<i>, tag TagA for even i (TagB for odd), properties a=i and colour; sent
    to one queue, returns once the dispatcher has indexed them all (a pull reads no further)."""
    with Producer(node.endpoint, timeout=10.0) as producer:
        for i in range(count):
            producer.send(topic, f"m{i}", tags="TagA" if i % 2 == 0 else "TagB", queue_id=queue_id,
                          properties={"a": str(i), "colour": "red" if i < count // 2 else "blue"})
    if queue_id is not None:
        indexed(node, topic, queue_id, count)


def indexed(node, topic: str, queue_id: int, count: int) -> None:
    deadline = time.monotonic() + 10
    with PullConsumer(node.endpoint) as consumer:
        while consumer.max_offset(topic, queue_id) < count:
            assert time.monotonic() < deadline, f"{topic}/{queue_id} not indexed to {count}"
            time.sleep(0.02)


def bodies(messages) -> list[str]:
    return [m.body.decode() for m in messages]


def test_a_sql92_pull_returns_what_it_selects_and_steps_over_the_rest(node, consumer):
    produce(node, "SqlPull", 20)
    result = consumer.pull("SqlPull", 0, 0, max_count=32, subscription="a >= 10 AND TAGS = 'TagA'",
                           expression_type=SQL92)
    assert result.status == "FOUND" and bodies(result.messages) == ["m10", "m12", "m14", "m16", "m18"]
    assert result.next_begin_offset == 20  # the unmatched ones were looked at and passed over
    nothing = consumer.pull("SqlPull", 0, 0, max_count=32, subscription="colour = 'green'", expression_type=SQL92)
    assert nothing.status == "NO_MATCHED_MSG" and nothing.messages == [] and nothing.next_begin_offset == 20
    tags = consumer.pull("SqlPull", 0, 0, max_count=32, subscription="TagB")  # (tags as before)
    assert bodies(tags.messages) == [f"m{i}" for i in range(1, 20, 2)]


def test_a_property_that_is_not_the_number_it_is_compared_with_fails_that_message_alone(node, consumer):
    with Producer(node.endpoint) as producer:
        for a in ("5", "abc", "7", "", "3.5"):
            producer.send("SqlOdd", f"a={a}", queue_id=0, properties={"a": a} if a else None)
    indexed(node, "SqlOdd", 0, 5)
    result = consumer.pull("SqlOdd", 0, 0, max_count=32, subscription="a > 4", expression_type=SQL92)
    assert bodies(result.messages) == ["a=5", "a=7"]  # 'abc' and '3.5' are not ints; no a is unknown
    decimals = consumer.pull("SqlOdd", 0, 0, max_count=32, subscription="a > 4.0 OR a IS NULL", expression_type=SQL92)
    assert bodies(decimals.messages) == ["a=5", "a=7", "a="]


@pytest.mark.parametrize("expression", ["a > 'x'", "a >", "a = NULL", "(a > 1", "a LIKE 'x%'"])
def test_a_malformed_sql92_expression_is_subscription_parse_failed(node, consumer, expression):
    produce(node, "SqlBad", 2)  # (the topic exists whatever ran before: a pop of a missing one is TOPIC_NOT_EXIST)
    with pytest.raises(SendError) as e:
        consumer.pull("SqlBad", 0, 0, subscription=expression, expression_type=SQL92)
    assert e.value.status == "SUBSCRIPTION_PARSE_FAILED"
    with pytest.raises(SendError) as e:
        consumer.pop("SqlBad", "sql-bad", tags=expression, expression_type=SQL92)
    assert e.value.status == "SUBSCRIPTION_PARSE_FAILED"


def test_an_unknown_expression_type_is_refused_and_the_node_serves_on(node, consumer):
    produce(node, "SqlUnknown", 2)
    with pytest.raises(SendError):
        consumer.pull("SqlUnknown", 0, 0, subscription="a > 1", expression_type="SQL")
    assert bodies(consumer.pull("SqlUnknown", 0, 0, max_count=2).messages) == ["m0", "m1"]


def test_consume_over_every_queue_and_the_cli_select_the_same(node, consumer):
    produce(node, "SqlConsume", 40, queue_id=None)  # spread over the topic's queues
    expression = "colour = 'blue' AND a BETWEEN 30 AND 35"
    got = sorted(bodies(consumer.consume("SqlConsume", "sql-consume", start="first", subscription=expression,
                                         expression_type=SQL92, idle_timeout=2)))
    assert got == sorted(f"m{i}" for i in range(30, 36))
    command = [str(ROOT / "scripts" / "mqnode"), "consume", "--endpoint", node.endpoint, "--topic", "SqlConsume",
               "--group", "sql-cli", "--from", "first", "--sql", expression, "--timeout", "3"]
    done = subprocess.run(command, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(orjson.loads(line)["body"] for line in done.stdout.splitlines()) == got


def test_a_push_consumer_subscribed_with_sql92_gets_exactly_what_it_selects(node):
    produce(node, "SqlPush", 30, queue_id=None)
    seen, lock, done = [], threading.Lock(), threading.Event()

    def listener(messages):
        with lock:
            seen.extend(bodies(messages))
            if len(seen) >= 10:
                done.set()
        return CONSUME_SUCCESS

    member = PushConsumer(node.endpoint, "sql-push", consume_from_where="FIRST_OFFSET")
    member.subscribe("SqlPush", "a >= 20", expression_type=SQL92)
    member.register_listener(listener)
    member.start()
    try:
        assert done.wait(30), seen
        time.sleep(1.0)  # (anything more would come now)
    finally:
        member.shutdown()
    assert sorted(seen) == sorted(f"m{i}" for i in range(20, 30))


def test_pops_with_sql92_hand_out_what_they_select_and_retire_the_rest_for_the_group(node, consumer):
    produce(node, "SqlPop", 20)
    popped = consumer.pop("SqlPop", "sql-pop", max_count=32, tags="TAGS = 'TagB' AND a < 10", expression_type=SQL92,
                          wait_ms=1000)
    assert bodies(popped) == ["m1", "m3", "m5", "m7", "m9"]
    assert all(consumer.ack(m) for m in popped)
    assert consumer.pop("SqlPop", "sql-pop", max_count=32, wait_ms=200) == []  # the group stepped over the rest
    peeked = consumer.peek("SqlPop", "sql-peek", max_count=32, tags="a > 17", expression_type=SQL92)
    assert bodies(peeked) == ["m18", "m19"]
