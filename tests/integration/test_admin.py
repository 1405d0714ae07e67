"""Administration end to end through `scripts/mqnode admin` (the CLI as a user runs it) against one
real node: topics created, updated and deleted; subscription groups created, updated (a group
whose consumeEnable is false may not pull; its retryMaxTimes bounds send-backs) and deleted;
offsets reset to a time, to the first and to the last message; the config files as RocketMQ
keeps them, with their `.bak`."""

from __future__ import annotations

import subprocess
import sys
import time

import orjson
import pytest
from nodes import ROOT, NodeProcess, node_settings

from node.client import Producer, PullConsumer
from node.client.producer import SendError
from actors import config_files

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("admin")
    settings = node_settings(tmp / "store", runDir=str(tmp / "run"), autoCreateTopicEnable=False,
                             messageDelayLevel=" ".join(["1s"] * 18))
    process = NodeProcess(settings, tmp / "node.log").start()
    yield process
    process.stop(strict=False)


def admin(node, *args: str, ok: bool = True) -> dict:
    done = subprocess.run([sys.executable, "-m", "node.tools.cli", "admin", *args, "--endpoint", node.endpoint],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (done.returncode == 0) == ok, done.stdout + done.stderr
    return orjson.loads(done.stdout) if ok else {"stderr": done.stderr, "stdout": done.stdout}


def test_a_topic_is_created_updated_and_deleted(node):
    with Producer(node.endpoint) as producer, pytest.raises(SendError, match="TOPIC_NOT_EXIST"):
        producer.send("Made", b"x", queue_id=0)
    created = admin(node, "topic", "create", "--topic", "Made", "--queues", "4")
    assert (created["readQueueNums"], created["writeQueueNums"], created["perm"]) == (4, 4, 6)
    with Producer(node.endpoint) as producer:
        assert producer.send("Made", b"x", queue_id=3).status == "PUT_OK"
    admin(node, "topic", "update", "--topic", "Made", "--queues", "2", "--perm", "4")  # read only
    with Producer(node.endpoint) as producer, pytest.raises(SendError, match="not writable"):
        producer.send("Made", b"y", queue_id=0)
    table = config_files.read(node.settings.root / "config" / "topics.json")["topicConfigTable"]
    assert table["Made"]["perm"] == 4 and table["Made"]["writeQueueNums"] == 2
    assert (node.settings.root / "config" / "topics.json.bak").exists()  # the one before, as RocketMQ keeps it
    assert "system topic" in admin(node, "topic", "create", "--topic", "SCHEDULE_TOPIC_XXXX", ok=False)["stderr"]
    admin(node, "topic", "delete", "--topic", "Made")
    with Producer(node.endpoint) as producer, pytest.raises(SendError, match="TOPIC_NOT_EXIST"):
        producer.send("Made", b"z", queue_id=0)
    assert "TOPIC_NOT_EXIST" in admin(node, "topic", "delete", "--topic", "Made", ok=False)["stderr"]


def test_a_deleted_topic_takes_its_messages_and_one_made_again_starts_after_them(node):
    """As RocketMQ's deleteTopic: no message stored under the name before the deletion is read
    again, by a pull, a pop or a consumer from the first, of the topic made again either; its
    queue files go at once, their numbering goes on (docs/protocol.md 215)."""
    admin(node, "topic", "create", "--topic", "Reborn", "--queues", "2")
    with Producer(node.endpoint) as producer:
        for i in range(3):
            producer.send("Reborn", f"old-{i}".encode(), queue_id=0)
    admin(node, "topic", "delete", "--topic", "Reborn")
    queues = node.settings.consumequeue_dir / "Reborn"
    deadline = time.monotonic() + 10
    while queues.exists():  # the dispatcher drops them at its next turn
        assert time.monotonic() < deadline, sorted(p.name for p in queues.iterdir())
        time.sleep(0.05)
    with PullConsumer(node.endpoint) as consumer:
        assert consumer.pull("Reborn", 0, 0).messages == []
        admin(node, "topic", "create", "--topic", "Reborn", "--queues", "2")
        with Producer(node.endpoint) as producer:
            assert producer.send("Reborn", b"new", queue_id=0).queue_offset == 3  # numbered on
        assert (consumer.min_offset("Reborn", 0), consumer.max_offset("Reborn", 0)) == (3, 4)
        below = consumer.pull("Reborn", 0, 0)
        assert below.messages == [] and below.next_begin_offset == 3
        assert [m.body for m in consumer.pull("Reborn", 0, 3).messages] == [b"new"]
        assert [m.body for m in consumer.pop("Reborn", "reborn-pop", max_count=8)] == [b"new"]
    done = subprocess.run([sys.executable, "-m", "node.tools.cli", "consume", "--endpoint", node.endpoint,
                           "--topic", "Reborn", "--group", "reborn", "--from", "first", "--timeout", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [orjson.loads(line)["body"] for line in done.stdout.splitlines()] == ["new"]


def test_a_group_that_may_not_consume_is_refused_and_its_retries_are_its_own(node):
    admin(node, "topic", "create", "--topic", "Jobs", "--queues", "1")
    with Producer(node.endpoint) as producer:
        producer.send("Jobs", b"job", queue_id=0)
    group = admin(node, "group", "create", "--group", "workers", "--max-retries", "1", "--consume-enable", "false")
    assert (group["retryMaxTimes"], group["consumeEnable"]) == (1, False)
    with PullConsumer(node.endpoint) as consumer:
        with pytest.raises(SendError, match="NO_PERMISSION.*consumeEnable"):
            consumer.pull("Jobs", 0, 0, group="workers")
        admin(node, "group", "update", "--group", "workers", "--consume-enable", "true")
        (message,) = consumer.pull("Jobs", 0, 0, group="workers").messages
        consumer.send_back(message, "workers", max_reconsume_times=None)  # the group's retryMaxTimes: 1
        deadline = time.monotonic() + 10
        while not (retried := consumer.pull("%RETRY%workers", 0, 0, suspend_ms=500).messages):
            assert time.monotonic() < deadline
        consumer.send_back(retried[0], "workers", max_reconsume_times=None)  # the one retry used: DLQ
        while not consumer.pull("%DLQ%workers", 0, 0, suspend_ms=500).messages:
            assert time.monotonic() < deadline
    groups = config_files.read(node.settings.root / "config" / "subscriptionGroup.json")["subscriptionGroupTable"]
    assert groups["workers"]["retryMaxTimes"] == 1
    # as mqadmin deleteSubGroup: its retry and dead-letter topics go too, their messages with them
    assert admin(node, "group", "delete", "--group", "workers")["topicsDeleted"] == ["%RETRY%workers", "%DLQ%workers"]
    groups = config_files.read(node.settings.root / "config" / "subscriptionGroup.json")["subscriptionGroupTable"]
    assert "workers" not in groups
    with PullConsumer(node.endpoint) as consumer:
        assert consumer.pull("%RETRY%workers", 0, 0).messages == [] == consumer.pull("%DLQ%workers", 0, 0).messages
    assert "SUBSCRIPTION_GROUP_NOT_EXIST" in admin(node, "group", "delete", "--group", "workers", ok=False)["stderr"]


def test_offsets_reset_to_a_time_to_the_first_and_to_the_last(node):
    admin(node, "topic", "create", "--topic", "Replay", "--queues", "2")
    with Producer(node.endpoint) as producer:
        for i in range(5):
            producer.send("Replay", f"early-{i}".encode(), queue_id=i % 2)
        time.sleep(0.05)
        middle = int(time.time() * 1000)
        time.sleep(0.05)
        for i in range(5):
            producer.send("Replay", f"late-{i}".encode(), queue_id=i % 2)
    with PullConsumer(node.endpoint) as consumer:
        consumer.commit("replayers", "Replay", 0, 6)
        consumer.commit("replayers", "Replay", 1, 4)
        shown = admin(node, "reset-offset", "--group", "replayers", "--topic", "Replay", "--to-timestamp", str(middle))
        assert shown == {"Replay": {"0": 3, "1": 2}, "membersNotified": 0,  # the first stored at or after `middle`
                         "popQueuesReset": 0, "popLeasesDropped": 0}
        assert [consumer.committed("replayers", "Replay", q) for q in (0, 1)] == [3, 2]
        admin(node, "reset-offset", "--group", "replayers", "--topic", "Replay", "--to", "first")
        assert [consumer.committed("replayers", "Replay", q) for q in (0, 1)] == [0, 0]
        admin(node, "reset-offset", "--group", "replayers", "--topic", "Replay", "--to", "last")
        assert [consumer.committed("replayers", "Replay", q) for q in (0, 1)] == [6, 4]  # six and four sent
    refused = admin(node, "reset-offset", "--group", "replayers", "--topic", "Nowhere", "--to", "first", ok=False)
    assert "TOPIC_NOT_EXIST" in refused["stderr"]
    assert "SUBSCRIPTION_GROUP_NOT_EXIST" in admin(node, "group", "--group", "nobody", ok=False)["stderr"]
    assert admin(node, "group", "--group", "replayers")["lag"]["Replay@0"]["lag"] == 0
