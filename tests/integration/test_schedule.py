"""The schedule service end to end, with real `mqnode start` processes: delayed messages arrive in
their real topic and queue, in order, never early, with RocketMQ's re-put fields; a restart goes on
from delayOffset.json; a consumer's send-backs go to %RETRY%<group> and then to %DLQ%<group>."""

from __future__ import annotations

import time

import orjson
import pytest
from nodes import NodeProcess, node_settings, running_node

from node import protocol
from node.client import Producer, PullConsumer
from actors import config_files

pytestmark = pytest.mark.slow
LEVELS = " ".join(["1s"] * 18)  # every level one second: the tests wait seconds, not hours


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """One node for the module's tests that do not restart it: delay levels of a second, timers
    at 100 ms precision (each test has its own topics; counters are compared before and after)."""
    yield from running_node(tmp_path_factory.mktemp("schedule"), messageDelayLevel=LEVELS, flushDelayOffsetInterval=200,
                            timerPrecisionMs=100, timerMaxDelaySec=3600, timerFlushIntervalMs=200)


def _wait_for(consumer, topic: str, queue_id: int, count: int, timeout: float = 15.0) -> list:
    found, offset, deadline = [], 0, time.monotonic() + timeout
    while len(found) < count and time.monotonic() < deadline:
        result = consumer.pull(topic, queue_id, offset, suspend_ms=500)
        found += result.messages
        offset = result.next_begin_offset if result.status != "OFFSET_ILLEGAL" else result.min_offset
    return found


def test_delayed_messages_arrive_in_order_never_early_and_keep_rocketmqs_fields(node):
    with Producer(node.endpoint) as producer:
        sent = [producer.send("Delayed", f"d-{i}".encode(), delay_level=2, tags="T", queue_id=1) for i in range(30)]
        producer.send("Delayed", b"now", queue_id=0)
    with PullConsumer(node.endpoint) as consumer:
        assert consumer.pull("Delayed", 1, 0).messages == []  # not before their time
        delivered = _wait_for(consumer, "Delayed", 1, 30)
    assert [m.body for m in delivered] == [f"d-{i}".encode() for i in range(30)]
    assert [m.msg_id for m in delivered] == [r.msg_id for r in sent]  # the producer's UNIQ_KEY kept
    for m in delivered:
        assert m.store_timestamp - m.born_timestamp >= 1000  # a second's level, never early
        assert (m.properties["DELAY"], m.properties["REAL_TOPIC"], m.properties["REAL_QID"]) == ("2", "Delayed", "1")
        assert m.tags == "T"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        data = config_files.read(node.settings.root / "config" / "delayOffset.json") or {}
        if (data.get("offsetTable") or {}).get("2") == 30:
            break
        time.sleep(0.1)
    assert data["offsetTable"]["2"] == 30  # RocketMQ's file: level -> the next offset to deliver
    deadline = time.monotonic() + 5
    while True:  # statistics reach the front once a second
        level = orjson.loads(_admin_stats(node))["actors"]["schedule"]["levels"]["2"]
        if level["delivered"] == 30 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert (level["delivered"], level["offset"], level["lag"]) == (30, 30, 0)


def _admin_stats(node, what: str = "stats") -> str:
    import subprocess
    import sys

    from nodes import ROOT

    done = subprocess.run([sys.executable, "-m", "node.tools.cli", "admin", what, "--endpoint", node.endpoint],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_restart_after_a_kill_9_of_every_process_delivers_what_was_delayed_and_timed_before_it(tmp_path):
    """Delayed messages (a level) and timers (RocketMQ 5's delays), both taken before a kill -9 of
    the whole node and due after it: the restarted node delivers each, the levels from
    delayOffset.json, the timers from the timer log. (One node for both: a start is ~10 CPU-s.)"""
    settings = node_settings(tmp_path / "store", runDir=str(tmp_path / "run"), timerPrecisionMs=100,
                             messageDelayLevel=" ".join(["10s"] * 18))  # due well after the kill: a loaded
    # VM took 3 s between the sends and kill -9, the schedule delivered them and its offset (persisted
    # on a period, as RocketMQ's delayOffset.json) had not reached the disk: at-least-once, each twice
    node = NodeProcess(settings, tmp_path / "node.log").start()
    try:
        with Producer(node.endpoint) as producer:
            for i in range(10):
                producer.send("Later", f"l-{i}".encode(), delay_level=1, queue_id=0)
            for i in range(10):
                producer.send("LaterTimed", f"t-{i}".encode(), delay_ms=4000, queue_id=0)
        time.sleep(1.5)  # the timers taken into the timer log (and maybe checkpointed)
        node.kill_all()  # kill -9, before any is due
        node = NodeProcess(settings, tmp_path / "node.log").start()
        with PullConsumer(node.endpoint) as consumer:
            timed = _wait_for(consumer, "LaterTimed", 0, 10, timeout=20)
            delayed = _wait_for(consumer, "Later", 0, 10, timeout=30)
            assert consumer.pull("LaterTimed", 0, 10, suspend_ms=1000).messages == []
        assert sorted(m.body for m in timed) == sorted(f"t-{i}".encode() for i in range(10))
        assert sorted(m.body for m in delayed) == sorted(f"l-{i}".encode() for i in range(10))
        assert len(delayed) == 10  # each once
    finally:
        node.stop(strict=False)


def test_a_clean_stop_keeps_what_was_delivered_and_the_next_start_delivers_nothing_again(tmp_path):
    """Delayed messages and timers delivered just before a clean stop (SIGTERM) stay delivered
    once: the stop persists the schedule service's delay offsets and timer checkpoint (its
    periods here a minute, so only the stop can have), as RocketMQ's shutdown persists
    delayOffset.json. Before, the launcher killed the schedule service without stopping it, and
    the next start delivered the last period's messages a second time."""
    settings = node_settings(tmp_path / "store", runDir=str(tmp_path / "run"), messageDelayLevel=LEVELS,
                             flushDelayOffsetInterval=60000, timerPrecisionMs=100, timerFlushIntervalMs=60000)
    node = NodeProcess(settings, tmp_path / "node.log").start()
    try:
        with Producer(node.endpoint) as producer:
            for i in range(10):
                producer.send("Once", f"l-{i}".encode(), delay_level=1, queue_id=0)
                producer.send("OnceTimed", f"t-{i}".encode(), delay_ms=1000, queue_id=0)
        with PullConsumer(node.endpoint) as consumer:
            assert len(_wait_for(consumer, "Once", 0, 10)) == len(_wait_for(consumer, "OnceTimed", 0, 10)) == 10
        assert node.stop() == 0
        node = NodeProcess(settings, tmp_path / "node.log").start()
        time.sleep(3)  # (a level's period and a timer's precision several times over)
        with PullConsumer(node.endpoint) as consumer:
            for topic in ("Once", "OnceTimed"):
                assert consumer.pull(topic, 0, 0, max_count=32).next_begin_offset == 10, topic
                assert consumer.pull(topic, 0, 10, suspend_ms=500).messages == [], topic
    finally:
        node.stop(strict=False)


def test_send_backs_retry_then_dead_letter(node):
    with Producer(node.endpoint) as producer:
        producer.send("Work", b"job", queue_id=0)
    with PullConsumer(node.endpoint) as consumer:
        (message,) = _wait_for(consumer, "Work", 0, 1)
        consumer.send_back(message, "workers", max_reconsume_times=2)
        (retry,) = _wait_for(consumer, "%RETRY%workers", 0, 1)
        assert (retry.body, retry.reconsume_times) == (b"job", 1)
        assert retry.properties["RETRY_TOPIC"] == "Work" and retry.properties["ORIGIN_MESSAGE_ID"] == message.msg_id
        consumer.send_back(retry, "workers", max_reconsume_times=2)
        (again,) = _wait_for(consumer, "%RETRY%workers", 0, 2)[1:]
        assert again.reconsume_times == 2
        consumer.send_back(again, "workers", max_reconsume_times=2)  # the retries are used up
        (dead,) = _wait_for(consumer, "%DLQ%workers", 0, 1)
        assert (dead.body, dead.reconsume_times, dead.properties["RETRY_TOPIC"]) == (b"job", 3, "Work")


# -- timers (RocketMQ 5's arbitrary delays) ---------------------------------------------------------


@pytest.fixture
def timer_node(node):
    return node


def _until_all(consumer, topic: str, bodies: set[bytes], timeout: float = 60.0) -> list:
    """Queue 0's messages until every body in `bodies` has come (duplicates kept) or the time is
    up: a killed service is back within seconds, and may deliver some twice."""
    found, offset, began = [], 0, time.monotonic()
    seen: list[tuple] = []  # (seconds, status, offset, max offset) of the last pulls, for a failure's report
    while not bodies <= {m.body for m in found}:
        result = consumer.pull(topic, 0, offset, suspend_ms=500)
        found += result.messages
        seen = [*seen[-5:], (round(time.monotonic() - began, 1), result.status, offset, result.max_offset)]
        offset = result.next_begin_offset if result.status != "OFFSET_ILLEGAL" else result.min_offset
        assert time.monotonic() - began < timeout, (f"{len(found)} read, {len(bodies - {m.body for m in found})} "
                                                    f"still missing after {timeout} s; last pulls: {seen}")
    return found


def _drain(consumer, topic: str, count: int, timeout: float = 20.0) -> list:
    return _wait_for(consumer, topic, 0, count, timeout)


def test_timers_arrive_at_their_time_never_early_with_rocketmq5s_fields(timer_node):
    import subprocess
    import sys

    from nodes import ROOT

    sent = {}  # msgId -> (earliest, latest) due time: the node counts a delay from its receipt

    def send_timed(body: bytes, wait_ms: int, **kwargs):
        before = int(time.time() * 1000)
        msg_id = producer.send("Timed", body, queue_id=0, **kwargs).msg_id
        sent[msg_id] = (before + wait_ms, int(time.time() * 1000) + wait_ms)

    began = int(time.time() * 1000)
    with Producer(timer_node.endpoint) as producer:
        for i in range(20):
            send_timed(f"t-{i}".encode(), 300 + 100 * i, delay_ms=300 + 100 * i)
        at = began + 1500
        sent[producer.send("Timed", b"at", deliver_at_ms=at, queue_id=0).msg_id] = (at, at)
        send_timed(b"sec", 1000, properties={"TIMER_DELAY_SEC": "1"})
        past = producer.send("Timed", b"past", deliver_at_ms=began - 10, queue_id=0)
        assert past.topic == "Timed"  # due already: stored now, a plain message
    done = subprocess.run([sys.executable, "-m", "node.tools.cli", "produce", "--endpoint", timer_node.endpoint,
                           "--topic", "Timed", "--queue", "0", "--delay-ms", "700"], input="cli\n", cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and orjson.loads(done.stdout)["status"] == "PUT_OK", done.stdout + done.stderr
    with PullConsumer(timer_node.endpoint) as consumer:
        found = _drain(consumer, "Timed", 24)
    (plain,) = [m for m in found if m.body == b"past"]
    assert "TIMER_OUT_MS" not in plain.properties and plain.queue_offset == past.queue_offset
    timed = [m for m in found if m.body not in (b"past", b"cli")]
    assert len(timed) == 22 and {m.msg_id for m in timed} == set(sent)  # each once
    for m in timed:
        out_ms, (earliest, latest) = int(m.properties["TIMER_OUT_MS"]), sent[m.msg_id]
        assert out_ms % 100 == 0 and earliest <= out_ms < latest + 100  # rounded up, never down
        assert m.store_timestamp >= out_ms  # never early
        assert "REAL_TOPIC" not in m.properties and "REAL_QID" not in m.properties  # RocketMQ 5 clears them
    (cli,) = [m for m in found if m.body == b"cli"]
    assert cli.properties["TIMER_DELAY_MS"] == "700" and cli.store_timestamp >= int(cli.properties["TIMER_OUT_MS"])


def test_a_timer_at_the_far_edge_is_taken_and_one_past_it_refused(timer_node):
    from node.client.producer import Message, SendError

    now = int(time.time() * 1000)
    deadline = time.monotonic() + 10
    while True:  # the module's earlier timers all delivered (the figures are up to a second old)
        before = orjson.loads(_admin_stats(timer_node, "delays"))["timers"]
        if before["pending"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    with Producer(timer_node.endpoint) as producer:
        edge = producer.send("Far", b"edge", delay_ms=3600 * 1000 - 5000, queue_id=0)
        assert edge.status == "PUT_OK"
        with pytest.raises(SendError, match="MESSAGE_ILLEGAL.*timerMaxDelaySec"):
            producer.send("Far", b"beyond", deliver_at_ms=now + 3600 * 1000 + 5000, queue_id=0)
        with pytest.raises(SendError, match="MESSAGE_ILLEGAL.*TIMER_DELAY_MS must be an integer"):
            producer.send("Far", b"bad", properties={"TIMER_DELAY_MS": "soon"}, queue_id=0)
        with pytest.raises(SendError, match="MESSAGE_ILLEGAL.*neither a DELAY level nor a timer"):
            producer.send_batch("Far", [Message("Far", b"b", delay_ms=1000)], queue_id=0)
    deadline = time.monotonic() + 10
    while True:  # the edge timer is pending, on disk, not delivered
        timers = orjson.loads(_admin_stats(timer_node, "delays"))["timers"]
        if timers["pending"] == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert (timers["pending"], timers["delivered"]) == (1, before["delivered"])
    with PullConsumer(timer_node.endpoint) as consumer:
        assert consumer.pull("Far", 0, 0).messages == []


def test_a_recalled_timer_is_never_delivered_and_its_neighbours_are(timer_node):
    import subprocess
    import sys

    from nodes import ROOT

    from node.client.producer import SendError

    def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "node.tools.cli", *args, "--endpoint", timer_node.endpoint,
                               "--topic", "Recall"], input=stdin, cwd=ROOT, capture_output=True, text=True, timeout=60)

    with Producer(timer_node.endpoint) as producer:
        due = int(time.time() * 1000) + 4000
        kept = producer.send("Recall", b"kept", deliver_at_ms=due, queue_id=0)
        gone = producer.send("Recall", b"gone", deliver_at_ms=due, queue_id=0)
        later = producer.send("Recall", b"later", delay_ms=4000, queue_id=0)
        sent = cli("produce", "--queue", "0", "--delay-ms", "4000", stdin="cli\n")
        handle = orjson.loads(sent.stdout)["recallHandle"]
        assert orjson.loads(sent.stdout)["brokerName"] == timer_node.settings.brokerName  # (the handle names it)
        assert protocol.parse_recall_handle(kept.recall_handle)[1] == timer_node.settings.brokerName
        recalled = cli("recall", "--handle", handle, "--handle", "bm90IGEgaGFuZGxl")
        assert recalled.returncode == 1, recalled.stderr  # (one of the two was no handle)
        assert [orjson.loads(line)["status"] for line in recalled.stdout.splitlines()] == ["OK", "ILLEGAL_HANDLE"]
        assert producer.send("Recall", b"plain", queue_id=1).recall_handle is None
        assert producer.recall("Recall", gone.recall_handle) == gone.msg_id
        assert producer.recall("Recall", later.recall_handle) == later.msg_id
        with pytest.raises(ValueError, match="topic"):
            producer.recall("Other", gone.recall_handle)
        with pytest.raises(ValueError, match="not a recall handle"):
            producer.recall("Recall", "bm90IGEgaGFuZGxl")
        with PullConsumer(timer_node.endpoint) as consumer:
            found = _wait_for(consumer, "Recall", 0, 1)
            time.sleep(1.0)  # (the recalled ones would have come with it)
            found += consumer.pull("Recall", 0, len(found), suspend_ms=300).messages
        assert [m.body for m in found] == [b"kept"]
        with pytest.raises(SendError, match="MESSAGE_ILLEGAL.*recall failed"):
            producer.recall("Recall", kept.recall_handle)  # its time has come
    deadline = time.monotonic() + 5
    while True:  # (`admin delays` figures are up to a second old)
        recalls = orjson.loads(_admin_stats(timer_node, "delays"))["timers"]["recalls"]
        if recalls["cancelled"] >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert recalls["cancelled"] >= 2 and recalls["taken"] >= 2


def test_a_recall_holds_through_a_kill_9_of_the_schedule_process(timer_node):
    with Producer(timer_node.endpoint) as producer:
        due = int(time.time() * 1000) + 3000
        sent = [producer.send("RecallKill", f"r-{i}".encode(), deliver_at_ms=due, queue_id=0) for i in range(10)]
        for result in sent[:5]:
            producer.recall("RecallKill", result.recall_handle)
    time.sleep(0.15)  # taken in, perhaps not yet in a checkpoint
    timer_node.actor_process("schedule").kill()
    with PullConsumer(timer_node.endpoint) as consumer:
        found = _until_all(consumer, "RecallKill", {f"r-{i}".encode() for i in range(5, 10)})
        time.sleep(1.0)
        found += consumer.pull("RecallKill", 0, len(found), suspend_ms=300).messages
    assert {m.body for m in found} == {f"r-{i}".encode() for i in range(5, 10)}


def test_kill_9_of_the_schedule_process_mid_delivery_loses_no_timer(timer_node):
    body = [f"k-{i}".encode() for i in range(3000)]
    plain = set()  # sent too late for its time: a time already past is stored as a plain message
    with Producer(timer_node.endpoint) as producer:
        due = int(time.time() * 1000) + 1500
        for i, b in enumerate(body):
            # each due a little later than planned when the sends fall behind (a loaded CI
            # machine's sends are not 2 ms each but, now and then, hundreds)
            at = max(due + i // 100 * 100, int(time.time() * 1000) + 500)
            producer.send("Killed", b, deliver_at_ms=at, queue_id=0)
            if at <= int(time.time() * 1000):
                plain.add(b)
    assert len(plain) < 100, f"{len(plain)} of the timers were sent after their time"
    with PullConsumer(timer_node.endpoint) as consumer:
        first = _drain(consumer, "Killed", 1)
        assert first, "nothing was delivered"
        timer_node.actor_process("schedule").kill()  # kill -9 while its slots go out
        found = _until_all(consumer, "Killed", set(body))
    assert {m.body for m in found} == set(body)  # none lost (some may come twice)
    timers = [m for m in found if m.body not in plain]
    assert all("TIMER_OUT_MS" in m.properties for m in timers), [m.body for m in timers if "TIMER_OUT_MS" not in m.properties][:5]
    assert all(m.store_timestamp >= int(m.properties["TIMER_OUT_MS"]) for m in timers)


def test_kill_9_of_the_schedule_process_mid_level_delivery_loses_nothing(node):
    """(The module's node: Ray restarts its schedule process for the tests after this one.)"""
    body = [f"m-{i}".encode() for i in range(5000)]
    with Producer(node.endpoint) as producer:
        sent = [producer.send_async("Levels", b, delay_level=1, queue_id=0) for b in body]
        producer.send("Levels", b"last", delay_level=1, queue_id=0)
        assert {f.result().status for f in sent} == {"PUT_OK"}
    with PullConsumer(node.endpoint) as consumer:
        assert _wait_for(consumer, "Levels", 0, 1), "nothing was delivered"
        node.actor_process("schedule").kill()  # kill -9 while the level goes out
        found = _until_all(consumer, "Levels", set(body) | {b"last"})
    assert {m.body for m in found} == set(body) | {b"last"}  # none lost (some may come twice)
    assert all(m.store_timestamp - m.born_timestamp >= 1000 for m in found)  # none early
