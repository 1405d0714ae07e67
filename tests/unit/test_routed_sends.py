"""A cluster's producer (namesrv=) over plain group clients: a send that fails on one group goes
to the other with the same UNIQ_KEY (its msgId), as RocketMQ's retry does; a message's own key
is kept; the caller's Message is not changed."""

from __future__ import annotations

import asyncio

from node.client import AsyncProducer, Message, SendError, SendResult
from node.client.routes import TopicRoute
from shm.codec import PROPERTY_UNIQ_KEY

ROUTE = {"queueDatas": [{"brokerName": name, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6} for name in "ab"],
         "brokerDatas": [{"brokerName": name, "brokerAddrs": {"0": f"{name}:1"}} for name in "ab"]}


class Group:
    """A group's client that fails every send while `failing`, and keeps the ids it was given."""

    def __init__(self, broker: str, failing: bool):
        self.broker, self.failing, self.ids = broker, failing, []

    def _answer(self, ids: list[str], queue: int):
        self.ids.append(ids)
        if self.failing:
            raise SendError("TIMEOUT", "no reply")
        return [SendResult("PUT_OK", i, "offset", queue, n, "T", self.broker) for n, i in enumerate(ids)]

    def _plain(self, topic, body, queue, delay_level, deliver_at_ms, delay_ms, uniq):
        future = asyncio.get_running_loop().create_future()
        try:
            future.set_result(self._answer([uniq], queue)[0])
        except SendError as e:
            future.set_exception(e)
        return future

    async def send_message(self, message, *, queue_id):
        return self._answer([message.properties[PROPERTY_UNIQ_KEY]], queue_id)[0]

    async def send_batch(self, topic, messages, *, queue_id, properties=None):
        return self._answer([m.wire_properties_string("fresh").split("\x01")[1] for m in messages], queue_id)

    async def close(self) -> None:
        pass


def _producer(groups: dict[str, Group]) -> AsyncProducer:
    producer = AsyncProducer(namesrv="127.0.0.1:1", retries=1)
    producer.cluster.groups.make = lambda broker, endpoint: groups[broker]
    producer.cluster.routes.table["T"] = TopicRoute("T", ROUTE)
    return producer


def test_a_send_retried_on_another_group_keeps_its_msg_id():
    async def run():
        groups = {"a": Group("a", failing=True), "b": Group("b", failing=False)}
        producer = _producer(groups)
        single = await producer.send("T", b"x")  # round-robin starts at a, which fails
        producer.cluster.faults.until.clear()  # (a held out no longer: each send below tries a first)
        message = Message("T", b"y", tags="t")
        keyed = await producer.send_message(message)
        producer.cluster.faults.until.clear()
        batch = await producer.send_batch("T", [b"1", Message("T", b"2", properties={PROPERTY_UNIQ_KEY: "mine"})])
        await producer.close()
        return groups, single, message, keyed, batch

    groups, single, message, keyed, batch = asyncio.run(run())
    assert groups["a"].ids == groups["b"].ids  # every id a failed on is the one b stored
    assert [single.msg_id] == groups["b"].ids[0] and single.broker == "b"
    assert [keyed.msg_id] == groups["b"].ids[1] and PROPERTY_UNIQ_KEY not in message.properties
    assert [r.msg_id for r in batch] == groups["b"].ids[2] and batch[1].msg_id == "mine"
    assert len({single.msg_id, keyed.msg_id, batch[0].msg_id}) == 3
