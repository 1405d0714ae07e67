"""actors.pop_core on a mock clock and an in-memory store: leases, acks, redelivery, DLQ,
orderly pops, change-invisible, and replay (the same state from the log as live)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.pop_core import EXPIRED, INVALID, MAX, OK, Entry, PopCore, PopRequest


class Log(list):
    def append(self, record) -> None:
        super().append(record)


class Store:
    """Queues of (offset, tag code) entries: offsets start at `low`."""

    def __init__(self, queues: int = 2, count: int = 10, low: int = 0):
        self.queues = {q: list(range(low, low + count)) for q in range(queues)}
        self.low = low
        self.tags: dict[tuple[int, int], int] = {}

    def read(self, topic, queue_id, offset, count, codes, match=None):
        offsets = self.queues[queue_id]
        low, high = (offsets[0] if offsets else self.low), (offsets[-1] + 1 if offsets else self.low)
        if count == 0:
            return [], offset, low, high
        if offset < low:
            return [], low, low, high
        found, at = [], offset
        while at < high and len(found) < count:
            if codes is None or self.tags.get((queue_id, at)) in codes:
                found.append(Entry(at, f"{queue_id}:{at}".encode(), 0))
            at += 1
        return found, at, low, high


class Clock:
    def __init__(self):
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def core(store=None, clock=None, log=None):
    store, clock, log = store or Store(), clock or Clock(), log if log is not None else Log()
    return PopCore(log, clock, store.read), store, clock, log


def request(max_count=32, invisible_ms=1000, queues=(0, 1), **kw):
    return PopRequest("g", "T", list(queues), max_count, invisible_ms, **kw)


def bodies(deliveries):
    return sorted(d.raw.decode() for d in deliveries)


def test_popped_messages_stay_invisible_until_their_time_then_come_back_once_more_counted():
    pop, _, clock, _ = core()
    first = pop.pop(request(max_count=5, queues=(0,)))
    assert bodies(first) == [f"0:{i}" for i in range(5)] and {d.reconsume_times for d in first} == {0}
    assert bodies(pop.pop(request(max_count=5, queues=(0,)))) == [f"0:{i}" for i in range(5, 10)]
    assert pop.pop(request(queues=(0,))) == []  # all in flight
    clock.now += 999
    assert pop.expire() == (set(), []) and pop.pop(request(queues=(0,))) == []
    clock.now += 1
    due, dead = pop.expire()
    assert due == {("g", "T")} and dead == []
    again = pop.pop(request(queues=(0,)))
    assert bodies(again) == [f"0:{i}" for i in range(10)] and {d.reconsume_times for d in again} == {1}


def test_an_ack_retires_and_a_stale_or_forged_handle_acks_nothing():
    pop, _, clock, _ = core()
    first = pop.pop(request(max_count=3, queues=(0,)))
    assert pop.ack("g", [first[0].handle]) == [OK]
    assert pop.ack("g", [first[0].handle]) == [EXPIRED]  # (acked already)
    ck, topic, queue, offset = first[1].handle.split(" ")
    ck, queue, offset = int(ck), int(queue), int(offset)
    forged = [f"{ck} {topic} {queue} {offset + 5}", f"{ck + 100} T 0 1", "1 T 0", "x y z w", 42, None,
              f"{ck} {topic} 1 {offset}", f"{ck} Other {queue} {offset}"]
    assert pop.ack("g", forged) == [INVALID] * len(forged)
    assert pop.ack("other-group", [first[1].handle]) == [INVALID]
    assert pop.queues[("g", "T", 0)].leases.keys() == {1, 2}
    clock.now += 1000
    assert pop.ack("g", [first[1].handle]) == [EXPIRED]  # its time has passed
    pop.expire()
    assert bodies(pop.pop(request(queues=(0,)))) == ["0:1", "0:2"] + [f"0:{i}" for i in range(3, 10)]


def test_low_moves_over_what_is_retired_in_any_order():
    pop, *_ = core()
    handed = pop.pop(request(max_count=4, queues=(0,)))
    pop.ack("g", [handed[2].handle, handed[1].handle])
    assert pop.queues[("g", "T", 0)].low == 0
    pop.ack("g", [handed[0].handle])
    assert pop.queues[("g", "T", 0)].low == 3 and pop.queues[("g", "T", 0)].retired == set()


def test_change_invisible_extends_and_shortens_and_the_old_handle_no_longer_holds():
    pop, _, clock, _ = core()
    a, b = pop.pop(request(max_count=2, queues=(0,)))
    status, longer, _ = pop.change_invisible("g", a.handle, 5000)
    status_b, shorter, _ = pop.change_invisible("g", b.handle, 10)
    assert status == status_b == OK
    assert pop.ack("g", [a.handle]) == [EXPIRED]
    clock.now += 10
    pop.expire()
    assert bodies(pop.pop(request(queues=(0,)))) == ["0:1"] + [f"0:{i}" for i in range(2, 10)]
    clock.now += 4000
    assert pop.ack("g", [longer]) == [OK]
    assert pop.change_invisible("g", shorter, 100)[0] == EXPIRED


def test_past_retry_max_a_message_goes_to_the_dlq_and_retires_once_stored():
    pop, _, clock, _ = core()
    pop.retry_max_of["g"] = 2
    for delivery in range(3):  # handed out 3 times: reconsumeTimes 0, 1, 2
        handed = pop.pop(request(max_count=1, queues=(0,)))
        assert [d.reconsume_times for d in handed] == [delivery]
        clock.now += 1000
        due, dead = pop.expire()
    assert dead == [(("g", "T", 0), 0)]
    assert pop.queues[("g", "T", 0)].dying == {0}
    pop.dead_lettered_done(dead)
    qs = pop.queues[("g", "T", 0)]
    assert qs.dying == set() and qs.low == 1 and pop.dead_lettered == 1


def test_orderly_pop_hands_a_queue_out_in_order_and_only_after_the_one_before_is_acked():
    pop, _, clock, _ = core()
    first = pop.pop(request(max_count=2, queues=(0,), orderly=True))
    assert bodies(first) == ["0:0", "0:1"]
    assert pop.pop(request(queues=(0,), orderly=True)) == []  # locked while any is in flight
    pop.ack("g", [first[1].handle])
    assert pop.pop(request(queues=(0,), orderly=True)) == []
    clock.now += 1000
    pop.expire()  # 0:0 ran out: it goes out again before anything newer, in offset order
    again = pop.pop(request(max_count=3, queues=(0,), orderly=True))
    assert [d.raw for d in again] == [b"0:0", b"0:2", b"0:3"]
    assert pop.pop(request(queues=(0,), orderly=True)) == []
    pop.ack("g", [d.handle for d in again])
    assert [d.raw for d in pop.pop(request(max_count=2, queues=(0,), orderly=True))] == [b"0:4", b"0:5"]


def test_a_queue_starts_at_the_committed_offset_else_its_min_or_its_max():
    store = Store(count=10, low=3)
    pop, *_ = core(store)
    assert bodies(pop.pop(request(max_count=2, queues=(0,), start={0: 7}))) == ["0:7", "0:8"]
    assert bodies(pop.pop(request(max_count=2, queues=(1,)))) == ["1:3", "1:4"]
    other = PopRequest("h", "T", [0], 5, 1000, init_mode=MAX)
    assert pop.pop(other) == [] and pop.queues[("h", "T", 0)].next == 13


def test_filtered_messages_retire_without_being_handed_out():
    store = Store(queues=1)
    store.tags = {(0, i): (1 if i % 2 else 2) for i in range(10)}
    pop, *_ = core(store)
    handed = pop.pop(request(max_count=32, queues=(0,), codes={1}))
    assert bodies(handed) == [f"0:{i}" for i in (1, 3, 5, 7, 9)]
    pop.ack("g", [d.handle for d in handed])
    assert pop.queues[("g", "T", 0)].low == 10


def test_any_queue_pops_spread_over_the_queues():
    pop, *_ = core(Store(queues=4, count=3))
    seen = [d.raw.split(b":")[0] for _ in range(4) for d in pop.pop(request(max_count=1, queues=(0, 1, 2, 3)))]
    assert sorted(seen) == [b"0", b"1", b"2", b"3"]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32))
def test_the_log_replayed_gives_the_state_it_was_made_from(seed):
    """Random pops, acks, changes, expiries, dead letters (some done only after a reset of their
    queue), resets and the group forgotten: a core rebuilt from the records
    (and from a snapshot taken half way and the records after it) holds the same state and
    answers the same handles the same way."""
    rng = random.Random(seed)
    store, clock, log = Store(queues=3, count=30), Clock(), Log()
    live, *_ = core(store, clock, log)
    live.retry_max_of["g"] = 2
    handles, snapshot, after, dying = [], None, 0, []
    for step in range(120):
        action = rng.random()
        if action < 0.015:
            queues, dropped = live.forget("g", rng.choice([None, "T"]))
            assert 0 <= queues <= 3 and dropped >= 0
        elif action < 0.05:
            queues, dropped = live.reset("g", "T", {q: rng.randint(0, 30) for q in rng.sample(range(3), rng.randint(1, 3))})
            assert 0 <= queues <= 3 and dropped >= 0
        elif action < 0.35:
            handles += [d.handle for d in live.pop(request(max_count=rng.randint(1, 5), queues=(0, 1, 2),
                                                           invisible_ms=rng.choice([10, 100, 1000])))]
        elif action < 0.6 and handles:
            live.ack("g", rng.sample(handles, min(len(handles), rng.randint(1, 3))))
        elif action < 0.7 and handles:
            status, new, _ = live.change_invisible("g", rng.choice(handles), rng.choice([1, 500]))
            handles += [new] if new else []
        else:
            clock.now += rng.choice([1, 50, 400])
            dying += live.expire()[1]
            if dying and rng.random() < 0.7:
                live.dead_lettered_done(dying)
                dying = []
        if step == 60:
            snapshot, after = live.snapshot(), len(log)
    for restored in (_replayed(None, list(log), store, clock), _replayed(snapshot, list(log[after:]), store, clock)):
        restored.retry_max_of["g"] = 2
        assert set(restored.queues) == set(live.queues)
        for key, qs in live.queues.items():
            other = restored.queues[key]
            assert (other.low, other.next, other.retired, other.times, other.reset_ck) == \
                   (qs.low, qs.next, qs.retired, qs.times, qs.reset_ck)
            assert set(other.leases) == set(qs.leases) | qs.dying | {o for o in qs.ready if _waiting(qs, o)}
            assert all(other.leases[o] == lease for o, lease in qs.leases.items())
        assert [restored.check("g", h)[0] for h in handles] == [live.check("g", h)[0] for h in handles]
        assert restored.next_ck == live.next_ck
        assert restored.in_flight == sum(len(qs.leases) for qs in restored.queues.values())
    assert live.in_flight == sum(len(qs.leases) for qs in live.queues.values())


def test_a_reset_starts_a_popped_queue_again_there_and_its_old_handles_expire():
    pop, *_ = core()
    first = pop.pop(request(max_count=5, queues=(0,)))
    pop.ack("g", [d.handle for d in first[:2]])
    assert pop.reset("g", "T", {0: 0, 1: 5}) == (1, 3)  # queue 1 never popped: its first pop starts at the committed
    assert pop.in_flight == 0 and pop.check("g", first[2].handle)[0] == EXPIRED
    again = pop.pop(request(max_count=3, queues=(0,)))
    assert bodies(again) == ["0:0", "0:1", "0:2"] and {d.reconsume_times for d in again} == {0}
    assert pop.ack("g", [first[3].handle, again[0].handle]) == [EXPIRED, OK]
    assert pop.reset("g", "T", {0: 8}) == (1, 2)  # forward: what lies before it is skipped
    assert bodies(pop.pop(request(queues=(0,)))) == ["0:8", "0:9"]
    qs = pop.queues[("g", "T", 0)]
    assert (qs.low, qs.next, pop.in_flight, pop.statistics()["queuesReset"]) == (8, 10, 2, 2)
    assert pop.reset("h", "T", {0: 0}) == (0, 0)  # a group that never popped: nothing of it


def test_a_deleted_group_or_topic_is_forgotten_and_popped_again_from_its_first_message():
    pop, store, clock, _ = core()
    pop.retry_max_of["g"] = 3
    handed = pop.pop(request(max_count=12, queues=(0, 1)))  # all 10 of queue 0, 2 of queue 1
    pop.pop(PopRequest("h", "T", [0], 2, 1000))
    pop.ack("g", [handed[0].handle])
    assert pop.forget(group="g") == (2, 11)
    assert set(pop.queues) == {("h", "T", 0)} and pop.in_flight == 2 and "g" not in pop.retry_max_of
    assert pop.progress() == [["h", "T", 0, 0]]  # (nothing of g's: its offsets went with it)
    assert pop.ack("g", [handed[1].handle]) == [INVALID]  # its old handles hold nothing
    again = pop.pop(request(max_count=3, queues=(0,)))
    assert bodies(again) == ["0:0", "0:1", "0:2"] and {d.reconsume_times for d in again} == {0}
    assert pop.ack("g", [handed[1].handle, again[1].handle]) == [EXPIRED, OK]
    clock.now += 5000
    due, dead = pop.expire()  # the forgotten leases' expiries find nothing
    assert due == {("g", "T"), ("h", "T")} and dead == [] and pop.in_flight == 0
    assert pop.forget(topic="T") == (2, 0) and pop.queues == {} and pop.statistics()["queuesForgotten"] == 4
    assert _replayed(None, list(pop.log), store, clock).queues == {}


def test_a_promoted_slave_takes_over_its_masters_state_cut_where_its_log_ends():
    """The master handed out queue 0's offsets 0-9 and retired 0-3, 5 and 8; the slave's log
    holds only 0-6 (its queue ends at 7). Taken over: what was in flight below 7 stays in
    flight, acked stays acked; from 7 on nothing is (new messages go there), and the master's
    later checkpoints name no lease."""
    pop, store, clock, log = core()
    handed = sorted(pop.pop(request(max_count=10, queues=(0,))), key=lambda d: d.raw)
    pop.ack("g", [handed[i].handle for i in (0, 1, 2, 3, 5, 8)])
    later = pop.change_invisible("g", handed[6].handle, 5000)[1]  # (a ck the copy may not have)
    slave_store = Store(queues=2, count=7)
    taken = _replayed(None, list(log), slave_store, clock)
    assert taken.fence(lambda topic, queue_id: 7 if queue_id == 0 else 10) == 2  # offsets 7 and 9 were in flight
    qs = taken.queues[("g", "T", 0)]
    assert (qs.low, qs.next, sorted(qs.leases), qs.retired) == (4, 7, [4, 6], {5})
    assert taken.in_flight == 2 and taken.next_ck > pop.next_ck + 1_000_000
    assert taken.check("g", later)[0] == OK  # (in the copy: it holds)
    assert taken.ack("g", [handed[4].handle]) == [OK]
    slave_store.queues[0] += [7, 8, 9]  # new messages where the master's 7-9 were
    assert bodies(taken.pop(request(queues=(0,)))) == ["0:7", "0:8", "0:9"]
    assert taken.progress() == [["g", "T", 0, 6]]  # (4 and 5 retired: 6 is in flight)


def test_progress_says_each_queue_whose_low_moved_once_and_every_queue_after_a_restart():
    pop, store, clock, log = core()
    handed = pop.pop(request(max_count=4, queues=(0,)))
    assert pop.progress() == [["g", "T", 0, 0]] and pop.progress() == []
    pop.ack("g", [handed[1].handle])  # out of order: nothing below it moves
    assert pop.progress() == []
    pop.ack("g", [handed[0].handle])
    pop.pop(request(max_count=1, queues=(1,)))
    assert pop.progress() == [["g", "T", 0, 2], ["g", "T", 1, 0]]
    pop.reset("g", "T", {1: 7})
    assert pop.progress() == [["g", "T", 1, 7]]
    restored = _replayed(pop.snapshot(), [], store, clock)
    assert restored.progress() == [["g", "T", 0, 2], ["g", "T", 1, 7]]


def test_a_message_dead_lettered_across_a_reset_is_not_retired_by_it():
    pop, _, clock, _ = core()
    pop.retry_max_of["g"] = 0
    pop.pop(request(max_count=1, queues=(0,)))
    clock.now += 1000
    _, dead = pop.expire()
    assert dead == [(("g", "T", 0), 0)]
    pop.reset("g", "T", {0: 0})  # while its re-put into the DLQ is on its way
    pop.dead_lettered_done(dead)
    assert pop.queues[("g", "T", 0)].low == 0 and pop.dead_lettered == 0
    assert bodies(pop.pop(request(max_count=1, queues=(0,)))) == ["0:0"]


def _waiting(qs, offset) -> bool:
    return offset not in qs.leases and offset >= qs.low and offset not in qs.retired and offset not in qs.dying


def _replayed(snapshot, records, store, clock) -> PopCore:
    restored = PopCore(Log(), clock, store.read)
    restored.restore(snapshot, records)
    return restored


def test_a_replayed_lease_whose_time_passed_during_the_crash_comes_back():
    pop, store, clock, log = core()
    handed = pop.pop(request(max_count=3, queues=(0,)))
    pop.ack("g", [handed[0].handle])
    clock.now += 5000  # the node was down
    restored = _replayed(None, list(log), store, clock)
    due, _ = restored.expire()
    assert due == {("g", "T")}
    assert bodies(restored.pop(request(queues=(0,)))) == ["0:1", "0:2"] + [f"0:{i}" for i in range(3, 10)]


@pytest.mark.parametrize("count", [0, 1, 5])
def test_peek_shows_what_comes_next_and_changes_nothing(count):
    pop, *_ = core()
    pop.pop(request(max_count=count, queues=(0,))) if count else None
    before = [list(log) for log in [pop.log]]
    seen = pop.peek(request(max_count=3, queues=(0,)))
    assert [e.offset for e in seen] == [count, count + 1, count + 2]
    assert [list(pop.log)] == before
