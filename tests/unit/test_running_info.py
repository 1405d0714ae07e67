"""The node's asks of clients (actors.client_asks: GET_CONSUMER_RUNNING_INFO's waiting table) and
a push consumer's rates over the last minute (node.client.running_info.ConsumeStats), with a
mock clock."""

from __future__ import annotations

import pytest

from actors.client_asks import ClientAsks
from shm.invariant import InvariantBroken
from node.client.running_info import ConsumeStats, thread_stacks


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ask(asks: ClientAsks, asker: bytes, opaque, member: bytes, client_id: str, now: int, timeout_ms: int,
        field: str = "runningInfo", header: dict | None = None) -> str | None:
    """The id of the ask made (None: the table is full)."""
    made = asks.ask(asker, opaque, member, client_id, now, timeout_ms, field, header or {"code": 307})
    return None if made is None else made.header["askId"]


def test_an_answer_counts_once_and_only_from_the_connection_asked():
    asks = ClientAsks()
    ask_id = ask(asks, b"admin", 7, b"member", "1.2.3.4@m", now=0, timeout_ms=500)
    assert asks.answer(ask_id, b"someone-else") is None  # a forger knows the id, not the connection
    answered = asks.answer(ask_id, b"member")
    assert (answered.asker, answered.opaque, answered.client_id) == (b"admin", 7, "1.2.3.4@m")
    assert asks.answer(ask_id, b"member") is None  # twice
    assert asks.answer("ask-999", b"member") is None and asks.answer(None, b"member") is None  # never asked
    assert asks.statistics() == {"waiting": 0, "asked": 1, "answered": 1, "timedOut": 0, "dropped": 4}


def test_asks_run_out_at_their_deadline_and_the_table_is_bounded():
    asks = ClientAsks(limit=2)
    first = ask(asks, b"a", 1, b"m", "c", now=0, timeout_ms=100)
    ask(asks, b"a", 2, b"m", "c", now=50, timeout_ms=100)
    assert ask(asks, b"a", 3, b"m", "c", now=50, timeout_ms=100) is None  # full: SYSTEM_BUSY
    assert asks.expire(99) == []
    assert [late.opaque for late in asks.expire(100)] == [1]
    assert asks.answer(first, b"m") is None  # (late: its admin was answered already)
    assert [late.opaque for late in asks.expire(150)] == [2] and not asks.waiting
    with pytest.raises(InvariantBroken):
        ask(asks, b"a", 4, b"m", "c", now=0, timeout_ms=0)


def test_a_direct_consumption_waits_for_its_read_and_the_node_may_answer_it_itself():
    asks = ClientAsks()
    header = {"code": 309, "msgId": "AB"}
    ask_id = ask(asks, b"admin", 1, b"member", "c", now=0, timeout_ms=100, field="consumeResult", header=header)
    assert asks.get(ask_id).header == header | {"askId": ask_id} and "askId" not in header  # (the member's copy)
    assert asks.get(ask_id).answer_field == "consumeResult"
    assert asks.drop(ask_id).opaque == 1  # (its message not found: the node answers)
    assert asks.get(ask_id) is None and asks.drop(ask_id) is None and asks.answer(ask_id, b"member") is None


def test_rates_are_over_the_last_minute_and_failures_over_the_last_hour():
    clock = Clock()
    stats = ConsumeStats(clock)
    stats.pulled(32, 4.0)
    stats.pulled(28, 2.0)
    stats.consumed(50, 10, calls=60, rt_ms=120.0)
    assert stats.status() == {"pullTPS": 1.0, "pullRT": 3.0, "consumeOKTPS": round(50 / 60, 2),
                              "consumeFailedTPS": round(10 / 60, 2), "consumeRT": 2.0, "consumeFailedMsgs": 10}
    clock.now += 30
    stats.consumed(0, 5, calls=5, rt_ms=5.0)
    assert stats.status()["consumeFailedTPS"] == 0.25
    clock.now += 45  # the first second's bucket is past the minute, the failures not past the hour
    status = stats.status()
    assert (status["pullTPS"], status["consumeOKTPS"], status["consumeFailedTPS"]) == (0.0, 0.0, round(5 / 60, 2))
    assert status["consumeFailedMsgs"] == 15
    clock.now += 3700
    assert stats.status() == {"pullTPS": 0.0, "pullRT": 0.0, "consumeOKTPS": 0.0, "consumeFailedTPS": 0.0,
                              "consumeRT": 0.0, "consumeFailedMsgs": 0}


def test_the_stacks_name_each_thread_and_show_where_it_is():
    text = thread_stacks()
    assert '"MainThread"' in text and "test_the_stacks_name_each_thread_and_show_where_it_is" in text
