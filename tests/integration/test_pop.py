"""Pop consumption on a real node (docs/protocol.md "Pop"): invisible until acked, back when not,
retries into the DLQ, orderly pops, change-invisible, handles that do not hold, and the pop state
through kill -9 of the pop service, of a member and of the whole node."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import wait_until
from nodes import ROOT, NodeProcess, node_settings, running_node

from node import protocol
from node.client import Message, Producer, PullConsumer, SendError
from node.client.pop_consumer import CONSUME_SUCCESS, RECONSUME_LATER, PopConsumer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    yield from running_node(tmp_path_factory.mktemp("pop"))


@pytest.fixture(scope="module")
def consumer(node):
    with PullConsumer(node.endpoint) as client:
        yield client


def produce(node, topic: str, count: int, *, queues: int = 1, prefix: str = "m", tags: str | None = None) -> list[bytes]:
    bodies = [f"{prefix}{i}".encode() for i in range(count)]
    with Producer(node.endpoint, timeout=10.0) as producer:
        for queue in range(queues):
            mine = bodies[queue::queues]
            for at in range(0, len(mine), 256):
                producer.send_batch(topic, [Message(topic, body, tags=tags) for body in mine[at: at + 256]], queue_id=queue)
    return bodies


def pop_all(consumer, topic: str, group: str, *, want: int, invisible_ms: int = 60_000, within: float = 10.0, **kw):
    out, deadline = [], time.monotonic() + within
    while len(out) < want and time.monotonic() < deadline:
        try:
            out += consumer.pop(topic, group, max_count=min(64, want - len(out)), invisible_ms=invisible_ms,
                                wait_ms=200, **kw)
        except SendError as e:  # (the pop service restarting: the front held the pop 2 s for it)
            assert e.status in ("SYSTEM_BUSY", "TIMEOUT"), e
    return out


def test_popped_messages_come_back_after_their_invisible_time_and_not_before(node, consumer):
    bodies = produce(node, "PopBack", 40, queues=4)
    first = pop_all(consumer, "PopBack", "back", want=40, invisible_ms=2500)
    assert sorted(m.body for m in first) == sorted(bodies) and {m.reconsume_times for m in first} == {0}
    popped_at = time.monotonic()
    assert consumer.pop("PopBack", "back", wait_ms=1500, invisible_ms=2500) == []  # all invisible
    again = pop_all(consumer, "PopBack", "back", want=40, invisible_ms=60_000, within=10)
    assert time.monotonic() - popped_at >= 2.0  # (not before their time: 2.5 s from the pop, less the answers' way)
    assert sorted(m.body for m in again) == sorted(bodies) and {m.reconsume_times for m in again} == {1}
    assert all(consumer.ack_batch(again))


def test_an_ack_retires_and_a_handle_that_does_not_hold_acks_nothing(node, consumer):
    produce(node, "PopAck", 6)
    handed = pop_all(consumer, "PopAck", "acks", want=6, invisible_ms=1500)
    assert consumer.ack(handed[0]) is True
    assert consumer.ack(handed[0]) is False  # acked already: RECEIPT_HANDLE_EXPIRED
    ck, topic, queue, offset = handed[1].receipt_handle.split(" ")
    for forged in (f"{ck} {topic} {queue} {int(offset) + 1000}", f"{int(ck) + 10**6} {topic} {queue} {offset}",
                   "not a handle", f"{ck} {topic} {queue}"):
        with pytest.raises(SendError) as refused:
            consumer.ack(forged, "acks")
        assert refused.value.status in ("INVALID_RECEIPT_HANDLE", "SYSTEM_ERROR")
    with pytest.raises(SendError) as other:
        consumer.ack(handed[1].receipt_handle, "another-group")
    assert other.value.status == "INVALID_RECEIPT_HANDLE"
    assert consumer.ack_batch(handed[1:4]) == [True, True, True]
    time.sleep(1.6)
    assert consumer.ack(handed[4]) is False  # its invisible time passed
    back = pop_all(consumer, "PopAck", "acks", want=2)
    assert sorted(m.body for m in back) == [handed[4].body, handed[5].body]
    assert consumer.ack_batch(back) == [True, True]


def test_change_invisible_extends_and_shortens(node, consumer):
    produce(node, "PopChange", 2)
    a, b = pop_all(consumer, "PopChange", "change", want=2, invisible_ms=1500)
    old = a.receipt_handle
    consumer.change_invisible(a, 6000)  # longer: still invisible after its first 1.5 s
    assert a.receipt_handle != old and consumer.ack(old, "change") is False
    consumer.change_invisible(b, 1)  # shorter: visible at once
    back = pop_all(consumer, "PopChange", "change", want=1, invisible_ms=60_000)
    assert [m.body for m in back] == [b.body] and back[0].reconsume_times == 1
    time.sleep(2.0)
    assert consumer.pop("PopChange", "change", wait_ms=300) == []
    assert consumer.ack(a) is True and consumer.ack(back[0]) is True


def test_past_the_groups_retries_a_message_goes_to_the_dlq(node, consumer):
    with Producer(node.endpoint) as admin:
        reply, _ = admin.request({"code": protocol.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, "groupName": "dying",
                                  "retryMaxTimes": 2})
        assert reply["status"] == "OK"
    produce(node, "PopDie", 1, prefix="doomed")
    times = []
    for _ in range(3):  # handed out 3 times, never acked
        got = pop_all(consumer, "PopDie", "dying", want=1, invisible_ms=300, within=10)
        times += [m.reconsume_times for m in got]
    assert times == [0, 1, 2]
    deadline = time.monotonic() + 10
    while True:
        found = consumer.pull("%DLQ%dying", 0, 0) if _topic_exists(consumer) else None
        if found is not None and found.messages:
            break
        assert time.monotonic() < deadline, "never dead-lettered"
        time.sleep(0.2)
    assert [m.body for m in found.messages] == [b"doomed0"]
    assert consumer.pop("PopDie", "dying", wait_ms=800, invisible_ms=300) == []
    assert consumer.pop_state("dying")["PopDie"]["0"]["low"] == 1, consumer.pop_state("dying")


def _topic_exists(consumer) -> bool:
    try:
        consumer.max_offset("%DLQ%dying", 0)
        return True
    except SendError:
        return False


def test_orderly_pop_hands_out_a_queues_next_message_only_after_the_one_before_is_acked(node, consumer):
    produce(node, "PopOrder", 30, queues=2)
    seen: dict[int, list[bytes]] = {0: [], 1: []}
    first = consumer.pop("PopOrder", "orderly", max_count=4, queue_id=0, orderly=True, invisible_ms=800)
    assert [m.body for m in first] == [b"m0", b"m2", b"m4", b"m6"]
    assert consumer.pop("PopOrder", "orderly", queue_id=0, orderly=True, wait_ms=200) == []  # locked
    consumer.ack_batch(first[:2])  # the rest runs out: it comes back before anything newer
    time.sleep(1.0)
    again = consumer.pop("PopOrder", "orderly", max_count=3, queue_id=0, orderly=True, invisible_ms=60_000, wait_ms=500)
    assert [m.body for m in again] == [b"m4", b"m6", b"m8"] and [m.reconsume_times for m in again] == [1, 1, 0]
    consumer.ack_batch(again)
    deadline = time.monotonic() + 20
    while sum(map(len, seen.values())) < 24 and time.monotonic() < deadline:
        for m in consumer.pop("PopOrder", "orderly", max_count=5, orderly=True, wait_ms=200):
            seen[m.queue_id].append(m.body)
            consumer.ack(m)
    assert seen[0] == [f"m{i}".encode() for i in range(10, 30, 2)]
    assert seen[1] == [f"m{i}".encode() for i in range(1, 30, 2)][:len(seen[1])] and len(seen[1]) == 15


def test_a_pop_consumer_acks_what_its_listener_consumed_and_what_failed_comes_back(node):
    produce(node, "PopListen", 50, queues=4)
    got: Counter = Counter()
    failed_once: set[bytes] = set()

    def listener(messages):
        body = messages[0].body
        got[body] += 1
        if body.endswith(b"7") and body not in failed_once:
            failed_once.add(body)
            return RECONSUME_LATER
        return CONSUME_SUCCESS

    with PopConsumer(node.endpoint, "listeners", invisible_ms=60_000, reconsume_delay_ms=300, wait_ms=300) as member:
        member.subscribe("PopListen")
        member.register_listener(listener)
        member.start()
        deadline = time.monotonic() + 20
        while member.statistics()["acked"] < 50 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert member.statistics()["acked"] == 50
    assert set(got) == {f"m{i}".encode() for i in range(50)}
    assert {b for b, n in got.items() if n == 2} == failed_once and max(got.values()) == 2


def test_four_members_one_killed_lose_nothing_and_repeat_only_its_in_flight(node, tmp_path):
    """Four PopConsumer processes over 8 queues, one killed -9 mid-way: every message consumed;
    the only messages consumed twice are some the killed member had printed (consumed) but not
    acked."""
    bodies = set(produce(node, "PopFour", 4000, queues=8))
    members = [_member(node, "four", "PopFour", tmp_path / f"m{i}.out") for i in range(4)]
    try:
        deadline = time.monotonic() + 20
        while len(_lines(tmp_path / "m0.out")) < 200:
            assert time.monotonic() < deadline, "member 0 consumed nothing"
            time.sleep(0.02)
        members[0].kill()
        members[0].wait(10)
        deadline = time.monotonic() + 60
        while True:
            seen = [line for i in range(4) for line in _lines(tmp_path / f"m{i}.out")]
            if set(seen) >= bodies or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        for member in members[1:]:
            member.terminate()
            member.wait(20)
    killed = _lines(tmp_path / "m0.out")
    seen = [line for i in range(4) for line in _lines(tmp_path / f"m{i}.out")]
    assert set(seen) == bodies
    repeated = {body for body, n in Counter(seen).items() if n > 1}
    assert repeated <= set(killed)
    # (what it held unacked: 2 pop loops' batches of 16 at its listener, and up to 2 x 2 batches whose ack was on its way)
    assert len(repeated) <= (2 + 2 * 2) * 16


def _member(node, group: str, topic: str, out) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'tests' / 'integration'}")
    process = subprocess.Popen([sys.executable, str(ROOT / "tests" / "integration" / "pop_member.py"), node.endpoint,
                                group, topic], stdout=open(out, "wb"), stderr=subprocess.PIPE, env=env)
    assert process.stderr.readline().strip() == b"started"
    return process


def _lines(path) -> list[bytes]:
    raw = path.read_bytes() if path.exists() else b""
    return raw.split(b"\n")[:-1]  # (a line cut by the kill is not a message printed)


def test_a_kill_of_the_pop_service_keeps_every_lease_and_every_ack(node, consumer):
    bodies = produce(node, "PopKill", 300, queues=3)
    handed = pop_all(consumer, "PopKill", "survive", want=300, invisible_ms=4000)
    assert len(handed) == 300
    acked = handed[:100]
    assert all(consumer.ack_batch(acked))
    popped_at = time.monotonic()
    node.actor_process("pop").kill()
    time.sleep(1.0)
    assert pop_all(consumer, "PopKill", "survive", want=1, within=2.0) == []  # still invisible after the restart
    back = pop_all(consumer, "PopKill", "survive", want=200, within=20)
    assert time.monotonic() - popped_at >= 3.5
    assert sorted(m.body for m in back) == sorted(m.body for m in handed[100:])
    assert all(consumer.ack_batch(back))
    assert set(bodies) == {m.body for m in handed}


def test_the_pop_service_counts_in_admin_stats(node, consumer):
    def runtime_info() -> dict:
        with Producer(node.endpoint) as client:
            return client.request({"code": protocol.GET_BROKER_RUNTIME_INFO})[0]
    time.sleep(1.2)  # (a service's statistics come once a second: what the module did before this test)
    before = runtime_info()["actors"]["pop"]
    produce(node, "PopStats", 3)
    assert consumer.ack_batch(pop_all(consumer, "PopStats", "stats", want=3)) == [True] * 3
    deadline = time.monotonic() + 5
    while True:
        info = runtime_info()
        stats = info["actors"]["pop"]
        if stats.get("acked", 0) >= before.get("acked", 0) + 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert stats["popped"] >= before.get("popped", 0) + 3 and stats["acked"] >= before.get("acked", 0) + 3
    assert stats["log"]["writes"] > before.get("log", {}).get("writes", 0)
    assert {"redelivered", "deadLettered", "inFlight"} <= set(stats)
    assert info["services"]["pop"][0]["process"] == "pop"


def test_the_cli_pops_prints_handles_and_acks(node):
    produce(node, "PopCli", 5)
    command = [str(ROOT / "scripts" / "mqnode"), "consume", "--pop", "--endpoint", node.endpoint, "--topic", "PopCli",
               "--group", "cli", "--count", "5", "--timeout", "10"]
    done = subprocess.run(command, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    import orjson

    lines = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert [line["body"] for line in lines] == [f"m{i}" for i in range(5)]
    assert all(line["receiptHandle"] and line["reconsumeTimes"] == 0 for line in lines)
    shown = subprocess.run([str(ROOT / "scripts" / "mqnode"), "admin", "group", "--endpoint", node.endpoint,
                            "--group", "cli"], capture_output=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert orjson.loads(shown.stdout)["pop"]["PopCli@0"]["inFlight"] == 0


def test_admin_reset_offset_moves_a_pop_group_back_and_forward_and_wakes_a_held_pop(node, consumer):
    """RocketMQ 5's server-side reset of a pop group: its queues start again at the new offsets,
    what was in flight is dropped (its handles no longer hold), and a pop held waiting for
    messages gets the ones the reset brought back."""
    import orjson

    bodies = produce(node, "PopReset", 20, queues=2)
    handed = pop_all(consumer, "PopReset", "resets", want=20)
    assert consumer.ack_batch(handed[:8]) == [True] * 8

    def reset(to: str) -> dict:
        done = subprocess.run([sys.executable, "-m", "node.tools.cli", "admin", "reset-offset", "--endpoint",
                               node.endpoint, "--group", "resets", "--topic", "PopReset", "--to", to],
                              capture_output=True, timeout=60, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        return orjson.loads(done.stdout)

    popped = len(consumer.pop_state("resets")["PopReset"])  # (the queues its any-queue pops looked at)
    shown = reset("first")
    assert (shown["popQueuesReset"], shown["popLeasesDropped"]) == (popped, 12)
    assert all(q["low"] == q["next"] == 0 and q["inFlight"] == 0 for q in consumer.pop_state("resets")["PopReset"].values())
    assert consumer.ack(handed[10]) is False  # its lease went with the reset: RECEIPT_HANDLE_EXPIRED
    again = pop_all(consumer, "PopReset", "resets", want=20)
    assert sorted(m.body for m in again) == sorted(bodies) and {m.reconsume_times for m in again} == {0}
    assert consumer.ack_batch(again) == [True] * 20

    with PullConsumer(node.endpoint) as waiting:
        began = time.monotonic()
        held = ThreadPoolExecutor(1).submit(waiting.pop, "PopReset", "resets", max_count=32, wait_ms=20_000)
        time.sleep(1.0)  # (held by now: everything is acked)
        assert reset("first")["popLeasesDropped"] == 0
        woken = held.result(timeout=30)
    assert woken and time.monotonic() - began < 15  # woken by the reset, not by its 20 s running out
    assert set(m.body for m in woken) <= set(bodies)
    shown = reset("last")
    assert (shown["popQueuesReset"], shown["popLeasesDropped"]) == (len(consumer.pop_state("resets")["PopReset"]), len(woken))
    assert consumer.pop("PopReset", "resets", wait_ms=300) == []
    later = produce(node, "PopReset", 2, prefix="after")
    assert sorted(m.body for m in pop_all(consumer, "PopReset", "resets", want=2)) == later


def test_a_pop_groups_acks_move_its_committed_offset(node, consumer):
    """As RocketMQ 5's acks do: the group's offset of a queue is its first message not yet retired
    (what a promoted slave starts the group at, and what the lag metric counts from)."""
    produce(node, "PopCommits", 10)
    handed = sorted(pop_all(consumer, "PopCommits", "commits", want=10, queue_id=0), key=lambda m: m.queue_offset)
    assert consumer.ack_batch([handed[i] for i in (0, 1, 2, 4)]) == [True] * 4
    wait_until(lambda: consumer.committed("commits", "PopCommits", 0) == 3, 10, "the pop group's offset")
    assert consumer.ack_batch([handed[3], *handed[5:]]) == [True] * 6
    wait_until(lambda: consumer.committed("commits", "PopCommits", 0) == 10, 10, "the pop group's offset")


def test_a_deleted_group_and_a_deleted_topic_take_their_pop_state_with_them(node, consumer):
    """`admin group delete` forgets what the group had in flight with its offsets (as RocketMQ 5
    clears its in-flight counts and offsets): popped again, it starts from the first message, its
    old handles no longer ack, and no commit of the old state brings the offsets back."""
    def admin(*args: str) -> None:
        done = subprocess.run([sys.executable, "-m", "node.tools.cli", "admin", *args, "--endpoint", node.endpoint],
                              capture_output=True, timeout=60, cwd=ROOT)
        assert done.returncode == 0, done.stderr

    bodies = produce(node, "PopForget", 10)
    handed = sorted(pop_all(consumer, "PopForget", "forgets", want=10), key=lambda m: m.queue_offset)
    assert consumer.ack_batch(handed[:4]) == [True] * 4
    wait_until(lambda: consumer.committed("forgets", "PopForget", 0) == 4, 10, "the pop group's offset")
    admin("group", "delete", "--group", "forgets")
    assert consumer.pop_state("forgets") == {}
    time.sleep(1.5)  # (a progress commit of the pop service, were its state left)
    assert consumer.committed("forgets", "PopForget", 0) is None
    again = sorted(pop_all(consumer, "PopForget", "forgets", want=10), key=lambda m: m.queue_offset)
    assert [m.body for m in again] == bodies and {m.reconsume_times for m in again} == {0}
    assert consumer.ack(handed[6]) is False  # (RECEIPT_HANDLE_EXPIRED: issued, no longer holds)
    assert consumer.ack_batch(again) == [True] * 10
    produce(node, "PopForgetTopic", 3)
    assert len(pop_all(consumer, "PopForgetTopic", "forgets", want=3)) == 3
    admin("topic", "delete", "--topic", "PopForgetTopic")
    assert set(consumer.pop_state("forgets")) == {"PopForget"}


def test_without_enable_property_filter_sql92_is_refused_as_rocketmq_refuses_it(node, consumer, caplog):
    import logging

    from node.client import PushConsumer

    produce(node, "PopSqlOff", 2)
    for call in (lambda: consumer.pull("PopSqlOff", 0, 0, subscription="a > 1", expression_type="SQL92"),
                 lambda: consumer.pop("PopSqlOff", "sql-off", tags="a > 1", expression_type="SQL92")):
        with pytest.raises(SendError) as e:
            call()
        assert (e.value.status, e.value.remark) == ("SYSTEM_ERROR", protocol.SQL92_OFF)
    assert sorted(m.body for m in pop_all(consumer, "PopSqlOff", "sql-off", want=2)) == [b"m0", b"m1"]
    member = PushConsumer(node.endpoint, "sql-off-push", consume_from_where="FIRST_OFFSET")
    member.subscribe("PopSqlOff", "a > 1", expression_type="SQL92")
    member.register_listener(lambda messages: CONSUME_SUCCESS)
    with caplog.at_level(logging.WARNING, logger="mqnode.push"):
        member.start()
        try:  # a push consumer says why its pulls fail, once, rather than retrying in silence
            deadline = time.monotonic() + 15
            while protocol.SQL92_OFF not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            member.shutdown()
    assert caplog.text.count(protocol.SQL92_OFF) == 1, caplog.text


def test_a_pop_consumer_refuses_options_the_node_would_and_says_why_its_pops_fail(node, caplog):
    """A PopConsumer with invisible_ms=0 (or max_count=0, pops_in_flight=0...) popped nothing, again
    and again, and said nothing; a pop the node refuses (a topic that does not exist) was tried
    again in silence."""
    import logging

    for options in ({"invisible_ms": 0}, {"max_count": 0}, {"pops_in_flight": 0}, {"consume_batch": 0},
                    {"wait_ms": -1}, {"reconsume_delay_ms": -1}, {"timeout": 0}):
        with pytest.raises(ValueError, match=f"PopConsumer's {next(iter(options))} must be"):
            PopConsumer(node.endpoint, "bad-options", **options)
    member = PopConsumer(node.endpoint, "pops-unknown", wait_ms=100)
    member.subscribe("PopNoSuchTopic")
    member.register_listener(lambda messages: CONSUME_SUCCESS)
    with caplog.at_level(logging.WARNING, logger="mqnode.pop"):
        member.start()
        try:
            deadline = time.monotonic() + 15
            while member.statistics()["popErrors"] < 3 and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            member.shutdown()
    assert caplog.text.count("pops of PopNoSuchTopic for group pops-unknown fail: TOPIC_NOT_EXIST") == 1, caplog.text


def test_a_kill_9_of_the_whole_node_brings_back_every_message_in_flight_and_none_acked(tmp_path):
    """1,000 messages in flight, 400 of them acked, then kill -9 of every process: after the
    restart the 600 come back (after their invisible time, not before) and the 400 never do."""
    settings = node_settings(tmp_path / "store", runDir=str(tmp_path / "run"))
    node = NodeProcess(settings, tmp_path / "node.log").start()
    try:
        bodies = produce(node, "PopCrash", 1000, queues=4)
        with PullConsumer(node.endpoint) as consumer:
            handed = pop_all(consumer, "PopCrash", "crash", want=1000, invisible_ms=8000, within=30)
            assert sorted(m.body for m in handed) == sorted(bodies)
            assert all(consumer.ack_batch(handed[:400]))
        popped_at = time.monotonic()
        node.kill_all()
        node = NodeProcess(settings, tmp_path / "node.log").start()
        with PullConsumer(node.endpoint) as consumer:
            early = consumer.pop("PopCrash", "crash", max_count=64, wait_ms=100) if time.monotonic() - popped_at < 7 else []
            assert early == []  # (still invisible)
            back = pop_all(consumer, "PopCrash", "crash", want=600, within=40)
            assert time.monotonic() - popped_at >= 7.5
            assert sorted(m.body for m in back) == sorted(m.body for m in handed[400:])
            assert all(consumer.ack_batch(back))
            assert consumer.pop("PopCrash", "crash", wait_ms=1500) == []
    finally:
        node.stop(strict=False)


def test_compact_pops_as_split_does(tmp_path):
    """The pop service is a process of its own in both topologies: the same answers in compact;
    and a clean stop stops it too, its log folded into a snapshot."""
    settings = node_settings(tmp_path / "store", runDir=str(tmp_path / "run"), topology="compact")
    node = NodeProcess(settings, tmp_path / "node.log").start()
    try:
        bodies = produce(node, "PopCompact", 20, queues=2)
        with PullConsumer(node.endpoint) as consumer:
            first = pop_all(consumer, "PopCompact", "compact", want=20, invisible_ms=1000)
            assert sorted(m.body for m in first) == sorted(bodies)
            assert consumer.ack_batch(first[:10]) == [True] * 10
            back = pop_all(consumer, "PopCompact", "compact", want=10, within=10)
            assert sorted(m.body for m in back) == sorted(m.body for m in first[10:])
            assert {m.reconsume_times for m in back} == {1} and all(consumer.ack_batch(back))
        assert node.stop() == 0
        # a clean stop folds the pop log's journal into its snapshot (docs/storage.md "Pop state")
        assert [f.name for f in sorted((tmp_path / "store" / "pop").iterdir())] == ["journal.1", "snapshot"]
    finally:
        node.stop(strict=False)
