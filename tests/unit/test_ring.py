"""shm.ring: the write path's hand-offs between processes, and actors.links over it."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.wire import join_frames, split_frames
from shm import ring
from shm.invariant import InvariantBroken
from shm.ring import HEADER_SIZE, TAIL_SLOT, Ring, RingFull

CAPACITY = 4096


@pytest.fixture
def path(tmp_path):
    p = tmp_path / "t.ring"
    ring.create(p, CAPACITY)
    return p


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=700), max_size=60), st.integers(0, 2**32))
def test_messages_come_out_whole_and_in_order_across_wraps(tmp_path_factory, messages, seed):
    p = tmp_path_factory.mktemp("ring") / "r.ring"
    ring.create(p, CAPACITY)
    producer, consumer = Ring(p), Ring(p)
    rng = random.Random(seed)
    sent, received = [], []
    for message in messages:
        parts = [message[:len(message) // 2], message[len(message) // 2:]]
        try:
            producer.offer(parts)
            sent.append(message)
        except RingFull:
            received += consumer.take()
            producer.offer(parts)  # (room now: everything was taken)
            sent.append(message)
        if rng.random() < 0.3:
            received += consumer.take(limit=rng.randint(1, 2000))
    received += consumer.take()
    assert received == sent
    assert consumer.pending_bytes() == 0


def test_a_full_ring_refuses_until_the_consumer_takes(path):
    producer, consumer = Ring(path), Ring(path)
    count = 0
    with pytest.raises(RingFull):
        while True:
            producer.offer([bytes(500)])
            count += 1
    assert count == CAPACITY // 504  # a length and 500 bytes: 504, a multiple of 8
    assert producer.statistics()["full"] == 1
    assert len(consumer.take()) == count
    producer.offer([b"again"])
    assert consumer.take() == [b"again"]


def test_a_message_never_published_is_never_seen_and_its_space_is_reused(path):
    producer, consumer = Ring(path), Ring(path)
    producer.offer([b"first"])
    # a producer killed between writing its bytes and storing the tail: bytes, no tail
    tail = producer.slots[TAIL_SLOT]
    producer.data[tail % CAPACITY: tail % CAPACITY + 8] = b"\x05\x00\x00\x00torn"
    producer.close()
    assert consumer.take() == [b"first"]
    assert consumer.take() == []
    restarted = Ring(path)  # the restarted producer resumes at the published tail
    restarted.offer([b"second"])
    assert consumer.take() == [b"second"]


def test_counters_survive_either_side_reopening(path):
    producer, consumer = Ring(path), Ring(path)
    for i in range(20):
        producer.offer([str(i).encode() * 100])
    assert len(consumer.take(limit=600)) == 6  # whole messages until `limit` bytes are reached
    consumer.close()
    again = Ring(path)  # a restarted consumer goes on from the head it stored
    assert again.take()[0] == b"6" * 100


def test_damaged_counters_stop_the_process(path):
    producer = Ring(path)
    producer.slots[TAIL_SLOT] = CAPACITY * 3  # the tail more than a capacity past the head
    with pytest.raises(InvariantBroken):
        producer.offer([b"x"])
    with pytest.raises(InvariantBroken):
        Ring(path).take()


def test_a_file_that_is_not_a_ring_is_refused(tmp_path):
    p = tmp_path / "x.ring"
    p.write_bytes(bytes(HEADER_SIZE + CAPACITY))
    with pytest.raises(InvariantBroken):
        Ring(p)


def test_capacity_must_be_a_power_of_two(tmp_path):
    with pytest.raises(InvariantBroken):
        ring.create(tmp_path / "y.ring", 5000)


@given(st.lists(st.lists(st.binary(max_size=50), min_size=4, max_size=4), max_size=20))
def test_joined_frames_split_back(messages):
    assert split_frames(b"".join(join_frames(messages)), 4) == messages


def test_a_joined_message_cut_short_is_a_bug():
    data = b"".join(join_frames([[b"a", b"bb", b"ccc", b"dddd"]]))
    with pytest.raises(InvariantBroken):
        split_frames(data[:-2], 4)
    with pytest.raises(InvariantBroken):
        split_frames(data, 3)


def test_a_producer_rings_only_a_consumer_that_may_be_asleep(path):
    producer, consumer = Ring(path), Ring(path)
    assert not consumer.about_to_sleep()  # nothing waits: it may sleep ...
    producer.offer([b"one"])
    assert producer.consumer_may_sleep()  # ... so the producer rings
    assert consumer.take() == [b"one"]  # awake again
    producer.offer([b"two"])
    assert producer.consumer_may_sleep() is (not ring.FENCED)  # a busy consumer is not rung (with the fence)
    assert consumer.about_to_sleep()  # a message came meanwhile: it must not sleep
    assert consumer.take() == [b"two"]
