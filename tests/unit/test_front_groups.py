"""The front's group shell over real sockets (a ROUTER on 127.0.0.1, its monitor, DEALER
clients): a client whose connection closes leaves its groups at once, and the rest are told."""

from __future__ import annotations

import time
from types import SimpleNamespace

import orjson
import pytest
import zmq

from actors.front_groups import FrontGroups, watch_connections
from node import protocol
from node.frames import recv_frames_sourced


@pytest.fixture
def front():
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    events = watch_connections(context, router)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    settings = SimpleNamespace(clientChannelExpiredTimeout=120_000, rebalanceLockMaxLiveTime=60_000)
    groups = FrontGroups(settings, router, events, "127.0.0.1:1", read=lambda *a: None)
    dealers = []

    def dealer() -> zmq.Socket:
        d = context.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.connect(f"tcp://127.0.0.1:{port}")
        dealers.append(d)
        return d

    yield SimpleNamespace(router=router, events=events, groups=groups, dealer=dealer)
    for d in dealers:
        d.close(0)
    events.close(0)
    router.close(0)
    context.term()


def beat(d: zmq.Socket, client_id: str, opaque: int = 1) -> None:
    header = {"code": protocol.HEART_BEAT, "opaque": opaque, "clientID": client_id,
              "consumerDataSet": [{"groupName": "g", "subscriptionDataSet": [{"topic": "T"}]}],
              "producerDataSet": [{"groupName": "pg"}]}
    d.send(orjson.dumps(header))


def serve_one(front) -> None:
    assert front.router.poll(5000)
    frames, source = recv_frames_sourced(front.router)
    front.groups.serve(frames[0], orjson.loads(frames[1]), source)


def until(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.01)


def test_a_closed_connections_consumers_and_producers_leave_and_the_group_is_told(front):
    a, b = front.dealer(), front.dealer()
    beat(a, "a")
    serve_one(front)
    beat(b, "b")
    serve_one(front)
    assert front.groups.consumers.client_ids("g") == ["a", "b"]
    assert a.poll(2000) and b.poll(2000)  # (their heartbeats' replies)
    a.recv(), b.recv()
    while b.poll(200):  # (the notice of b's joining)
        b.recv()
    a.close(0)  # (as a process killed -9: the kernel closes its socket)

    def gone() -> bool:
        front.groups.follow_connections()
        return front.groups.consumers.client_ids("g") == ["b"]

    until(gone)
    assert front.groups.producers.table() == {"pg": ["b"]}
    assert b.poll(2000) and orjson.loads(b.recv()) == {"code": protocol.NOTIFY_CONSUMER_IDS_CHANGED,
                                                       "consumerGroup": "g"}
    stats = front.groups.statistics()
    assert stats["consumerGroups"]["disconnected"] == 1 and stats["producerGroups"]["disconnected"] == 1
    c = front.dealer()  # (a new connection, maybe on a's fd again: a member as any other)
    beat(c, "c")
    serve_one(front)
    assert front.groups.consumers.client_ids("g") == ["b", "c"]


def test_a_storm_of_connections_does_not_stall_the_router_while_their_events_wait_unread(front):
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, 4000)
    port = front.router.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1]
    try:
        opened = []
        for _ in range(2500):  # (a monitor's default queue holds 1,000: ZeroMQ's I/O thread then blocks)
            d = context.socket(zmq.DEALER)
            d.setsockopt(zmq.LINGER, 0)
            d.connect(f"tcp://127.0.0.1:{port}")
            opened.append(d)
            if len(opened) > 200:  # (each connected a while: accepted, then closed)
                opened.pop(0).close()
        for d in opened:
            d.close()
        time.sleep(1)
        late = front.dealer()
        late.send(b"{}")
        assert front.router.poll(5000)
    finally:
        context.term()


def test_a_heartbeat_sent_before_its_connection_closed_makes_no_member(front):
    d = front.dealer()
    beat(d, "d")
    assert front.router.poll(5000)  # (queued at the front, not yet read)
    d.close(0)

    def closed() -> bool:  # (what `serve` reads first, read here till DISCONNECTED came)
        front.groups.follow_connections()
        return bool(front.groups.closed)

    until(closed)
    serve_one(front)
    assert front.groups.consumers.client_ids("g") == [] and front.groups.producers.table() == {}
    assert front.groups.statistics()["consumerGroups"]["staleHeartbeats"] == 1
