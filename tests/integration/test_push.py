"""Consumer groups end to end with real `mqnode start` processes and real member processes
(`mqnode consume --push`): the node's member table and locks over the wire, three members
consuming 30k messages (once each while the group is stable, none lost, a bounded few twice
around the changes) while one is stopped, one killed with -9 and one added,
broadcasting, orderly consumption across a crash, retries into the DLQ, and flow control;
request-reply (RocketMQ 4.6's), a push consumer answering what a Requester asks; and what an
admin asks of a member through the node (its running info, a message consumed directly)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest
import zmq
from nodes import ROOT, running_node

from node import protocol
from node.client import Message, Producer, PullConsumer, Requester, RequestTimeout, SendError
from node.client.push import CONSUME_SUCCESS, RECONSUME_LATER, SUSPEND_CURRENT_QUEUE_A_MOMENT, PushConsumer
from node.client.push_state import SUCCESS

pytestmark = pytest.mark.slow
EXPIRE_MS = 5000


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    yield from running_node(tmp_path_factory.mktemp("push"), clientChannelExpiredTimeout=EXPIRE_MS,
                            rebalanceLockMaxLiveTime=EXPIRE_MS, messageDelayLevel=" ".join(["1s"] * 18))


class Dealer:
    """A raw client: requests and the node's notifications on one DEALER."""

    def __init__(self, endpoint: str):
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self.notices, self.opaque = [], 0

    def ask(self, header: dict) -> dict:
        self.opaque += 1
        self.socket.send(orjson.dumps(header | {"opaque": self.opaque}))
        while self.socket.poll(5000):
            reply = orjson.loads(self.socket.recv_multipart()[0])
            if reply.get("opaque") == self.opaque:
                return reply
            self.notices.append(reply)
        raise TimeoutError(header)

    def notices_within(self, seconds: float) -> list[dict]:
        deadline = time.monotonic() + seconds
        while not self.notices and time.monotonic() < deadline:
            if self.socket.poll(100):
                self.notices.append(orjson.loads(self.socket.recv_multipart()[0]))
        found, self.notices = self.notices, []
        return found

    def close(self) -> None:
        self.socket.close(0)
        self.context.term()


def heartbeat(client: Dealer, client_id: str, group: str = "g1", topics=("T1",)) -> dict:
    data = {"groupName": group, "messageModel": "CLUSTERING", "consumeType": "CONSUME_PASSIVELY",
            "subscriptionDataSet": [{"topic": t, "subString": "*"} for t in topics]}
    return client.ask({"code": protocol.HEART_BEAT, "clientID": client_id, "consumerDataSet": [data]})


def test_members_are_listed_notified_expired_and_queues_locked_over_the_wire(node):
    a, b = Dealer(node.endpoint), Dealer(node.endpoint)
    try:
        assert heartbeat(a, "10.0.0.1@a")["status"] == "OK"
        assert heartbeat(b, "10.0.0.2@b")["status"] == "OK"
        assert a.notices_within(2) == [{"code": protocol.NOTIFY_CONSUMER_IDS_CHANGED, "consumerGroup": "g1"}]
        listed = a.ask({"code": protocol.GET_CONSUMER_LIST_BY_GROUP, "consumerGroup": "g1"})
        assert listed["consumerIdList"] == ["10.0.0.1@a", "10.0.0.2@b"]
        queues = [{"topic": "T1", "queueId": q} for q in range(3)]
        lock = {"code": protocol.LOCK_BATCH_MQ, "consumerGroup": "g1", "mqSet": queues}
        assert a.ask(lock | {"clientID": "10.0.0.1@a"})["lockOKMQSet"] == queues
        assert b.ask(lock | {"clientID": "10.0.0.2@b"})["lockOKMQSet"] == []
        shown = a.ask({"code": protocol.GET_CONSUMER_CONNECTION_LIST, "consumerGroup": "g1"})
        assert [c["clientId"] for c in shown["connectionSet"]] == ["10.0.0.1@a", "10.0.0.2@b"]
        assert {(lk["queueId"], lk["clientId"]) for lk in shown["locks"]} == {(q, "10.0.0.1@a") for q in range(3)}
        # a falls silent: after clientChannelExpiredTimeout it is dropped, b told, a's locks freed
        deadline = time.monotonic() + EXPIRE_MS / 1000 + 5
        while time.monotonic() < deadline:
            heartbeat(b, "10.0.0.2@b")
            if b.ask(listed_request := {"code": protocol.GET_CONSUMER_LIST_BY_GROUP,
                                        "consumerGroup": "g1"})["consumerIdList"] == ["10.0.0.2@b"]:
                break
            time.sleep(0.5)
        assert b.ask(listed_request)["consumerIdList"] == ["10.0.0.2@b"]
        assert any(n["code"] == protocol.NOTIFY_CONSUMER_IDS_CHANGED for n in b.notices_within(2) + b.notices)
        assert b.ask(lock | {"clientID": "10.0.0.2@b"})["lockOKMQSet"] == queues
        assert b.ask({"code": protocol.UNREGISTER_CLIENT, "clientID": "10.0.0.2@b", "consumerGroup": "g1"})["status"] == "OK"
        gone = b.ask({"code": protocol.GET_CONSUMER_CONNECTION_LIST, "consumerGroup": "g1"})
        assert gone["status"] == "CONSUMER_NOT_ONLINE"
        bad = a.ask({"code": protocol.HEART_BEAT, "clientID": "", "consumerDataSet": []})
        assert bad["status"] == "SYSTEM_ERROR" and "clientID" in bad["remark"]
    finally:
        a.close()
        b.close()


# -- members as processes ----------------------------------------------------------------------------


class Member:
    """`mqnode consume --push` in its own process; its JSON lines collected by a thread."""

    def __init__(self, node, group: str, topic: str, name: str, *extra: str):
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, "-m", "node.tools.cli", "consume", "--push", "--endpoint", node.endpoint, "--group", group,
             "--topic", topic, "--timeout", "600", "--instance-name", name, *extra],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self.lines: list[dict] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(orjson.loads(line))

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(30) == 0, self.process.stderr.read().decode()[-2000:]
        self.reader.join(10)

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self.reader.join(10)


def wait_for_members(node, group: str, names: list[str], queues: int, timeout: float = 30.0) -> None:
    """Until the group is exactly `names`, every member saying it consumes its share."""
    client = Dealer(node.endpoint)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            shown = client.ask({"code": protocol.GET_CONSUMER_CONNECTION_LIST, "consumerGroup": group})
            members = shown.get("connectionSet", [])
            ids = sorted(m["clientId"].split("@")[1] for m in members)
            held = sum(len([q for q in m["queues"] if not q["topic"].startswith("%")]) for m in members)
            if ids == sorted(names) and held == queues:
                return
            time.sleep(0.2)
        raise TimeoutError(f"group {group} did not settle on {names}: {shown}")
    finally:
        client.close()


def produce(node, topic: str, start: int, count: int) -> None:
    with Producer(node.endpoint) as producer:
        for first in range(start, start + count, 100):
            queue = (first // 100) % 8
            producer.send_batch(topic, [Message(topic, f"{i}".encode()) for i in range(first, first + 100)],
                                queue_id=queue)


def consumed(members) -> Counter:
    return Counter(int(line["body"]) for m in members for line in m.lines)


def wait_until_consumed(members, total: int, timeout: float = 60.0) -> Counter:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        counts = consumed(members)
        if len(counts) >= total:
            return counts
        time.sleep(0.2)
    return consumed(members)


def test_three_members_consume_30k_losing_none_through_a_stop_a_kill_and_a_join(node):
    topic, group = "Orders30k", "billing"
    produce(node, topic, 0, 100)  # the topic exists (8 queues) before anyone subscribes
    members = [Member(node, group, topic, f"m{i}", "--from", "first") for i in range(3)]
    everyone = list(members)
    try:
        wait_for_members(node, group, ["m0", "m1", "m2"], 8)
        produce(node, topic, 100, 9900)  # stable membership: not one duplicate of these
        counts = wait_until_consumed(everyone, 10_000)
        # (the first 100, consumed while the members joined, may repeat what was in flight then)
        assert len(counts) == 10_000 and max(counts[n] for n in range(100, 10_000)) == 1, counts.most_common(3)
        shown = subprocess.run([sys.executable, "-m", "node.tools.cli", "admin", "group", "--group", group, "--endpoint",
                                node.endpoint], cwd=ROOT, capture_output=True, text=True, timeout=60)
        view = orjson.loads(shown.stdout)
        assert sorted(m["clientId"].split("@")[1] for m in view["members"]) == ["m0", "m1", "m2"]
        assert sorted(q for m in view["members"] for q in m["queues"] if q.startswith(topic)) == \
            [f"{topic}@{q}" for q in range(8)]
        assert set(view["lag"]) >= {f"{topic}@{q}" for q in range(8)}
        members[0].stop()  # leaves cleanly: unregisters, commits
        wait_for_members(node, group, ["m1", "m2"], 8)
        produce(node, topic, 10_000, 10_000)
        members[1].kill()  # kill -9: dropped as its connection closes (not after clientChannelExpiredTimeout)
        wait_for_members(node, group, ["m2"], 8, timeout=EXPIRE_MS / 1000 / 2)
        members.append(Member(node, group, topic, "m3", "--from", "first"))
        everyone.append(members[-1])
        wait_for_members(node, group, ["m2", "m3"], 8, timeout=EXPIRE_MS / 1000 + 30)
        produce(node, topic, 20_000, 10_000)
        counts = wait_until_consumed(everyone, 30_000)
        assert sorted(counts) == list(range(30_000)), f"lost: {sorted(set(range(30_000)) - set(counts))[:20]}"
        # duplicates only around the changes (what a member had consumed but not yet committed when
        # its queues moved): a bounded few, where the stable first phase had none
        duplicates = sum(c - 1 for c in counts.values())
        assert duplicates <= 3_000, counts.most_common(5)
    finally:
        for member in members[1:]:
            if member.process.poll() is None:
                member.stop()


def test_the_group_table_is_learnt_again_after_a_kill_9_of_the_front(node):
    topic, group = "Restarts", "survivors"
    produce(node, topic, 0, 800)
    members = [Member(node, group, topic, f"r{i}", "--from", "first") for i in range(2)]
    try:
        wait_for_members(node, group, ["r0", "r1"], 8)
        assert len(wait_until_consumed(members, 800)) == 800
        node.actor_process("front").kill()  # the member table was in its memory
        time.sleep(1.0)
        wait_for_members(node, group, ["r0", "r1"], 8, timeout=60)  # their next heartbeats
        produce(node, topic, 800, 800)
        counts = wait_until_consumed(members, 1600)
        assert sorted(counts) == list(range(1600))
    finally:
        for member in members:
            member.stop()


def test_a_long_poll_held_when_the_front_dies_fails_at_once_and_the_next_pull_is_answered(node):
    """The front holding a 15 s long poll is killed: the client hears the connection drop and
    fails the pull within seconds (not after 15 s and its timeout), and its next pull reaches
    the restarted front."""
    produce(node, "Quiet", 0, 100)  # queue 0 holds offsets 0..99
    with PullConsumer(node.endpoint, timeout=5.0) as consumer:
        threading.Timer(1.0, lambda: node.actor_process("front").kill()).start()
        started = time.monotonic()
        with pytest.raises(SendError) as lost:
            consumer.pull("Quiet", 0, 100, suspend_ms=15_000)
        assert lost.value.status == "TIMEOUT" and "dropped" in lost.value.remark
        assert time.monotonic() - started < 5.0
        with Producer(node.endpoint, timeout=10.0) as producer:  # ... to the restarted front
            producer.send_batch("Quiet", [Message("Quiet", f"{i}".encode()) for i in range(100, 103)], queue_id=0)
        assert [m.body for m in consumer.pull("Quiet", 0, 100, max_count=3).messages] == [b"100", b"101", b"102"]


def test_a_pull_sent_while_the_pull_worker_restarts_waits_for_it_and_is_answered(node):
    """Every pull worker is killed: the front leaves a read in a worker's ring (shm.ring, which
    outlives the process) instead of refusing it, and the worker back, opening the same ring,
    answers it."""
    produce(node, "Patient", 0, 10)
    if node.settings.topology != "split":
        pytest.skip("the read service is the front's own shell in compact")
    workers = [node.actor_process(label) for label in node.actor_labels() if label.startswith("pull-")]
    for worker in workers:
        worker.kill()
    for worker in workers:
        worker.wait(10)
    with PullConsumer(node.endpoint, timeout=10.0) as consumer:
        assert [m.body for m in consumer.pull("Patient", 0, 0, max_count=3).messages] == [b"0", b"1", b"2"]


def test_broadcasting_gives_every_member_every_message_and_a_restart_goes_on_from_its_file(node, tmp_path):
    topic = "Broadcast"
    produce(node, topic, 0, 800)
    store = ["--broadcast", "--from", "first", "--offset-store-dir", str(tmp_path)]
    members = [Member(node, "radio", topic, f"b{i}", *store) for i in range(2)]
    try:
        for member in members:
            assert len(wait_until_consumed([member], 800)) == 800
        members[0].stop()
        produce(node, topic, 800, 800)
        assert len(wait_until_consumed([members[1]], 1600)) == 1600
        again = Member(node, "radio", topic, "b0", *store)  # the same client id: its offsets file
        members.append(again)
        seen = wait_until_consumed([again], 800)
        assert sorted(seen) == list(range(800, 1600))
    finally:
        for member in members[1:]:
            member.stop()


def test_a_group_from_a_time_gets_what_was_stored_at_or_after_it_and_nothing_before(node):
    """CONSUME_FROM_TIMESTAMP (`consume --push --from-time`): each queue from its first message
    stored at or after the time; queues 0 and 1, all older, give nothing (RocketMQ 4.9 started at
    the nearest message, there the last older one)."""
    topic = "FromTime"
    produce(node, topic, 0, 200)  # queues 0 and 1
    time.sleep(0.05)
    at = int(time.time() * 1000)
    time.sleep(0.05)
    produce(node, topic, 200, 100)  # queue 2
    member = Member(node, "from-time", topic, "t0", "--from-time", str(at))
    try:
        assert sorted(wait_until_consumed([member], 100)) == list(range(200, 300))
        time.sleep(1)  # (and nothing older comes)
        assert sorted(consumed([member])) == list(range(200, 300))
    finally:
        member.stop()
    pulled = subprocess.run([sys.executable, "-m", "node.tools.cli", "consume", "--endpoint", node.endpoint, "--topic",
                             topic, "--group", "from-time-pull", "--from-time", str(at), "--timeout", "1"],
                            cwd=ROOT, capture_output=True, timeout=60, check=True)
    assert sorted(int(orjson.loads(line)["body"]) for line in pulled.stdout.splitlines()) == list(range(200, 300))


def test_orderly_consumption_keeps_each_queues_order_across_a_crash(node):
    topic, group = "Ordered", "sequencer"
    produce(node, topic, 0, 800)
    first = Member(node, group, topic, "o0", "--orderly", "--from", "first")
    second = Member(node, group, topic, "o1", "--orderly", "--from", "first")
    try:
        wait_for_members(node, group, ["o0", "o1"], 8)
        produce(node, topic, 800, 7200)
        time.sleep(1.0)
        first.kill()  # its locks lapse after rebalanceLockMaxLiveTime; o1 takes its queues over
        counts = wait_until_consumed([first, second], 8000, timeout=90)
        assert sorted(counts) == list(range(8000))
        seen = {}
        for member in (first, second):
            seen[member] = per_queue = defaultdict(list)
            for line in member.lines:
                per_queue[line["queueId"]].append(line["queueOffset"])
        for member, other in ((first, second), (second, first)):
            for queue, offsets in seen[member].items():
                # each member saw each of its queues in order, in runs from where it took the queue
                # (the committed offset: a takeover may repeat what the other had consumed, never
                # reorder it); a run that starts further on is the queue coming back after the
                # other member had it (a member alone at first lends it on when the other joins),
                # and the other consumed the gap
                breaks = [(a, b) for a, b in zip(offsets, offsets[1:]) if b != a + 1]
                assert len(breaks) <= 2, (queue, breaks)
                theirs = set(seen[other].get(queue, ()))
                assert all(b <= a or set(range(a + 1, b)) <= theirs for a, b in breaks), (queue, breaks)
    finally:
        second.stop()


def test_reconsume_later_goes_to_retry_then_to_the_dead_letter_queue(node):
    topic, group = "Flaky", "retrying"
    produce(node, topic, 0, 100)
    seen = Counter()
    consumer = PushConsumer(node.endpoint, group, consume_from_where="FIRST_OFFSET", max_reconsume_times=2,
                            rebalance_interval=1.0)
    consumer.subscribe(topic)

    def listener(messages):
        for message in messages:
            seen[message.body] += 1
        return RECONSUME_LATER if messages[0].body == b"7" else CONSUME_SUCCESS

    consumer.register_listener(listener)
    consumer.start()
    try:
        deadline = time.monotonic() + 40
        while seen[b"7"] < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert seen[b"7"] == 3  # the first try and two retries, each after its level's delay
        assert all(seen[str(i).encode()] == 1 for i in range(100) if i != 7)
        with Producer(node.endpoint) as client:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                reply, _ = client.request({"code": protocol.GET_MAX_OFFSET, "topic": f"%DLQ%{group}", "queueId": 0})
                if reply.get("offset") == 1:
                    break
                time.sleep(0.2)
        assert reply["offset"] == 1  # then the dead-letter queue
    finally:
        consumer.shutdown()


@pytest.mark.parametrize("orderly", [False, True], ids=["concurrent", "orderly"])
def test_a_listener_returning_the_other_kinds_success_consumes_each_message_once(node, orderly, caplog):
    """SUCCESS and CONSUME_SUCCESS are exported side by side: a concurrent listener returning
    orderly's SUCCESS had every message sent back and consumed again (a soak: each twice and more),
    an orderly one returning CONSUME_SUCCESS had each queue suspended and its batch retried. Either
    success is a success; None is a failure (RocketMQ's null), said once."""
    topic, group = f"Statuses{int(orderly)}", f"statuses{int(orderly)}"
    produce(node, topic, 0, 40)
    seen = Counter()
    consumer = PushConsumer(node.endpoint, group, consume_from_where="FIRST_OFFSET", max_reconsume_times=1,
                            rebalance_interval=1.0, suspend_current_queue_time_millis=100)
    consumer.subscribe(topic)

    def listener(messages):
        seen[messages[0].body] += 1
        if messages[0].body == b"7" and seen[b"7"] == 1:
            return None  # (a listener that forgot its return)
        return CONSUME_SUCCESS if orderly else SUCCESS

    consumer.register_listener(listener, orderly=orderly)
    consumer.start()
    try:
        deadline = time.monotonic() + 30
        while (len(seen) < 40 or seen[b"7"] < 2) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.5)  # (the others, had they failed, come back with 7: orderly after 100 ms, sent back after its level)
        assert seen[b"7"] == 2 and all(seen[str(i).encode()] == 1 for i in range(40) if i != 7), seen
    finally:
        consumer.shutdown()
    said = [r.getMessage() for r in caplog.records if "a listener returned None" in r.getMessage()]
    assert len(said) == 1, said


def test_a_group_no_node_takes_is_refused_at_once_and_a_refused_heartbeat_is_said(node, caplog):
    """RocketMQ's clients check the group at their start (Validators.checkGroup): a PushConsumer or
    PopConsumer of a group every node refuses raises ValueError. Before, it started and consumed
    nothing in silence: the node refused its heartbeats and its looks at the group, and the
    client tried again forever without a word. A refusal is now said once (here forced past the
    client's own check)."""
    from node.client import PopConsumer

    for bad in ("bad group!", "g" * 256):
        with pytest.raises(ValueError, match="consumer group"):
            PushConsumer(node.endpoint, bad)
        with pytest.raises(ValueError, match="consumer group"):
            PopConsumer(node.endpoint, bad)
    consumer = PushConsumer(node.endpoint, "refused", rebalance_interval=0.3)
    consumer.inner.group = "refused group"  # (what the node refuses: as an account the ACL denies would be)
    consumer.subscribe("Refused")
    consumer.register_listener(lambda messages: CONSUME_SUCCESS)
    with caplog.at_level(logging.WARNING, logger="mqnode.push"):
        consumer.start()
        try:
            time.sleep(1.5)  # (several rebalances, each refused)
        finally:
            consumer.shutdown()
    said = [r.getMessage() for r in caplog.records if r.name == "mqnode.push"]
    assert sum("heartbeats of group refused group are refused: SYSTEM_ERROR" in line for line in said) == 1, said
    assert sum("group refused group cannot rebalance: SYSTEM_ERROR" in line for line in said) == 1, said


def test_a_slow_listener_is_bounded_by_flow_control(node):
    topic = "Backlog"  # 1M messages: the consumer holds a bounded few of them
    with Producer(node.endpoint) as producer:
        for first in range(0, 1_000_000, 1000):
            producer.send_batch(topic, [b"x" * 16] * 1000, queue_id=(first // 1000) % 8)
    consumer = PushConsumer(node.endpoint, "slowpoke", consume_from_where="FIRST_OFFSET", consume_thread_max=2,
                            consume_thread_min=2, pull_threshold_for_queue=200)
    consumer.subscribe(topic)
    consumer.register_listener(lambda messages: time.sleep(0.001) or CONSUME_SUCCESS)
    consumer.start()
    try:
        peak = 0
        for _ in range(30):
            time.sleep(0.1)
            peak = max(peak, max(consumer.statistics()["cached"].values() or [0]))
        assert 0 < peak <= 200 + 32  # the threshold, and at most one pull beyond it
    finally:
        consumer.shutdown()


@pytest.mark.parametrize("orderly", [False, True])
def test_a_shutdown_leaves_what_is_buffered_and_what_it_fails_to_the_groups_next_member(node, orderly):
    """A shutdown waits for the listener's calls under way, not for all it has buffered (they ran
    first: a slow listener's backlog made a shutdown take its time for each); what is left, and
    what the listener fails once the consumer is stopping, is not committed nor sent back."""
    topic, group = f"Buffered{int(orderly)}", f"leavers{int(orderly)}"
    produce(node, topic, 0, 1600)
    seen, lock, stopping, late = Counter(), threading.Lock(), threading.Event(), Counter()
    ok, later = (SUCCESS, SUSPEND_CURRENT_QUEUE_A_MOMENT) if orderly else (CONSUME_SUCCESS, RECONSUME_LATER)

    def slow(messages):
        time.sleep(0.02)
        if stopping.is_set():
            late["calls"] += 1
            return later  # (a failure now: left to the next member, not to %RETRY%)
        with lock:
            seen.update(int(m.body) for m in messages)
        return ok

    first = PushConsumer(node.endpoint, group, consume_from_where="FIRST_OFFSET", consume_thread_max=2,
                         consume_thread_min=2)
    first.subscribe(topic)
    first.register_listener(slow, orderly=orderly)
    first.start()
    deadline = time.monotonic() + 30
    while sum(seen.values()) < 40 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert max(first.statistics()["cached"].values()) > 20  # (a backlog buffered)
    at_shutdown = sum(seen.values())
    stopping.set()
    first.shutdown()
    assert sum(seen.values()) - at_shutdown <= 4 and late["calls"] <= 8  # (the calls under way: it was a call
    # for every buffered message, a shutdown taking the listener's time for each)
    assert first.inner.sent_back == 0
    second = PushConsumer(node.endpoint, group, consume_from_where="FIRST_OFFSET")
    second.subscribe(topic)
    second.register_listener(lambda messages: (seen.update(int(m.body) for m in messages), ok)[1], orderly=orderly)
    second.start()
    try:
        deadline = time.monotonic() + 60
        while len(seen) < 1600 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        second.shutdown()
    assert set(seen) == set(range(1600))  # none lost
    with PullConsumer(node.endpoint) as reader:
        assert reader.max_offset(f"%RETRY%{group}", 0) == 0  # and nothing sent back


def test_mqnode_consume_push_prints_count_messages_and_the_next_run_goes_on_after_them(node):
    topic = "CountedPush"
    with Producer(node.endpoint) as producer:
        producer.send_batch(topic, [f"{i}".encode() for i in range(500)], queue_id=0)
    runs = []
    for _ in range(2):  # (a member holds what it has pulled: hundreds; it printed them all)
        # (one thread: with 20, a second pulled batch may be consumed beside the first, 37 before 8,
        # as RocketMQ's concurrent consumption promises no order)
        done = subprocess.run([sys.executable, "-m", "node.tools.cli", "consume", "--endpoint", node.endpoint,
                               "--topic", topic, "--group", "counted", "--push", "--count", "5", "--timeout", "20",
                               "--threads", "1"],
                              cwd=ROOT, capture_output=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        runs.append([int(orjson.loads(line)["body"]) for line in done.stdout.splitlines()])
    assert runs == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


def test_mqnode_consume_rides_through_a_front_restart_and_gets_every_message_once(node):
    """Pulls are idempotent: `mqnode consume` sends a pull the dropped connection lost again
    (the producer's backoff, up to its --timeout), so a front killed under it costs no message
    and repeats none."""
    topic = "RideThrough"
    produce(node, topic, 0, 1000)
    consume = subprocess.Popen([sys.executable, "-m", "node.tools.cli", "consume", "--endpoint", node.endpoint,
                                "--topic", topic, "--group", "riders", "--from", "first", "--count", "2000",
                                "--timeout", "30"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[dict] = []
    reader = threading.Thread(target=lambda: lines.extend(orjson.loads(line) for line in consume.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while len(lines) < 1000 and time.monotonic() < deadline:  # all of the first half: its pulls now wait
            time.sleep(0.05)
        assert len(lines) == 1000
        front = node.actor_process("front")
        front.kill()
        front.wait(10)
        with Producer(node.endpoint, timeout=10.0) as producer:  # the second half, to the restarted front
            for first in range(1000, 2000, 100):
                producer.send_batch(topic, [Message(topic, f"{i}".encode()) for i in range(first, first + 100)],
                                    queue_id=(first // 100) % 8)
        assert consume.wait(60) == 0, consume.stderr.read().decode()
    finally:
        consume.kill()
    reader.join(10)
    assert sorted(int(line["body"]) for line in lines) == list(range(2000))


# -- request-reply: a Requester asks, a push consumer's listener answers (Producer.send_reply) ------

REPLY_TOPIC = "DefaultCluster_REPLY_TOPIC"  # (brokerClusterName's default)


def pulled(node, topic: str, queue_id: int, count: int, timeout: float = 10.0) -> list:
    """A queue's messages, once the dispatcher has indexed at least `count` of them."""
    deadline = time.monotonic() + timeout
    with PullConsumer(node.endpoint) as consumer:
        while True:
            messages, offset = [], 0
            while batch := consumer.pull(topic, queue_id, offset, max_count=32).messages:
                messages += batch
                offset = batch[-1].queue_offset + 1
            if len(messages) >= count or time.monotonic() > deadline:
                return messages
            time.sleep(0.02)


def test_requests_get_the_replies_a_push_consumer_sends_each_its_own_and_the_replies_are_stored(node):
    """Twenty requests at once from one Requester, each answered by a PushConsumer's listener:
    each gets the reply to its own message (CORRELATION_ID), pushed to the requester's connection,
    and every reply is stored in the reply topic too (storeReplyMessageEnable)."""
    replier = Producer(node.endpoint)

    def listener(messages):
        for message in messages:
            replier.send_reply(message, b"re:" + message.body)
        return CONSUME_SUCCESS

    consumer = PushConsumer(node.endpoint, "RpcServers")
    consumer.subscribe("Rpc", "*")
    consumer.register_listener(listener)
    consumer.start()
    try:
        with Requester(node.endpoint, "RpcClients") as requester, ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(lambda i: requester.request("Rpc", f"q{i}", timeout=30), range(20)))
            assert requester.statistics() == {"waiting": 0, "replied": 20, "unmatched": 0, "timedOut": 0}
        asked = subprocess.run([sys.executable, "-m", "node.tools.cli", "produce", "--endpoint", node.endpoint,
                                "--topic", "Rpc", "--request", "--group", "RpcCli", "--timeout", "30"],
                               input="one\ntwo\n", capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert asked.returncode == 0, asked.stderr
        assert [orjson.loads(line)["body"] for line in asked.stdout.splitlines()] == ["re:one", "re:two"]
    finally:
        consumer.shutdown()
        replier.close()
    assert [a.body for a in answers] == [f"re:q{i}".encode() for i in range(20)]
    assert {a.topic for a in answers} == {REPLY_TOPIC}
    assert all(a.properties["MSG_TYPE"] == "reply" and "PUSH_REPLY_TIME" in a.properties
               and "ARRIVE_TIME" in a.properties for a in answers)
    stored = pulled(node, REPLY_TOPIC, 0, 20)
    assert {m.body for m in stored} >= {f"re:q{i}".encode() for i in range(20)}


def test_a_request_nobody_answers_times_out_and_its_late_reply_is_dropped(node):
    with Requester(node.endpoint, "RpcLate") as requester:
        began = time.monotonic()
        with pytest.raises(RequestTimeout, match="wait reply message timeout, 500 ms"):
            requester.request("RpcLate", b"late", timeout=0.5, queue_id=0)
        assert 0.45 < time.monotonic() - began < 5
        [asked] = pulled(node, "RpcLate", 0, 1)
        with Producer(node.endpoint) as replier:  # the requester is still connected: pushed, and dropped there
            assert replier.send_reply(asked, b"too late").status == "PUT_OK"
        deadline = time.monotonic() + 10
        while requester.statistics()["unmatched"] < 1:
            assert time.monotonic() < deadline, requester.statistics()
            time.sleep(0.02)
        assert requester.statistics()["timedOut"] == 1
    asked = subprocess.run([sys.executable, "-m", "node.tools.cli", "produce", "--endpoint", node.endpoint,
                            "--topic", "RpcLate", "--request", "--group", "RpcCli", "--timeout", "0.3"],
                           input="unanswered\n", capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert asked.returncode == 1 and orjson.loads(asked.stdout)["status"] == "REQUEST_TIMEOUT"


def test_a_reply_whose_requester_is_gone_is_refused_and_stored_all_the_same(node):
    with Requester(node.endpoint, "RpcGone") as requester:
        with pytest.raises(RequestTimeout):
            requester.request("RpcGone", b"asked", timeout=0.2, queue_id=0)
        gone = requester.inner.client_id
    [asked] = pulled(node, "RpcGone", 0, 1)
    with Producer(node.endpoint) as replier:
        with pytest.raises(SendError, match=f"channel of <{gone}> not found") as refused:
            replier.send_reply(asked, b"nobody waits")
        assert refused.value.status == "SYSTEM_ERROR"
        with pytest.raises(ValueError, match="REPLY_TO_CLIENT"):  # (a plain message is no request)
            replier.send_reply(Message("T", b"x"), b"x")
        header = {"code": protocol.SEND_REPLY_MESSAGE, "topic": REPLY_TOPIC, "queueId": 0, "bornTimestamp": 1,
                  "properties": {"MSG_TYPE": "reply"}}
        reply, _ = replier.request(header, b"to nobody")
        assert (reply["status"], reply["remark"]) == ("SYSTEM_ERROR", "reply message properties[REPLY_TO_CLIENT] is null")
        reply, _ = replier.request({**header, "topic": "bad topic!"}, b"x")
        assert reply["status"] == "MESSAGE_ILLEGAL"
    deadline = time.monotonic() + 10
    while not {b"nobody waits", b"to nobody"} <= {m.body for m in pulled(node, REPLY_TOPIC, 0, 0)}:
        assert time.monotonic() < deadline, "the refused replies were not stored"
        time.sleep(0.05)


def consumer_status(node, *args: str, ok: bool = True) -> dict:
    done = subprocess.run([sys.executable, "-m", "node.tools.cli", "admin", "consumer-status", *args,
                           "--endpoint", node.endpoint], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert (done.returncode == 0) == ok, done.stderr
    return orjson.loads(done.stdout) if ok else {"stderr": done.stderr}


def stuck_listener(release: threading.Event):
    def listener_stuck_in_a_call(messages):
        release.wait(30)
        return CONSUME_SUCCESS
    return listener_stuck_in_a_call


def test_consumer_status_shows_what_each_member_holds_and_where_its_listener_is_stuck(node):
    topic, group = "Stuck", "stuckgroup"
    with Producer(node.endpoint) as producer:
        producer.send_batch(topic, [b"m%d" % i for i in range(40)], queue_id=0)
    release = threading.Event()
    consumer = PushConsumer(node.endpoint, group, consume_from_where="FIRST_OFFSET", consume_thread_max=1,
                            consume_thread_min=1, instance_name="stuck")
    consumer.subscribe(topic)
    consumer.register_listener(stuck_listener(release))
    consumer.start()
    try:
        client_id = consumer.inner.client_id
        deadline = time.monotonic() + 10
        while consumer.statistics()["cached"].get(f"{topic}@0") != 40 and time.monotonic() < deadline:
            time.sleep(0.05)
        shown = consumer_status(node, "--group", group, "--stacks")
        info = shown["consumers"][client_id]
        assert shown["sameSubscription"] is True
        assert {"topic": topic, "subString": "*", "expressionType": "TAG"} in info["subscriptionSet"]
        queue = info["mqTable"][f"{topic}@0"]
        assert queue["cachedMsgCount"] == 40 and (queue["cachedMsgMinOffset"], queue["cachedMsgMaxOffset"]) == (0, 39)
        assert queue["commitOffset"] == 0 and queue["lastPullTimestamp"] > 0 and queue["droped"] is False
        assert info["properties"]["consumeThreadMax"] == "1" and info["properties"]["PROP_CONSUME_ORDERLY"] == "false"
        assert "listener_stuck_in_a_call" in info["jstack"] and "release.wait(30)" in info["jstack"]
        release.set()  # the listener goes on: the queue drains, the rates show it
        deadline = time.monotonic() + 10
        while consumer.statistics()["cached"].get(f"{topic}@0") and time.monotonic() < deadline:
            time.sleep(0.05)
        info = consumer_status(node, "--group", group, "--client-id", client_id)["consumers"][client_id]
        assert "jstack" not in info and info["mqTable"][f"{topic}@0"]["cachedMsgCount"] == 0
        status = info["statusTable"][topic]
        assert status["consumeOKTPS"] == round(40 / 60, 2) and status["consumeFailedMsgs"] == 0
    finally:
        release.set()
        consumer.shutdown()
    assert "not online" in consumer_status(node, "--group", group, "--client-id", client_id, ok=False)["stderr"]


@pytest.mark.parametrize("orderly", [False, True], ids=["concurrently", "orderly"])
def test_a_reset_while_the_group_runs_takes_its_members_back_and_their_own_position_does_not_undo_it(node, orderly):
    topic, group = f"Rewound{orderly:d}", f"rewinders{orderly:d}"
    with Producer(node.endpoint) as producer:
        producer.send_batch(topic, [b"r%d" % i for i in range(30)], queue_id=0)
    seen: list[bytes] = []
    consumer = PushConsumer(node.endpoint, group, consume_from_where="FIRST_OFFSET", instance_name="rewinder")
    consumer.subscribe(topic)
    done_status = SUCCESS if orderly else CONSUME_SUCCESS
    consumer.register_listener(lambda messages: seen.extend(m.body for m in messages) or done_status, orderly=orderly)
    consumer.start()
    try:
        deadline = time.monotonic() + 20
        while len(seen) < 30:
            assert time.monotonic() < deadline, f"{len(seen)} of 30 consumed"
            time.sleep(0.05)
        done = subprocess.run([sys.executable, "-m", "node.tools.cli", "admin", "reset-offset", "--group", group,
                               "--topic", topic, "--to", "first", "--endpoint", node.endpoint],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        assert orjson.loads(done.stdout)["membersNotified"] == 1
        deadline = time.monotonic() + 20
        while len(seen) < 60:  # every message again, from the first
            assert time.monotonic() < deadline, f"{len(seen) - 30} of 30 consumed again"
            time.sleep(0.05)
        assert sorted(seen[30:]) == sorted(b"r%d" % i for i in range(30))
        assert consumer.statistics()["resets"] == 1
    finally:
        consumer.shutdown()
    with PullConsumer(node.endpoint) as reader:
        assert reader.committed(group, topic, 0) == 30


def asked_of(member: Dealer) -> dict:
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        for notice in member.notices_within(0.2):
            if notice["code"] == protocol.GET_CONSUMER_RUNNING_INFO:
                return notice
    raise TimeoutError("the node asked the member nothing")


def test_a_member_that_does_not_answer_times_out_and_no_other_connection_can_answer_for_it(node):
    member, forger, admin = Dealer(node.endpoint), Dealer(node.endpoint), Dealer(node.endpoint)
    try:
        assert heartbeat(member, "10.0.0.9@mute", group="askgroup")["status"] == "OK"
        ask = {"code": protocol.GET_CONSUMER_RUNNING_INFO, "consumerGroup": "askgroup", "clientId": "10.0.0.9@mute",
               "timeoutMillis": 300}
        started = time.monotonic()
        admin.opaque += 1
        admin.socket.send(orjson.dumps(ask | {"opaque": admin.opaque}))
        asked = asked_of(member)  # the node's ask, over the member's own connection
        assert "opaque" not in asked and asked["clientId"] == "10.0.0.9@mute" and asked["jstackEnable"] is False
        forged = {"code": protocol.CLIENT_ANSWER, "askId": asked["askId"], "status": "OK", "runningInfo": {"x": 1}}
        forger.socket.send(orjson.dumps(forged))  # (no reply comes to an answer)
        reply = orjson.loads(admin.socket.recv_multipart()[0]) if admin.socket.poll(3000) else {}
        assert reply["status"] == "SYSTEM_ERROR" and "did not answer in time" in reply["remark"]
        assert 0.299 <= time.monotonic() - started < 2.5  # (the front counts whole milliseconds: up to 1 ms early)
        # the member's own answer counts, once
        ask_reply = {}
        admin.opaque += 1
        admin.socket.send(orjson.dumps(ask | {"opaque": admin.opaque, "timeoutMillis": 5000}))
        asked = asked_of(member)
        answer = {"code": protocol.CLIENT_ANSWER, "askId": asked["askId"], "status": "OK", "runningInfo": {"mine": 2}}
        member.socket.send(orjson.dumps(answer))
        member.socket.send(orjson.dumps(answer))  # (a second time: dropped)
        if admin.socket.poll(3000):
            ask_reply = orjson.loads(admin.socket.recv_multipart()[0])
        assert ask_reply["status"] == "OK" and ask_reply["runningInfo"] == {"mine": 2}
        assert admin.socket.poll(300) == 0
        assert forger.ask({"code": protocol.CLIENT_ANSWER, "status": "OK"})["status"] == "SYSTEM_ERROR"  # no askId
        with Producer(node.endpoint) as producer:
            stats = producer.request({"code": protocol.GET_BROKER_RUNTIME_INFO})[0]["actors"]["front"]
        assert stats["consumerAsks"]["timedOut"] >= 1 and stats["consumerAsks"]["dropped"] >= 2
    finally:
        for client in (member, forger, admin):
            client.close()


def consume_directly(node, msg_id: str, group: str, client_id: str) -> tuple[int, list[dict], str]:
    done = subprocess.run([sys.executable, "-m", "node.tools.cli", "query", "--msg-id", msg_id, "--group", group,
                           "--client-id", client_id, "--endpoint", node.endpoint],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    return done.returncode, [orjson.loads(line) for line in done.stdout.splitlines()], done.stderr


def test_a_stored_message_goes_to_a_members_listener_directly_and_only_the_verdict_comes_back(node):
    """queryMsgById -g -d (consumeMessageDirectly): a dead letter the listener now takes, and each
    way a listener can answer; nothing is committed or handed back for it."""
    topic, group = "Direct", "directgroup"
    with Producer(node.endpoint) as producer:
        sent = producer.send(topic, b"to the DLQ", queue_id=0)
    with PullConsumer(node.endpoint) as puller:
        stored = puller.view(sent.offset_msg_id)
        puller.send_back(stored, group, max_reconsume_times=0)  # straight to %DLQ%directgroup
        deadline = time.monotonic() + 10
        while puller.max_offset(f"%DLQ%{group}", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        dead = puller.pull(f"%DLQ%{group}", 0, 0).messages[0]
    answers, seen = iter([]), []

    def listener(messages):
        seen.append((messages[0].topic, messages[0].body))
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    consumer = PushConsumer(node.endpoint, group, consume_from_where="LAST_OFFSET", instance_name="direct")
    consumer.subscribe(topic)
    consumer.register_listener(listener)
    consumer.start()
    try:
        client_id = consumer.inner.client_id
        answers = iter([CONSUME_SUCCESS, RECONSUME_LATER, None, ValueError("bad row")])
        expected = [(0, "CR_SUCCESS", "CONSUME_SUCCESS"), (1, "CR_LATER", "RECONSUME_LATER"), (1, "CR_RETURN_NULL", ""),
                    (1, "CR_THROW_EXCEPTION", "ValueError: bad row")]
        for code, result, remark in expected:
            rc, lines, stderr = consume_directly(node, dead.offset_msg_id, group, client_id)
            assert rc == code, stderr
            assert lines[0]["body"] == "to the DLQ" and lines[0]["topic"] == f"%DLQ%{group}"
            assert lines[1]["consumeResult"] | {"spentTimeMills": 0} == {
                "order": False, "autoCommit": True, "consumeResult": result, "remark": remark, "spentTimeMills": 0}
        assert seen == [(f"%DLQ%{group}", b"to the DLQ")] * 4  # (as RocketMQ shows a dead letter: its own topic)
        with PullConsumer(node.endpoint) as puller:
            assert puller.max_offset(f"%RETRY%{group}", 0) == 0  # CR_LATER handed nothing back
            assert puller.committed(group, f"%DLQ%{group}", 0) is None
        admin = Dealer(node.endpoint)
        try:
            nowhere = dead.offset_msg_id[:16] + "00000000FFFFFF00"  # (this node's host, an offset past its end)
            ask = {"code": protocol.CONSUME_MESSAGE_DIRECTLY, "consumerGroup": group, "clientId": client_id,
                   "msgId": nowhere}
            assert admin.ask(ask)["status"] == "QUERY_NOT_FOUND"
            assert admin.ask(ask | {"clientId": "1.2.3.4@nobody"})["status"] == "CONSUMER_NOT_ONLINE"
            assert admin.ask(ask | {"msgId": "xyz"})["status"] == "SYSTEM_ERROR"
        finally:
            admin.close()
    finally:
        consumer.shutdown()


def test_every_blocking_client_made_and_closed_again_and_again_leaves_the_open_files_as_they_were(node):
    """An application that makes a client per task (a web handler, a script's loop) must not run
    out of open files: each blocking client closes its private event loop (its epoll and wake-up
    descriptors, five a client, outlived every close before: ~200 clients ended such a process
    at the default limit of 1,024) and its ZeroMQ context."""
    from node.client.pop_consumer import PopConsumer
    from node.client.transaction import COMMIT_MESSAGE, TransactionProducer

    topic = "FdChurn"
    with Producer(node.endpoint) as producer:
        producer.send(topic, b"first")

    def push(i: int) -> None:
        consumer = PushConsumer(node.endpoint, "FdPush", instance_name=f"fd-{i}")
        consumer.subscribe(topic)
        consumer.register_listener(lambda messages: CONSUME_SUCCESS)
        consumer.start().shutdown()

    def pop(i: int) -> None:
        consumer = PopConsumer(node.endpoint, "FdPop", wait_ms=100)  # (its shutdown waits for the pops out)
        consumer.subscribe(topic)
        consumer.register_listener(lambda messages: CONSUME_SUCCESS)
        consumer.start().shutdown()
        PopConsumer(node.endpoint, "FdPop").shutdown()  # (one never started)

    def transaction(i: int) -> None:
        with TransactionProducer(node.endpoint, "FdTx", execute=lambda m, a: COMMIT_MESSAGE,
                                 check=lambda m: COMMIT_MESSAGE) as producer:
            producer.send_in_transaction(topic, b"t")

    def requester(i: int) -> None:
        with Requester(node.endpoint, group="FdReq"):
            pass

    def pull(i: int) -> None:
        with PullConsumer(node.endpoint) as consumer:
            consumer.read_queues(topic)

    def send(i: int) -> None:
        with Producer(node.endpoint) as producer:
            producer.send(topic, b"x")

    def open_files() -> int:
        return len(os.listdir("/proc/self/fd"))

    def settled(before: int) -> int:
        """More open files than `before`, once ZeroMQ's reaper thread has closed the sockets' own
        descriptors (it does so after `close` returns; under the suite's load it lagged, 4 after 8)."""
        deadline = time.monotonic() + 5
        while open_files() - before > 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        return open_files() - before

    for make in (send, pull, push, pop, transaction, requester):
        make(-1)  # (what a first client opens once for the process: the shared ZeroMQ context)
        before = open_files()
        for i in range(8):
            make(i)
        assert settled(before) <= 2, f"{make.__name__}: {open_files() - before} more open files after 8"


def test_a_pull_consumer_makes_no_topic_and_a_send_that_makes_one_tells_its_subscribers(node):
    """A consume of a typo made the topic it named (a topic in every listing); a pull consumer's
    route ask now makes none. A send that makes a topic tells the groups subscribing it (a
    RocketMQ consumer started first, which makes no topic, consumes then, not at its next
    rebalance): here a raw member, subscribed before, is notified."""
    typo = subprocess.run([sys.executable, "-m", "node.tools.cli", "consume", "--endpoint", node.endpoint, "--topic",
                           "Typoed", "--group", "readers", "--timeout", "1"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert typo.returncode == 1 and "TOPIC_NOT_EXIST" in typo.stderr, typo.stderr
    with PullConsumer(node.endpoint) as consumer, pytest.raises(SendError, match="TOPIC_NOT_EXIST"):
        consumer.read_queues("Typoed")
    member = Dealer(node.endpoint)
    try:
        assert heartbeat(member, "10.0.0.9@early", "early", ["MadeLater"])["status"] == "OK"
        member.notices_within(1)
        with Producer(node.endpoint) as producer:
            topics = str(producer.request({"code": protocol.GET_ALL_TOPIC_CONFIG})[0])
            assert "Typoed" not in topics and "MadeLater" not in topics
            producer.send("MadeLater", b"first")
        assert {"code": protocol.NOTIFY_CONSUMER_IDS_CHANGED, "consumerGroup": "early"} in member.notices_within(5)
    finally:
        member.close()
