"""actors.links.WaitingOutbox: reads wait, in order and within bounds, for a pull worker that is
briefly absent, and are given back for refusal past their patience."""

from __future__ import annotations

import zmq

from actors.links import SocketOutbox, WaitingOutbox


class Gate:
    """An outbox whose consumer is there or not."""

    local = False

    def __init__(self):
        self.open, self.sent = False, []

    def send(self, item) -> bool:
        if self.open:
            self.sent.append(item)
        return self.open


def test_what_waits_goes_out_in_arrival_order_once_the_consumer_is_back():
    gate = Gate()
    out = WaitingOutbox(gate, limit=10, patience_s=2.0)
    assert all(out.send(i, now=0.0) for i in range(3))
    gate.open = True
    assert out.send(3, now=0.5)  # (behind those waiting, not ahead of them)
    assert gate.sent == [] and len(out.waiting) == 4
    assert out.retry(now=1.0) == [] and gate.sent == [0, 1, 2, 3]
    assert out.send(4, now=1.0) and gate.sent[-1] == 4 and not out.waiting
    assert out.statistics() == {"waiting": 0, "waited": 4, "expired": 0}


def test_past_its_patience_a_read_is_given_back_and_a_full_room_refuses():
    gate = Gate()
    out = WaitingOutbox(gate, limit=2, patience_s=2.0)
    assert out.send("a", now=0.0) and out.send("b", now=1.0)
    assert not out.send("c", now=1.0)  # full
    assert out.retry(now=1.9) == []
    assert out.retry(now=2.0) == ["a"]
    assert out.retry(now=3.5) == ["b"] and not out.waiting
    assert out.statistics()["expired"] == 2


def test_a_push_socket_with_no_worker_makes_reads_wait_until_one_connects(tmp_path):
    context = zmq.Context()
    endpoint = f"ipc://{tmp_path}/pulls"
    push = context.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDTIMEO, 0)
    push.bind(endpoint)
    out = WaitingOutbox(SocketOutbox(push, lambda item: [item]), limit=10, patience_s=5.0)
    try:
        assert out.send(b"read", now=0.0) and len(out.waiting) == 1
        pull = context.socket(zmq.PULL)
        pull.connect(endpoint)
        for _ in range(200):  # (the connection completes on ZeroMQ's I/O thread)
            if not out.retry(now=0.0) and not out.waiting:
                break
            pull.poll(10)
        assert pull.poll(1000) and pull.recv() == b"read"
        pull.close(0)
    finally:
        push.close(0)
        context.term()
