"""The dispatcher polls while records keep coming, and the writer stops waking it meanwhile; it
announces "queue grew" only while a reader holds pulls (actors.dispatcher): the compact front's
process (router, write and read shells in one host, the group commit on its thread) and a
dispatcher in this process, over a real store, their turns driven by hand."""

from __future__ import annotations

import shutil
import time

import orjson
import pytest
from helpers import small_settings

from actors import writer as writer_module
from actors.dispatcher import Dispatcher
from actors.wire import arrivals_from_wire
from node import protocol
from node.server import topology
from node.tools.local_node import free_port
from shm import ring
from shm.control_block import WATCHER_SLOTS, ControlBlock
from shm.ring import FENCED

BODY = b"x" * 100


class FrontProcess:
    """The compact front's process, its loop driven by hand: `router`, `writer`, `reads` (the
    read shell), the group commit on its thread."""

    def __init__(self, settings):
        self.ring_dir = ring.make_rings(settings)  # (the launcher's part: the rings to the pop and transaction services)
        front = next(p for p in topology.processes(settings) if p.label == "front")
        self.host = topology.build(front, settings, {"writer": {"queue_offsets": {}, "recovered_offset": 0}})
        self.host.start()
        self.router, self.writer, self.reads = self.host.members

    def write_turn(self) -> None:
        """The router ships what it routed; the write shell appends it and wakes whom it must."""
        if self.router.outgoing:
            self.router._ship_sends()
        self.writer.step(set())

    def read_turn(self, events=frozenset()) -> None:
        self.reads.step(set(events))

    def stop(self) -> None:
        self.host.stop()
        self.host.drain()
        self.host.close()
        shutil.rmtree(self.ring_dir, ignore_errors=True)


@pytest.fixture
def node_parts(tmp_path, request):
    """(front, dispatcher, control) sharing one store; `request.param` overrides settings."""
    port = free_port()
    overrides = dict(getattr(request, "param", {}))
    stale_watcher = overrides.pop("stale_watcher", False)
    settings = small_settings(tmp_path / "store", runDir=str(tmp_path / "run"), listen=f"tcp://127.0.0.1:{port}",
                              listenPort=port, mappedFileSizeCommitLog=1 << 20, topology="compact", **overrides)
    (tmp_path / "store").mkdir()
    control = ControlBlock(tmp_path / "store" / "control", create=True)
    control.publish_recovered(written=0, flushed=0, dispatched=0, min_offset=0)
    control.set_watching(1, stale_watcher)  # as a reader (pull-0) killed while holding pulls leaves it
    front = FrontProcess(settings)
    dispatcher = Dispatcher(settings)
    dispatcher.start()
    yield front, dispatcher, control
    front.stop()
    dispatcher.stop()
    dispatcher.drain()
    dispatcher.close()
    control.close()


def _send(front: FrontProcess, i: int, queue_id: int = 0) -> None:
    """One single-message send through the front's turn: route, append, answer, wake."""
    entry = {"topic": "PollTopic", "queueId": queue_id, "flag": 0, "bodySize": len(BODY), "bornTimestamp": 1,
             "properties": {"UNIQ_KEY": f"7F000001000000000000{i:012X}"}}
    frames = [orjson.dumps({"code": protocol.SEND_MESSAGES, "opaque": i, "messages": [entry]}), BODY]
    front.router._route(b"client", protocol.decode_request(frames), frames)
    front.write_turn()


def _wakes(front: FrontProcess) -> tuple[int, int]:
    stats = front.writer.core.statistics()
    return stats["dispatcherWakes"], stats["dispatcherWakesSkipped"]


@pytest.mark.parametrize("node_parts", [{"dispatcherPollHoldMillis": 2000}], indirect=True)
def test_a_polling_dispatcher_is_not_woken_and_still_dispatches_every_record(node_parts):
    front, dispatcher, control = node_parts
    _send(front, 1)
    assert _wakes(front) == (1, 0)  # nobody polls yet: the writer wakes the dispatcher
    dispatcher.turn()
    assert control.get("dispatched") == control.get("written") > 0
    promise = control.get("reput_polling_until")
    assert promise > time.monotonic_ns() + 1_000_000_000  # 2 s from its look

    for i in range(2, 6):
        _send(front, i)
        assert _wakes(front) == (1, i - 1)  # skipped: the dispatcher promised to look
        polls = dispatcher.statistics()["polls"]
        dispatcher.turn()  # no wake-up waits: it looks after dispatcherPollMillis, not POLL_MS
        assert dispatcher.statistics()["polls"] == polls + 1  # found by its own poll, not a wake or the timer
        assert control.get("dispatched") == control.get("written")
    assert control.get("reput_polling_until") > promise  # each find extends it, never shortens it


# a hold longer than a loaded machine's pause between two lines of the test (30 ms was not, with
# three test workers on two cores), short enough to poll out
@pytest.mark.parametrize("node_parts", [{"dispatcherPollHoldMillis": 500}], indirect=True)
def test_the_dispatcher_stops_polling_only_after_a_look_past_its_promise(node_parts):
    front, dispatcher, control = node_parts
    _send(front, 1)
    dispatcher.turn()
    _send(front, 2)  # skipped wake: only the promised looks can find it
    assert _wakes(front) == (1, 1)
    for _ in range(2000):  # bounded: 500 ms of polls of 1 ms or more
        if dispatcher.looked_ns >= dispatcher.polling_until:
            break
        dispatcher.turn()
    assert dispatcher.looked_ns >= control.get("reput_polling_until")
    assert control.get("dispatched") == control.get("written")
    time.sleep(0.002)
    _send(front, 3)  # the promise ran out: the writer wakes it again
    assert _wakes(front) == (2, 1)


@pytest.mark.parametrize("node_parts", [{"dispatcherPollHoldMillis": 0}], indirect=True)
def test_with_no_hold_every_writing_turn_wakes_the_dispatcher(node_parts):
    front, dispatcher, control = node_parts
    for i in range(1, 4):
        _send(front, i)
        dispatcher.turn()
    assert _wakes(front) == (3, 0)
    assert control.get("reput_polling_until") == 0
    assert control.get("dispatched") == control.get("written")


def test_a_promise_about_to_run_out_does_not_stop_the_wake(node_parts, monkeypatch):
    front, _, control = node_parts
    monkeypatch.setattr(writer_module, "WAKE_MARGIN_NS", 2_000_000_000)  # wide, so the send's own time is nothing
    control.set("reput_polling_until", time.monotonic_ns() + 1_000_000_000)  # inside the margin
    _send(front, 1)
    assert _wakes(front) == (1, 0)
    control.set("reput_polling_until", time.monotonic_ns() + 4_000_000_000)
    _send(front, 2)
    assert _wakes(front) == (1, 1)


@pytest.mark.parametrize("node_parts", [{"dispatcherPollHoldMillis": 2000}], indirect=True)
def test_a_pull_held_in_the_front_gets_the_wake_and_its_message_at_once(node_parts):
    front, dispatcher, control = node_parts
    _send(front, 1)
    dispatcher.turn()  # polling from here on: sends alone would not wake it
    pull = [orjson.dumps({"code": protocol.PULL_MESSAGE, "opaque": 99, "consumerGroup": "g", "topic": "PollTopic",
                          "queueId": 0, "queueOffset": 1, "suspend": True, "suspendTimeoutMillis": 5000})]
    front.router._route(b"consumer", protocol.decode_request(pull), pull)
    front.read_turn()
    assert front.reads.core.held_count == 1
    _send(front, 2)
    assert _wakes(front) == (2, 0)  # a consumer waits: woken, not left to the next poll
    dispatcher.turn()
    assert control.get("dispatched") == control.get("written")


@pytest.mark.parametrize("node_parts", [{"dispatcherPollHoldMillis": 2000}], indirect=True)
def test_a_pull_at_the_end_after_a_skipped_wake_waits_for_the_dispatcher_not_answering_nothing(node_parts):
    """Read your writes: the pull comes after PUT_OK of message 2, which the polling dispatcher
    has not indexed yet; "nothing new" would deny it, so the pull waits for the dispatcher."""
    front, dispatcher, control = node_parts
    _send(front, 1)
    dispatcher.turn()
    _send(front, 2)
    assert _wakes(front) == (1, 1)  # skipped: nobody waits, the dispatcher polls
    pull = [orjson.dumps({"code": protocol.PULL_MESSAGE, "opaque": 99, "consumerGroup": "g", "topic": "PollTopic",
                          "queueId": 0, "queueOffset": 1, "suspend": True, "suspendTimeoutMillis": 5000})]
    front.router._route(b"consumer", protocol.decode_request(pull), pull)
    front.read_turn()
    assert front.reads.core.held_count == 0 and len(front.reads.core.deferred) == 1  # deferred, not answered
    assert _replies_to(front, b"consumer") == []
    dispatcher.turn()  # its poll finds message 2
    front.read_turn()
    [(_, header, records)] = _replies_to(front, b"consumer")
    assert orjson.loads(header)["status"] == "FOUND" and records


def _replies_to(front: FrontProcess, client: bytes) -> list[tuple]:
    """The replies for `client` waiting on the router's links (the others are dropped)."""
    return [reply[1:] for replies in front.router.inbox.take() for reply in replies if reply[0] == client]


def _hold_pull(front: FrontProcess, offset: int) -> None:
    pull = [orjson.dumps({"code": protocol.PULL_MESSAGE, "opaque": 99, "consumerGroup": "g", "topic": "PollTopic",
                          "queueId": 0, "queueOffset": offset, "suspend": True, "suspendTimeoutMillis": 30000})]
    front.router._route(b"consumer", protocol.decode_request(pull), pull)
    front.read_turn()  # the read shell's turn: holds it, starts watching
    assert front.reads.core.held_count == 1


def _announcements(dispatcher: Dispatcher) -> tuple[int, int]:
    stats = dispatcher.statistics()
    return stats["announcements"], stats["announcementsHeld"]


def _await_arrivals(front: FrontProcess) -> None:
    """Turn the front's reads until its held pull is answered by an announcement (5 s at most)."""
    deadline = time.monotonic() + 5
    while front.reads.core.held_count and time.monotonic() < deadline:
        if front.reads.arrivals.poll(50):
            front.read_turn({front.reads.arrivals})


def test_nothing_is_announced_while_no_pull_is_held(node_parts):
    front, dispatcher, control = node_parts
    assert not control.watched()
    for i in range(1, 4):
        _send(front, i)
        dispatcher.turn()
    assert control.get("dispatched") == control.get("written")
    assert _announcements(dispatcher) == (0, 3)
    assert dispatcher.unannounced == {("PollTopic", 0): 3}  # one entry a queue, its latest max offset


def test_a_held_pull_is_watched_announced_to_and_answered(node_parts):
    front, dispatcher, control = node_parts
    time.sleep(0.5)  # the front's SUB reconnects to the dispatcher's PUB (PUB drops while none is there)
    _hold_pull(front, 0)
    assert control.watched()
    assert front.reads.arrivals.poll(0) == 0  # nothing stale: nothing was announced unwatched
    _send(front, 1)
    dispatcher.turn()
    assert _announcements(dispatcher) == (1, 0)
    _await_arrivals(front)
    assert front.reads.core.held_count == 0 and front.reads.core.statistics()["woken"] == 1
    front.read_turn()
    assert not control.watched()  # nothing held: no more announcements
    _send(front, 2)
    dispatcher.turn()
    assert _announcements(dispatcher) == (1, 1)


def test_what_a_reader_missed_by_a_stale_look_is_announced_once_it_is_seen_watching(node_parts):
    """The race the kept announcements cover: the dispatcher read no watcher after advancing
    `dispatched`, while the reader that had just set its slot read the old `dispatched`."""
    front, dispatcher, control = node_parts
    time.sleep(0.5)  # as above
    _send(front, 1)
    dispatcher.turn()  # reads no watcher: keeps the queue's new max offset
    assert _announcements(dispatcher) == (0, 1)
    header = {"code": protocol.PULL_MESSAGE, "opaque": 99, "consumerGroup": "g", "topic": "PollTopic",
              "queueId": 0, "queueOffset": 0, "suspend": True, "suspendTimeoutMillis": 30000}
    front.reads.core._hold("PollTopic", 0, header, b"consumer", 0)  # its look saw nothing (the old `dispatched`)
    front.reads.core.set_watching(True)
    dispatcher.turn()  # nothing new, a watcher seen: what it kept goes out
    assert _announcements(dispatcher) == (1, 1) and dispatcher.unannounced == {}
    _await_arrivals(front)
    assert front.reads.core.held_count == 0 and front.reads.core.statistics()["woken"] == 1


def test_kept_announcements_go_out_with_the_next_batch(node_parts):
    front, dispatcher, control = node_parts
    time.sleep(0.5)
    _send(front, 1)
    dispatcher.turn()
    control.set_watching(front.reads.core.watcher, True)
    _send(front, 2, queue_id=1)
    dispatcher.turn()
    assert _announcements(dispatcher) == (1, 1) and dispatcher.unannounced == {}
    raw = front.reads.arrivals.recv() if front.reads.arrivals.poll(5000) else b"\x00[]"
    assert sorted(arrivals_from_wire(raw)) == [("PollTopic", 0, 1), ("PollTopic", 1, 1)]


@pytest.mark.skipif(not FENCED, reason="without the C fence every announcement goes to every reader")
def test_a_reader_not_holding_pulls_is_sent_nothing_while_another_holds(node_parts):
    """Broadcast, a reader not watching had every announcement queued unread: ~80 MB in each
    pull worker of a node whose pop service held pops (actors.dispatcher)."""
    front, dispatcher, control = node_parts
    time.sleep(0.5)  # the front's SUB reconnects to the dispatcher's PUB (PUB drops while none is there)
    control.set_watching(WATCHER_SLOTS - 1, True)  # the pop service's slot: it holds pops
    for i in range(1, 4):
        _send(front, i)
        dispatcher.turn()
    assert _announcements(dispatcher) == (3, 0)
    assert front.reads.arrivals.poll(300) == 0  # the front's reader holds no pull: nothing came
    control.set_watching(front.reads.core.watcher, True)
    _send(front, 4)
    dispatcher.turn()
    raw = front.reads.arrivals.recv() if front.reads.arrivals.poll(5000) else b"\x00[]"
    assert arrivals_from_wire(raw) == [("PollTopic", 0, 4)]


@pytest.mark.parametrize("node_parts", [{"stale_watcher": True}], indirect=True)
def test_a_restarted_reader_clears_the_watcher_slot_its_predecessor_left(node_parts):
    front, dispatcher, control = node_parts
    assert not control.watched()
    _send(front, 1)
    dispatcher.turn()
    assert _announcements(dispatcher) == (0, 1)


def test_a_restart_clears_the_watchers_a_killed_reader_left(tmp_path):
    control = ControlBlock(tmp_path / "control", create=True)
    control.set_watching(0, True)
    control.set_watching(63, True)
    assert control.watched()
    control.publish_recovered(written=0, flushed=0, dispatched=0, min_offset=0)
    assert not control.watched()
    control.close()


@pytest.mark.parametrize("node_parts", [{"flushDiskType": "SYNC_FLUSH"}], indirect=True)
def test_a_sync_send_is_flushed_by_the_group_commit_thread_and_answered_through_the_router(node_parts):
    front, dispatcher, control = node_parts
    _hold_pull(front, 0)  # (the router's loop goes on serving meanwhile: nothing waits on fdatasync)
    _send(front, 1)
    assert front.writer.core.statistics()["putMessageTimesTotal"] == 1
    deadline = time.monotonic() + 5
    replies = []
    while not replies and time.monotonic() < deadline:
        time.sleep(0.01)
        replies = front.router.inbox.take()  # the group commit's replies, on its local link
    assert control.get("flushed") == control.get("written") > 0
    [[(client, _, header)]] = replies
    assert client == b"client" and orjson.loads(header)["status"] == "PUT_OK"
    assert front.host.threads[0].statistics()["answered"] == 1
