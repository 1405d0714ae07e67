"""Consumer groups without a node: the allocation strategies (RocketMQ's
AllocateMessageQueue*Test cases) and the node's member and lock table on a mock clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.client.allocate import STRATEGIES, allocate
from actors.consumers import ConsumerGroups


def shares(strategy, queues, members):
    return {m: allocate(strategy, m, queues, members) for m in members}


def test_averagely_gives_runs_of_adjacent_queues_the_first_members_one_more():
    queues = [("T", i) for i in range(10)]
    got = shares("averagely", queues, ["c0", "c1", "c2"])
    assert [[q for _, q in got[m]] for m in ("c0", "c1", "c2")] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    few = shares("averagely", queues[:3], [f"c{i}" for i in range(5)])
    assert [len(few[f"c{i}"]) for i in range(5)] == [1, 1, 1, 0, 0]


def test_by_circle_deals_queues_in_turn():
    got = shares("averagely-by-circle", [("T", i) for i in range(7)], ["a", "b", "c"])
    assert [[q for _, q in got[m]] for m in "abc"] == [[0, 3, 6], [1, 4], [2, 5]]


@given(st.sampled_from(STRATEGIES), st.integers(1, 40), st.sets(st.text("abcdef0123", min_size=1, max_size=6),
                                                                min_size=1, max_size=12))
def test_every_strategy_covers_each_queue_exactly_once(strategy, queue_count, members):
    queues = [("T", i) for i in range(queue_count)]
    got = shares(strategy, queues, sorted(members))
    taken = [q for share in got.values() for q in share]
    assert sorted(taken) == queues
    assert allocate(strategy, "not-a-member", queues, sorted(members)) == []


def test_consistent_hash_moves_only_the_queues_of_a_member_that_left():
    queues = [("T", i) for i in range(64)]
    members = [f"client-{i}" for i in range(5)]
    before = shares("consistent-hash", queues, members)
    after = shares("consistent-hash", queues, members[:-1])
    for member in members[:-1]:
        assert set(before[member]) <= set(after[member])  # kept all it had, took some of the leaver's


def test_unknown_strategy_is_named():
    with pytest.raises(ValueError, match="allocate_strategy"):
        allocate("random", "a", [("T", 0)], ["a"])


def heartbeat(groups, client, now, topics=("T",), group="g", routing=None):
    data = [{"groupName": group, "messageModel": "CLUSTERING",
             "subscriptionDataSet": [{"topic": t, "subString": "*"} for t in topics]}]
    return groups.heartbeat(client, routing or client.encode(), data, now)


def test_members_join_change_leave_and_expire_and_each_change_is_reported():
    groups = ConsumerGroups(channel_expired_ms=120_000, lock_max_live_ms=60_000)
    assert heartbeat(groups, "a", 0) == {"g"}
    assert heartbeat(groups, "b", 10) == {"g"}
    assert heartbeat(groups, "a", 20_000) == set()  # a renewal changes nothing
    assert heartbeat(groups, "a", 30_000, topics=("T", "U")) == {"g"}  # a new subscription does
    assert groups.client_ids("g") == ["a", "b"] and groups.subscribers("U") == {"g"}
    assert groups.expire(120_011) == {"g"} and groups.client_ids("g") == ["a"]  # b silent 120 s
    assert groups.unregister("a", "g") == {"g"} and groups.client_ids("g") == []
    assert groups.unregister("a", "g") == set()
    assert groups.statistics()["expired"] == 1


def test_a_lock_is_one_clients_until_released_or_expired():
    groups = ConsumerGroups(channel_expired_ms=120_000, lock_max_live_ms=60_000)
    q0, q1 = ("T", 0), ("T", 1)
    assert groups.lock("g", "a", [q0, q1], 0) == [q0, q1]
    assert groups.lock("g", "b", [q0, q1], 30_000) == []
    assert groups.lock("g", "a", [q0], 50_000) == [q0]  # renewed
    assert groups.lock("g", "b", [q0, q1], 60_001) == [q1]  # q1 expired, q0 renewed at 50 s
    groups.unlock("g", "a", [q0])
    assert groups.lock("g", "b", [q0], 60_002) == [q0]
    heartbeat(groups, "b", 60_003)
    groups.unregister("b", "g")  # a member that leaves frees its locks
    assert groups.held_locks("g", 60_004) == {}


def test_a_process_queue_commits_the_lowest_offset_not_done():
    from types import SimpleNamespace

    from node.client.push import ProcessQueue

    pq = ProcessQueue("T", 0, next_offset=0)
    pq.add([SimpleNamespace(queue_offset=o, body=b"x" * 10) for o in range(5)])
    pq.next_offset = 5
    assert pq.commit_offset() == 0 and pq.size == 50
    pq.done([1, 2, 4])  # done out of order: 0 and 3 are still with the listener
    assert pq.commit_offset() == 0
    pq.done([0])
    assert pq.commit_offset() == 3
    pq.done([3])
    assert pq.commit_offset() == 5 and pq.size == 0  # all done: on from the next pull's offset


def test_a_push_consumers_rebalancer_ends_when_shutdown_cancels_it_as_a_rebalance_is_wanted():
    """Python 3.11's wait_for loses a cancel that comes as the event it waits for is set (a
    member's notice and a shutdown at once): the rebalancer must end anyway, or shutdown hangs."""
    import asyncio

    from node.client.push import AsyncPushConsumer

    async def main() -> str:
        consumer = AsyncPushConsumer("tcp://127.0.0.1:1", "g")
        consumer.running, consumer.rebalance_wanted = True, asyncio.Event()

        async def rebalance() -> None:
            pass

        consumer._rebalance = rebalance
        task = asyncio.create_task(consumer._rebalancer())
        await asyncio.sleep(0.01)
        consumer.rebalance_wanted.set()
        await asyncio.sleep(0)  # the event's waiter is done; the rebalancer has not run yet
        consumer.running = False
        task.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(task), 1)
        except asyncio.CancelledError:
            pass
        except asyncio.TimeoutError:
            return "the rebalancer kept running"
        return "ended"

    assert asyncio.run(main()) == "ended"


def test_consume_ends_when_cancelled_as_a_pulls_result_comes_in():
    """Python 3.11's wait_for returns a result that arrives with a cancel and drops the cancel:
    a task consuming with `consume()` then kept running until its idle timeout. The cancel is
    sent at each tick around a pull's result coming in; every one must end the task."""
    import asyncio

    from node.client.consumer import AsyncPullConsumer, PullResult

    class OneQueue(AsyncPullConsumer):
        """consume()'s loop over plain in-memory answers (no node)."""

        def __init__(self):
            self.results: asyncio.Queue = asyncio.Queue()

        async def read_queues(self, topic):
            return [(None, 0)]

        async def committed(self, *args, **kwargs):
            return 0

        async def commit(self, *args, **kwargs):
            pass

        async def pull(self, *args, **kwargs):
            return await self.results.get()

    async def cancelled_after(ticks: int) -> bool:
        consumer = OneQueue()

        async def run() -> None:
            async for _ in consumer.consume("T", "G", idle_timeout=30):
                pass

        task = asyncio.create_task(run())
        await asyncio.sleep(0.01)  # consume waits for the first pull's result
        consumer.results.put_nowait(PullResult("NO_NEW_MSG", 0, 0, 0, []))
        for _ in range(ticks):
            await asyncio.sleep(0)
        task.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(task), 1)
        except asyncio.CancelledError:
            return True
        except asyncio.TimeoutError:
            task.cancel()
            return False
        return False

    async def main() -> list[int]:
        return [ticks for ticks in range(8) if not await cancelled_after(ticks)]

    assert asyncio.run(main()) == []  # (the ticks at which the cancel was lost)


def test_members_behind_one_connection_are_notified_once_and_show_their_language():
    groups = ConsumerGroups(120_000, 60_000)
    data = [{"groupName": "g", "subscriptionDataSet": [{"topic": "T"}]}]
    groups.heartbeat("grpc-1", b"proxy", data, 0, "JAVA", "5.0.7")  # (two clients of the gRPC proxy)
    groups.heartbeat("grpc-2", b"proxy", data, 0, "GOLANG", "5.1.2")
    groups.heartbeat("zmq-1", b"own", data, 0)
    assert groups.routing_ids({"g"}) == [("g", b"proxy"), ("g", b"own")]
    shown = {m.client_id: (m.to_json()["language"], m.to_json()["version"]) for m in groups.members("g")}
    assert shown == {"grpc-1": ("JAVA", "5.0.7"), "grpc-2": ("GOLANG", "5.1.2"), "zmq-1": ("", "")}


def test_a_listeners_success_is_either_kinds_and_anything_else_a_failure_said_once(caplog):
    """The client's rule for what a listener returns (push, orderly push and pop alike)."""
    import logging

    from node.client.push_state import (CONSUME_SUCCESS, RECONSUME_LATER, SUCCESS, SUSPEND_CURRENT_QUEUE_A_MOMENT,
                                        ListenerStatuses)

    log = logging.getLogger("mqnode.test-statuses")
    for success, failure in ((CONSUME_SUCCESS, RECONSUME_LATER), (SUCCESS, SUSPEND_CURRENT_QUEUE_A_MOMENT)):
        caplog.clear()
        statuses = ListenerStatuses(success, failure, log)
        with caplog.at_level(logging.WARNING, logger=log.name):
            assert statuses.succeeded(CONSUME_SUCCESS) and statuses.succeeded(SUCCESS)
            assert not statuses.succeeded(failure)
            assert not any(statuses.succeeded(odd) for odd in (None, "consume_success", None, 0, None))
        said = [r.getMessage() for r in caplog.records]
        assert said == [f"a listener returned {odd!r}, not {success} or {failure}: taken as {failure}"
                        for odd in (None, "consume_success", 0)], said


def test_the_members_of_a_closed_connection_leave_at_once_and_its_locks_are_freed():
    groups = ConsumerGroups(120_000, 60_000)
    data = [{"groupName": g, "subscriptionDataSet": [{"topic": "T"}]} for g in ("g", "h")]
    groups.heartbeat("a", b"a", data, 0, connection=7)  # (one client, two groups, on fd 7)
    groups.heartbeat("b", b"b", data[:1], 0, connection=8)
    groups.lock("g", "a", [("T", 0)], 0)
    assert groups.disconnected(9) == set() and groups.client_ids("g") == ["a", "b"]
    assert groups.disconnected(7) == {"g", "h"}
    assert groups.client_ids("g") == ["b"] and "h" not in groups.groups and groups.held_locks("g", 1) == {}
    assert groups.statistics()["disconnected"] == 2
    groups.heartbeat("b", b"b", data[:1], 1, connection=9)  # (b reconnected: its old connection's close drops nothing)
    assert groups.disconnected(8) == set() and groups.client_ids("g") == ["b"]
    groups.unregister("b", "g")
    assert groups.on_connection.table == {}  # (the index keeps nothing of members gone)


def test_a_producer_of_a_closed_connection_leaves_every_group():
    from actors.producers import ProducerGroups

    producers = ProducerGroups(120_000)
    producers.heartbeat("p", b"p", [{"groupName": "tx"}, {"groupName": "ty"}], 0, connection=5)
    producers.heartbeat("q", b"q", [{"groupName": "tx"}], 0, connection=6)
    producers.disconnected(5)
    assert producers.table() == {"tx": ["q"]} and producers.find("p") is None
    assert producers.statistics()["disconnected"] == 2
    producers.heartbeat("q", b"q", [{"groupName": "tx"}], 1, connection=7)
    producers.disconnected(6)
    assert producers.table() == {"tx": ["q"]}
    producers.expire(10**9)
    assert producers.on_connection.table == {}


def test_a_push_consumer_whose_connection_dropped_heartbeats_until_the_node_answers():
    """The node drops a member with its connection (and a restarted front knows no member): the
    member heartbeats again at once, until one is taken, not at its next interval (30 s)."""
    import asyncio

    from node.client.producer import SendError
    from node.client.push import AsyncPushConsumer

    async def main() -> list[str]:
        consumer = AsyncPushConsumer("tcp://127.0.0.1:1", "g")
        consumer.running = True
        asked = []

        async def ask(header: dict) -> dict:
            asked.append(header["code"])
            if len(asked) < 3:  # (the node not back yet)
                raise SendError("TIMEOUT", "no reply")
            return {"status": "OK"}

        consumer._ask = ask
        consumer._on_lost()
        consumer._on_lost()  # (one rejoin at a time)
        await asyncio.wait_for(consumer.rejoining, 5)
        consumer.running = False
        consumer._on_lost()  # (a consumer shut down does not)
        return asked

    assert asyncio.run(main()) == [34, 34, 34]


def test_a_subscription_made_after_start_is_heartbeated_at_once_and_rebalanced():
    """RocketMQ's subscribe after start sends its heartbeat at once; ours waited for the next
    heartbeat (30 s) before the node, and so the group, knew of the topic."""
    import asyncio

    from node.client.push import AsyncPushConsumer

    async def main() -> tuple[list, bool]:
        consumer = AsyncPushConsumer("tcp://127.0.0.1:1", "g")
        consumer.subscribe("Before")
        consumer.running, consumer.rebalance_wanted = True, asyncio.Event()
        beats = []

        async def ask(header: dict) -> dict:
            beats.append(sorted(s["topic"] for s in header["consumerDataSet"][0]["subscriptionDataSet"]))
            return {"status": "OK"}

        consumer._ask = ask
        consumer.subscribe("Later")
        await asyncio.wait_for(consumer.rebalance_wanted.wait(), 5)
        consumer.rebalance_wanted.clear()
        consumer.unsubscribe("Before")  # (RocketMQ's unsubscribe: its queues are given up at the rebalance)
        await asyncio.wait_for(consumer.rebalance_wanted.wait(), 5)
        return beats, consumer.rebalance_wanted.is_set()

    assert asyncio.run(main()) == ([["Before", "Later"], ["Later"]], True)
