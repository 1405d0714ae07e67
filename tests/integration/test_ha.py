"""Replication end to end: real `mqnode start` masters and slaves (each with its own embedded Ray,
so kill -9 can take a whole node), real ZeroMQ and TCP links on 127.0.0.1, real files.

The slave's CommitLog must always be a byte-identical prefix of its master's, its store must
verify clean, and under SYNC_MASTER no acknowledged send may be lost, across kills, a cut link
and a failover."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import subprocess
import sys
import threading
import time

import orjson
import pytest
import zmq
from golden import GOLDEN_SETTINGS, GOLDEN_STORE, manifest
from helpers import read_statistics
from nodes import ROOT, FakeRocketMQMaster, NodeProcess, free_port, node_settings, read_exactly, small_disk

from node import protocol
from node.client import AsyncProducer, Producer, PullConsumer, SendError
from actors import config_files
from actors.ha_link import HEADER, REPORT
from shm.codec import decode
from shm.control_block import peek
from shm.epochs import EpochFile
from shm.mapped_file import file_name
from shm.verify import verify_store

pytestmark = pytest.mark.slow


def wait_until(predicate, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what or predicate}"
        time.sleep(0.05)


def control(settings, name: str) -> int:
    return peek(settings.root, name)


def log_bytes(settings, start: int, end: int) -> bytes:
    """The CommitLog's bytes [start, end) as the files hold them."""
    size, out = settings.mappedFileSizeCommitLog, bytearray()
    at = start
    while at < end:
        segment = at - at % size
        with open(settings.commitlog_dir / file_name(segment), "rb") as f:
            f.seek(at - segment)
            out += f.read(min(end, segment + size) - at)
        at = segment + size
    return bytes(out)


def assert_prefix(slave, master) -> int:
    """The slave's CommitLog is byte for byte the master's, from the slave's first byte to its end."""
    end = control(slave, "written")
    start = control(slave, "min_offset")
    assert end > start and log_bytes(slave, start, end) == log_bytes(master, start, end)
    return end


def caught_up(slave, master) -> bool:
    return control(slave, "written") == control(master, "written") > 0 and \
        control(slave, "dispatched") == control(slave, "written")


def master_settings(directory, **overrides):
    return node_settings(directory / "master", haListenPort=free_port(), **overrides)


def slave_settings(directory, master, **overrides):
    values = {"brokerRole": "SLAVE", "brokerId": 1, "haMasterAddress": f"127.0.0.1:{master.ha_port}",
              "haListenPort": free_port()} | overrides
    return node_settings(directory / "slave", **values)


def cli(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "node.tools.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout)


def send_many(endpoint: str, count: int, topic: str = "Ha", *, keys: bool = True) -> list:
    async def run():
        async with AsyncProducer(endpoint, timeout=10.0, retries=0) as producer:
            return await asyncio.gather(*[producer.send(topic, f"message-{i}".encode() * 20,
                                                        keys=[f"k{i}"] if keys else None) for i in range(count)])
    return asyncio.run(run())


class Pair:
    """A master and its slave; every node started is stopped at the end. The module's pair is
    shared by its tests, in any order: they leave it with its roles (killed and restarted at most);
    the failover has a pair of its own."""

    def __init__(self, directory):
        self.directory = directory
        self.master = master_settings(directory, slaveReadEnable=True, accessMessageInMemoryMaxRatio=0,
                                      syncFlushTimeout=1500, flushConsumerOffsetInterval=1000)  # (offsets to the slave sooner)
        self.slave = slave_settings(directory, self.master, slaveReadEnable=True)
        self.master_node = NodeProcess(self.master, directory / "master.log")
        self.slave_node = NodeProcess(self.slave, directory / "slave.log")
        self.started: list[NodeProcess] = []

    def start(self, node: NodeProcess) -> NodeProcess:
        self.started.append(node)
        return node.start()

    def stop(self) -> None:
        for node in reversed(self.started):
            node.stop(strict=False)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """An ASYNC_MASTER holding ~3 segments before its slave starts empty; the master sends
    consumers of cold data to its slave (a ratio of 0: all is cold), the slave sends them back
    (its default ratio: all of it is hot)."""
    pair = Pair(tmp_path_factory.mktemp("pair"))
    pair.start(pair.master_node)
    with Producer(pair.master.listen) as producer:  # ~3.5 MiB: the slave catches up over 4 segments
        for _ in range(35):
            producer.send_batch("HaBefore", [bytes(1024)] * 100)
    pair.start(pair.slave_node)
    yield pair
    pair.stop()


@pytest.fixture
def failover_pair(tmp_path_factory):
    """A pair the test fails over: the old master ends as the new one's slave."""
    pair = Pair(tmp_path_factory.mktemp("failover"))
    pair.start(pair.master_node)
    pair.start(pair.slave_node)
    yield pair
    pair.stop()


def test_a_slave_follows_byte_for_byte_and_serves_reads(pair):
    master, slave = pair.master, pair.slave
    wait_until(lambda: caught_up(slave, master), 60, "an empty slave to catch up with ~3 segments")
    assert control(slave, "min_offset") == 0 and control(slave, "written") > 3 * master.mappedFileSizeCommitLog
    results = send_many(master.listen, 600, "HaFollow")  # (a topic of its own: one message has key k7)
    with Producer(master.listen) as producer:
        producer.send_batch("HaBatch", [f"b{i}".encode() for i in range(50)])
    wait_until(lambda: caught_up(slave, master), what="the slave to catch up")
    assert_prefix(slave, master)
    with PullConsumer(slave.listen) as consumer:
        for queue in range(8):
            assert consumer.max_offset("HaFollow", queue) == PullConsumer(master.listen).max_offset("HaFollow", queue)
        found = consumer.pull("HaFollow", results[0].queue_id, results[0].queue_offset)
        assert found.status == "FOUND" and found.messages[0].body == b"message-0" * 20
        assert [m.body for m in consumer.query("HaFollow", "k7")] == [b"message-7" * 20]


def test_a_slave_refuses_sends_naming_its_master(pair):
    master, slave = pair.master, pair.slave
    with Producer(slave.listen, retries=0) as producer:
        with pytest.raises(SendError) as refused:
            producer.send("Ha", b"never stored")
    assert refused.value.status == "SERVICE_NOT_AVAILABLE" and f"127.0.0.1:{master.ha_port}" in refused.value.remark


def test_admin_ha_shows_both_ends_and_the_route_lists_both_brokers(pair):
    master, slave = pair.master, pair.slave
    send_many(master.listen, 10)
    wait_until(lambda: caught_up(slave, master))
    shown = cli("admin", "ha", "--endpoint", master.listen)
    assert shown["role"] == "ASYNC_MASTER" and shown["epoch"] == 0 and shown["slavesFollowing"] == 1

    def settled():  # (what the ha-server reported: at most a second old)
        followers = cli("admin", "ha", "--endpoint", master.listen)["slaves"]
        return followers and followers[0]["ackedOffset"] == control(master, "written") and followers[0]["lagBytes"] == 0
    wait_until(settled, 10)
    follower = cli("admin", "ha", "--endpoint", master.listen)["slaves"][0]
    assert follower["brokerId"] == 1 and follower["endpoint"] == slave.listen and follower["lagMs"] == 0
    on_slave = cli("admin", "ha", "--endpoint", slave.listen)
    assert on_slave["role"] == "SLAVE" and on_slave["follower"]["connected"] is True
    assert on_slave["follower"]["master"] == f"127.0.0.1:{master.ha_port}"
    assert on_slave["follower"]["masterEndpoint"] == master.listen and on_slave["follower"]["lagBytes"] == 0
    assert on_slave["masterOffset"] == control(slave, "master_offset") == control(master, "written")
    assert on_slave["lagBytes"] == 0
    route = cli("admin", "topic", "--topic", "Ha", "--endpoint", master.listen)
    assert route["brokerAddrs"] == {"0": master.listen, "1": slave.listen}


def test_consumer_offsets_and_topics_follow_the_master(pair):
    master, slave = pair.master, pair.slave
    with PullConsumer(master.listen) as consumer:
        consumer.commit("HaGroup", "Ha", 3, 42)
    with Producer(master.listen) as producer:
        producer.request({"code": protocol.UPDATE_AND_CREATE_TOPIC, "topic": "HaMade", "readQueueNums": 2,
                          "writeQueueNums": 2, "perm": 6})

    def synced():
        with PullConsumer(slave.listen) as on_slave:
            return on_slave.committed("HaGroup", "Ha", 3) == 42
    wait_until(synced, 20, "the offset on the slave")  # the master persists every 5 s, ships within 1 s
    assert "HaMade" in cli("admin", "topics", "--endpoint", slave.listen)


def test_a_topic_deleted_on_the_master_takes_its_messages_on_the_slave_too(pair):
    """The slave follows the master's topics.json with its deletion floors: a deleted topic's
    messages are no longer served there either, and its queue files go."""
    master, slave = pair.master, pair.slave
    with Producer(master.listen) as producer:
        producer.request({"code": protocol.UPDATE_AND_CREATE_TOPIC, "topic": "HaGone", "readQueueNums": 1,
                          "writeQueueNums": 1, "perm": 6})
        producer.send("HaGone", b"gone", queue_id=0)

    def on_slave() -> list[bytes]:
        with PullConsumer(slave.listen) as consumer:
            return [m.body for m in consumer.pull("HaGone", 0, 0).messages]
    wait_until(lambda: on_slave() == [b"gone"], 20, "the message on the slave")
    with Producer(master.listen) as producer:
        reply, _ = producer.request({"code": protocol.DELETE_TOPIC_IN_BROKER, "topic": "HaGone"})
        assert reply["status"] == "OK", reply
    wait_until(lambda: on_slave() == [] and not (slave.consumequeue_dir / "HaGone").exists(), 20,
               "the deletion on the slave")


def test_a_consumer_of_cold_data_reads_from_the_slave_and_comes_back(pair):
    master, slave = pair.master, pair.slave
    send_many(master.listen, 200, "HaRedirect", keys=False)
    wait_until(lambda: caught_up(slave, master))
    served_before = _pulls_served(slave)
    with PullConsumer(master.listen) as consumer:
        got = [m.body for m in consumer.consume("HaRedirect", "HaRedirectGroup", start="first", idle_timeout=2,
                                                limit=200)]
        assert sorted(got) == sorted(f"message-{i}".encode() * 20 for i in range(200))  # each once
        # the master said "slave" (all cold at ratio 0), the slave said "master" (all hot): both served
        assert consumer.inner.redirects >= 2
        wait_until(lambda: _pulls_served(slave) > served_before, 5, "the slave to have served pulls")
        assert consumer.committed("HaRedirectGroup", "HaRedirect", 0) is not None  # committed to the master


def _pulls_served(settings) -> int:
    with Producer(settings.listen) as producer:
        reply, _ = producer.request({"code": protocol.GET_BROKER_RUNTIME_INFO})
    return read_statistics(reply)["found"]


def test_garbage_on_the_ha_port_changes_nothing_stored(pair):
    master, slave = pair.master, pair.slave
    send_many(master.listen, 5)
    wait_until(lambda: caught_up(slave, master))
    written = control(master, "written")
    history = EpochFile(master.root).as_wire()
    context = zmq.Context.instance()
    attempts = [b"\x00garbage", b"Hnot json", b"R" + REPORT.pack(5),
                b"H" + orjson.dumps({"brokerId": 2, "maxOffset": 100, "epochs": [[0, 0, "f" * 16]]}),  # another history
                b"H" + orjson.dumps({"brokerId": 2, "maxOffset": written + 10**6, "epochs": history}),  # past the end
                b"H" + orjson.dumps({"brokerId": 1, "maxOffset": 0, "epochs": history})]  # the live slave's id
    refused_before = cli("admin", "stats", "--endpoint", master.listen)["actors"]["ha-server"]["refused"]
    for attempt in attempts:
        link = context.socket(zmq.DEALER)
        link.setsockopt(zmq.LINGER, 0)
        link.connect(f"tcp://127.0.0.1:{master.ha_port}")
        link.send(attempt)
        assert link.poll(5000), attempt
        assert link.recv()[:1] == b"X", attempt  # refused, with the reason
        link.close(0)

    def stats() -> dict:  # (each process reports once a second)
        return cli("admin", "stats", "--endpoint", master.listen)["actors"]["ha-server"]
    wait_until(lambda: stats()["refused"] - refused_before == len(attempts), 10, "the refusals counted")
    assert "brokerId 1" in stats()["lastError"]
    with socket.create_connection(("127.0.0.1", master.ha_port)) as raw:  # not even ZeroMQ
        raw.sendall(b"GET / HTTP/1.0\r\n\r\n" * 100)
    assert control(master, "written") == written  # nothing stored changed
    send_many(master.listen, 5)  # and the master serves, the slave follows
    wait_until(lambda: caught_up(slave, master))
    assert cli("admin", "ha", "--endpoint", master.listen)["slavesFollowing"] == 1


def test_sync_master_answers_once_the_slave_has_the_bytes(pair):
    master, slave = pair.master, pair.slave
    assert cli("admin", "role", "--role", "SYNC_MASTER", "--endpoint", master.listen)["role"] == "SYNC_MASTER"
    results = send_many(master.listen, 300)
    assert {r.status for r in results} == {"PUT_OK"}
    with Producer(slave.listen) as on_slave:  # each acknowledged record is on the slave already
        for result in results[-20:]:
            reply, body = on_slave.request({"code": protocol.VIEW_MESSAGE_BY_ID, "offsetMsgId": result.offset_msg_id})
            assert reply["status"] == "OK" and body, result
    assert cli("admin", "role", "--role", "ASYNC_MASTER", "--endpoint", master.listen)["role"] == "ASYNC_MASTER"


def test_a_topic_made_just_before_a_send_is_on_the_slave_once_the_send_is_acknowledged(pair):
    """The master ships a changed topics.json ahead of the records written after it: under
    SYNC_MASTER an acknowledged send's topic is on the slave (a promotion keeps it routed)."""
    master, slave = pair.master, pair.slave
    wait_until(lambda: control(master, "ha_slaves") == 1)
    assert cli("admin", "role", "--role", "SYNC_MASTER", "--endpoint", master.listen)["role"] == "SYNC_MASTER"
    try:
        with Producer(master.listen) as producer:
            for i in range(5):
                topic = f"HaFresh{time.monotonic_ns()}"
                reply, _ = producer.request({"code": protocol.UPDATE_AND_CREATE_TOPIC, "topic": topic,
                                             "readQueueNums": 2, "writeQueueNums": 2})
                assert reply["status"] == "OK", reply
                assert producer.send(topic, b"fresh", queue_id=i % 2).status == "PUT_OK"
                on_slave = config_files.read(slave.root / "config" / "topics.json") or {}
                assert topic in on_slave.get("topicConfigTable", {}), i
    finally:  # (back to the pair's role; cli() fails the test if it cannot)
        cli("admin", "role", "--role", "ASYNC_MASTER", "--endpoint", master.listen)


class Load:
    """Concurrent senders in a thread until stopped, each at most PER_SENDER a second (a few
    thousand a second in all: enough to cut transfers anywhere, few enough to verify quickly):
    every acknowledged offsetMsgId and status."""

    PER_SENDER = 200

    def __init__(self, endpoint: str, senders: int = 16):
        self.endpoint, self.senders = endpoint, senders
        self.acked: dict[str, str] = {}
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        async with AsyncProducer(self.endpoint, timeout=5.0, retries=0) as producer:
            async def sender(k: int) -> None:
                i = 0
                while not self.stop_event.is_set():
                    i += 1
                    try:
                        result = await producer.send("HaLoad", f"{k}-{i}".encode() * 30)
                        self.acked[result.offset_msg_id] = result.status
                    except SendError:
                        await asyncio.sleep(0.05)
                    await asyncio.sleep(1 / self.PER_SENDER)
            await asyncio.gather(*[sender(k) for k in range(self.senders)])

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.thread.join(30)


def test_a_slave_catches_up_after_every_kind_of_fault(pair):
    master, slave, master_node, slave_node = pair.master, pair.slave, pair.master_node, pair.slave_node
    with Load(master.listen):
        time.sleep(0.3)
        slave_node.actor_process("ha-client").kill()  # the link cut by the follower's death
        time.sleep(0.7)
        master_node.actor_process("ha-server").kill()  # ... by the master side's
        time.sleep(0.7)
        slave_node.kill_all()  # the slave's whole node
        slave_node.start()
        time.sleep(0.3)
    wait_until(lambda: caught_up(slave, master), 60, "the slave after the kills")
    assert_prefix(slave, master)
    master_node.kill_all()  # the master's whole node, under no load
    master_node.start()
    with Load(master.listen):
        time.sleep(0.5)
    wait_until(lambda: caught_up(slave, master), 60, "the slave after the master's restart")
    assert_prefix(slave, master)


def test_a_slave_on_a_full_disk_waits_for_room_and_then_catches_up(pair, tmp_path):
    """A second slave of the module's master, its store on a disk smaller than the master's log:
    the disk refuses a segment, the link closes (the ha-client lives on: dying, it would die at
    every restart), the slave's cleaning makes room (RocketMQ's ratios, forced) and the next
    connect goes on from its end, until it holds the master's end."""
    with small_disk(tmp_path / "small", "5m") as small:
        with Producer(pair.master.listen) as producer:  # ~2 MiB more: the master's log is over 5.5 MiB
            for _ in range(20):
                producer.send_batch("HaFull", [bytes(1024)] * 100)
        settings = node_settings(small / "store", runDir=str(tmp_path / "run"), brokerRole="SLAVE", brokerId=2,
                                 topology="compact",  # (fewer processes to start: the group commit a thread)
                                 haMasterAddress=f"127.0.0.1:{pair.master.ha_port}", haListenPort=free_port(),
                                 diskMaxUsedSpaceRatio=75, diskSpaceCleanForciblyRatio=0.85,
                                 diskSpaceWarningLevelRatio=0.9, cleanResourceInterval=500)
        node = NodeProcess(settings, tmp_path / "slave.log").start()
        try:
            try:
                wait_until(lambda: caught_up(settings, pair.master), 60, "the slave on a small disk")
            except AssertionError:  # (what the slave was waiting for, for whoever reads a CI log)
                counters = {name: control(settings, name) for name in ("written", "flushed", "dispatched", "min_offset")}
                files = subprocess.run(["du", "-a", str(small)], capture_output=True, text=True).stdout
                raise AssertionError(f"not caught up to {control(pair.master, 'written')}: {counters}\n"
                                     f"{files}\n{(tmp_path / 'slave.log').read_text()[-4000:]}") from None
            assert_prefix(settings, pair.master)
            assert control(settings, "min_offset") > 0  # (it did delete to make room)
            log = (tmp_path / "slave.log").read_text()
            assert "the disk is full" in log and "actor ha-client died" not in log, log[-3000:]
            assert node.stop() == 0
        finally:
            node.stop(strict=False)
        report = verify_store(settings)
        assert report.ok, report.summary()


def test_failover_keeps_every_acknowledged_send_and_fences_the_old_master(failover_pair):
    """SYNC_MASTER M, slave S. S stops (its goodbye: M's sends stop waiting for it at once); M
    goes on alone (SLAVE_NOT_AVAILABLE: stored on M only), then dies (kill -9). S is promoted:
    every send M answered PUT_OK is on S, and a pop group goes on from what it acked on M. M
    comes back as S's slave while S is down (its start cannot ask S's history); once S answers,
    M's node ends and its restart cuts the tail S never had: M's log is S's, and M's pop state is
    gone (S's is the group's now)."""
    pair = failover_pair
    m, s, m_node, s_node = pair.master, pair.slave, pair.master_node, pair.slave_node
    wait_until(lambda: control(m, "ha_slaves") == 1)
    popped_on_m = _pop_and_ack_some(m, s)
    assert cli("admin", "role", "--role", "SYNC_MASTER", "--endpoint", m.listen)["role"] == "SYNC_MASTER"
    with Load(m.listen) as load:
        wait_until(lambda: len(load.acked) > 500, 30)
        s_node.stop()
        wait_until(lambda: "SLAVE_NOT_AVAILABLE" in load.acked.values(), 5)
    report = verify_store(s)  # (stopped: its store as it lies)
    assert report.ok, report.faults
    acknowledged = {msg_id for msg_id, status in load.acked.items() if status == "PUT_OK"}
    alone = {msg_id for msg_id, status in load.acked.items() if status == "SLAVE_NOT_AVAILABLE"}
    m_node.kill_all()

    s_node.start()  # its master is gone: it starts anyway, and waits to be promoted
    began = time.monotonic()
    promoted = cli("admin", "role", "--role", "ASYNC_MASTER", "--endpoint", s.listen)
    wait_until(lambda: _sends(s.listen), 10, "the promoted slave to take sends")
    assert promoted["epoch"] == 1 and time.monotonic() - began < 5  # (the figure: scripts/bench-ha)
    with Producer(s.listen) as on_s:
        for msg_id in acknowledged:
            reply, _ = on_s.request({"code": protocol.VIEW_MESSAGE_BY_ID, "offsetMsgId": msg_id})
            assert reply["status"] == "OK", msg_id
    send_many(s.listen, 100, "AfterFailover", keys=False)
    with PullConsumer(s.listen) as on_s:  # (M's pop state is S's: acked stays acked, out of order too)
        again, deadline = [], time.monotonic() + 10
        while len(again) < 6 and time.monotonic() < deadline:
            try:
                again += on_s.pop("PopFailover", "popfail", max_count=32, queue_id=0, wait_ms=500)
            except SendError as e:  # (the moment S's pop service takes M's state over)
                assert e.status == "SYSTEM_BUSY", e
        assert [p.body for p in again] == [popped_on_m[i] for i in (12, 13, 16, 17, 18, 19)]
        assert {p.reconsume_times for p in again} == {1}  # (handed out once on M)
        assert on_s.pop("PopFailover", "popfail", max_count=32, queue_id=0, wait_ms=300) == []
    _stale_roles_cut_nothing(pair)

    # M back as S's slave while S is down: its start cannot ask S's history. Once S answers, M's
    # node ends (exit 1: "the restart cuts them") and its restart cuts the tail S never had.
    old_end = control(m, "written")
    assert pair.slave_node.stop() == 0
    m_slave = node_settings(m.root.parent, brokerRole="SLAVE", brokerId=1, haMasterAddress=f"127.0.0.1:{s.ha_port}",
                            haListenPort=m.haListenPort, storePathRootDir=str(m.root), listen=m.listen,
                            listenPort=m.listenPort, runDir=m.runDir)
    m_node = pair.start(NodeProcess(m_slave, pair.directory / "master.log"))
    assert "mqnode fencing skipped: the master" in (pair.directory / "master.log").read_text()
    assert control(m_slave, "written") == old_end  # (nothing cut yet)
    pair.start(NodeProcess(dataclasses.replace(s, brokerRole="ASYNC_MASTER", brokerId=0),
                           pair.directory / "new-master.log"))
    assert m_node.process.wait(30) == 1
    seen = (pair.directory / "master.log").stat().st_size
    assert f"mqnode failed: this slave's log holds {old_end - promoted['offset']} bytes" in \
        (pair.directory / "master.log").read_text()
    m_node.start()
    text = (pair.directory / "master.log").read_text()[seen:]
    assert "mqnode fencing: dropped" in text and old_end > promoted["offset"]
    wait_until(lambda: caught_up(m_slave, s), 60, "the old master to follow the new one")
    assert_prefix(m_slave, s)
    assert cli("admin", "ha", "--endpoint", m_slave.listen)["epoch"] == 2  # (its master's, adopted)
    with Producer(m_slave.listen) as on_m:
        for msg_id in list(alone)[:20]:  # what only the old master had is gone: its offsets hold
            reply, body = on_m.request({"code": protocol.VIEW_MESSAGE_BY_ID, "offsetMsgId": msg_id})
            if reply["status"] == "OK":  # the new master's records now, or nothing
                assert decode(body).topic != "HaLoad", msg_id
    assert [e.epoch for e in EpochFile(m_slave.root).entries] == [0, 1, 2]
    with PullConsumer(m_slave.listen) as on_m:
        assert on_m.pop_state("popfail") == {}  # made when it was the master: gone
    m_node.stop()
    report = verify_store(m_slave)
    assert report.ok, report.faults


def _stale_roles_cut_nothing(pair) -> None:
    """Both nodes brought back with the roles they were configured with (a stale toml, a name
    service that forgot the promotion): M a master, the promoted S its slave. S keeps every byte
    it took as the master and says why it does not follow; M, told by S's hello that it is an
    old master, takes no sends (they would be cut). S is promoted again (epoch 2)."""
    m, s, s_node = pair.master, pair.slave, pair.slave_node
    written = control(s, "written")
    assert s_node.stop() == 0
    m_node = pair.start(NodeProcess(m, pair.directory / "stale-master.log"))
    seen = s_node.log.stat().st_size
    s_node.start()
    text = s_node.log.read_text()[seen:]
    assert "was a master in epoch 1" in text and "nothing was cut" in text and "dropped" not in text, text[-3000:]
    assert control(s, "written") == written

    def refused() -> str:
        return cli("admin", "ha", "--endpoint", s.listen)["follower"].get("diverged", "")
    wait_until(lambda: "never knew" in refused(), 10, "the stale slave to say why it does not follow")
    assert control(s, "written") == written
    assert cli("admin", "ha", "--endpoint", m.listen)["supersededBy"] == 1
    with Producer(m.listen, retries=0) as on_m:
        with pytest.raises(SendError) as refused_send:
            on_m.send("Stale", b"would be cut")
    assert refused_send.value.status == "SERVICE_NOT_AVAILABLE" and "old master" in refused_send.value.remark
    assert cli("admin", "role", "--role", "ASYNC_MASTER", "--endpoint", s.listen)["epoch"] == 2
    assert m_node.stop() == 0


def _pop_and_ack_some(m, s) -> list[bytes]:
    """20 messages popped on M by group popfail, invisible for 3 s; the first 12 acked and 14
    and 15 too: the pop service commits its progress as the group's offset (12), which reaches S
    with the configs, and S's copy of M's pop log has every ack."""
    with Producer(m.listen) as producer:
        producer.send_batch("PopFailover", [f"p{i}".encode() for i in range(20)], queue_id=0)
    with PullConsumer(m.listen) as on_m:
        popped, deadline = [], time.monotonic() + 10
        while len(popped) < 20 and time.monotonic() < deadline:  # (a pop answers what it finds: maybe a part)
            popped += on_m.pop("PopFailover", "popfail", max_count=20 - len(popped), queue_id=0, wait_ms=500,
                               invisible_ms=3000)
        assert [p.queue_offset for p in popped] == list(range(20))
        assert on_m.ack_batch(popped[:12] + popped[14:16]) == [True] * 14

    def synced():
        with PullConsumer(s.listen) as on_s:
            return on_s.committed("popfail", "PopFailover", 0) == 12
    wait_until(synced, 20, "the pop group's offset on the slave")  # (the master persists them every second)
    wait_until(lambda: _stats(s)["ha-client"]["popReplica"]["bytes"] == _stats(m)["pop"]["log"]["journalBytes"], 10,
               "the slave's copy of the pop log")
    return [p.body for p in popped]


def _stats(settings) -> dict:
    with Producer(settings.listen) as producer:
        reply, _ = producer.request({"code": protocol.GET_BROKER_RUNTIME_INFO})
    return reply["actors"]


def _sends(endpoint: str) -> bool:
    try:
        return send_many(endpoint, 1, "Promoted", keys=False)[0].status == "PUT_OK"
    except SendError:
        return False


# -- RocketMQ's link ----------------------------------------------------------------------------------


def test_the_rocketmq_link_is_spoken_as_rocketmq_4_does(tmp_path):
    """A RocketMQ 4.x slave, byte by byte: an 8-byte report of 0 (an empty slave) gets the
    master's last segment in 12-byte-headed transfers, and its report is the master's ack. (The
    other way round, an mqnode slave of a RocketMQ master: the next test.)"""
    master = master_settings(tmp_path, haProtocol="rocketmq")
    master_node = NodeProcess(master, tmp_path / "master.log").start()
    try:
        send_many(master.listen, 2500, keys=False)
        written = control(master, "written")
        segment = master.mappedFileSizeCommitLog
        last = written - written % segment
        with socket.create_connection(("127.0.0.1", master.ha_port), timeout=10) as raw:
            raw.sendall(REPORT.pack(0))
            got, at = bytearray(), last
            while at < written:
                header = read_exactly(raw, HEADER.size)
                offset, size = HEADER.unpack(header)
                assert offset == at and 0 <= size <= master.haTransferBatchSize
                got += read_exactly(raw, size)
                at += size
            assert bytes(got) == log_bytes(master, last, written)
            raw.sendall(REPORT.pack(written))  # the ack: SYNC_MASTER would count it
            wait_until(lambda: control(master, "slave_acked") == written, 5)
            send_many(master.listen, 10, keys=False)  # what follows comes unasked
            offset, size = HEADER.unpack(read_exactly(raw, HEADER.size))
            assert offset == written and size > 0
    finally:
        master_node.stop(strict=False)


def test_an_mqnode_slave_follows_a_rocketmq_master(tmp_path):
    """A RocketMQ 4.9 master as §12 specifies it, serving the golden store's CommitLog (written by
    RocketMQ 4.9.8): the mqnode slave's log ends byte for byte as RocketMQ's, and verifies."""
    golden = b"".join(f.read_bytes() for f in sorted((GOLDEN_STORE / "commitlog").iterdir()))
    segment = GOLDEN_SETTINGS["mappedFileSizeCommitLog"]
    end = manifest()["maxPhyOffset"]
    master = FakeRocketMQMaster(golden[:end], segment)
    port = master.port
    slave = node_settings(tmp_path / "slave", brokerRole="SLAVE", brokerId=1, haMasterAddress=f"127.0.0.1:{port}",
                          haProtocol="rocketmq", haListenPort=free_port(), **GOLDEN_SETTINGS)
    slave_node = NodeProcess(slave, tmp_path / "slave.log").start()
    try:
        wait_until(lambda: control(slave, "written") == end and control(slave, "dispatched") == end, 60)
        first = end - end % segment
        assert log_bytes(slave, first, end) == golden[first:end]
    finally:
        slave_node.stop(strict=False)
        master.close()
    report = verify_store(slave)
    assert report.ok, report.faults


def test_a_master_and_its_slave_on_ipv6_serve_and_follow(tmp_path):
    """`listen = tcp://[::1]:P`: ZeroMQ binds and connects to an IPv6 address only on a socket told
    it may (node.protocol.ipv6_ready); before, the front failed its bind ("No such device") at
    every restart and the node never started. The records' store host is IPv6 (RocketMQ's
    STOREHOSTADDRESS_V6_FLAG: a 56-digit offsetMsgId), and the HA link runs over it too. The slave
    listens on every interface (`[::]`): its launcher's own asks go to loopback (local_endpoint)."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    port, slave_port = free_port(), free_port()
    master = node_settings(tmp_path / "master", listen=f"tcp://[::1]:{port}", listenPort=port, haListenPort=free_port())
    slave = node_settings(tmp_path / "slave", listen=f"tcp://[::]:{slave_port}", listenPort=slave_port,
                          haListenPort=free_port(), brokerRole="SLAVE", brokerId=1,
                          haMasterAddress=f"[::1]:{master.ha_port}")
    nodes = [NodeProcess(master, tmp_path / "master.log"), NodeProcess(slave, tmp_path / "slave.log")]
    try:
        for node in nodes:
            node.start()
        assert f"ha=[::1]:{master.ha_port}" in nodes[0].log.read_text().split()  # (its ready line)
        sent = send_many(f"[::1]:{port}", 20, "Six")  # (RocketMQ's host:port form)
        assert len(sent[0].offset_msg_id) == 56 and {r.status for r in sent} == {"PUT_OK"}
        wait_until(lambda: caught_up(slave, master), 30, "the slave over IPv6")
        assert_prefix(slave, master)
        with PullConsumer(f"127.0.0.1:{slave_port}") as consumer:  # (every interface's: IPv4 too)
            assert consumer.view(sent[3].offset_msg_id).body == b"message-3" * 20
    finally:
        for node in reversed(nodes):
            node.stop(strict=False)
