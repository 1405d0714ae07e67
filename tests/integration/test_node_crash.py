"""Crashes and a full disk, with real `mqnode start` processes (each with its own embedded Ray,
so kill -9 can take every process of the node at once)."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import re
import threading
import time

import pytest
from nodes import NodeProcess, node_settings, small_disk

from node import protocol
from node.client import AsyncProducer, PullConsumer, SendError
from node.server import topology as topology_module
from shm.codec import Record, decode_msg_id
from shm.control_block import ControlBlock
from shm.store import MessageStore
from shm.verify import verify_store

pytestmark = pytest.mark.slow


class Load:
    """Concurrent senders in a thread until stopped; remembers every acknowledged message."""

    def __init__(self, endpoint: str, *, senders: int = 32, topic: str = "Crash"):
        self.endpoint, self.senders, self.topic = endpoint, senders, topic
        self.acked: dict[str, bytes] = {}  # offsetMsgId -> body
        self.failures: dict[str, int] = {}
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        async with AsyncProducer(self.endpoint, timeout=2.0, retries=1, linger_ms=0.5) as producer:
            async def sender(k: int) -> None:
                i = 0
                while not self.stop_event.is_set():
                    body = f"sender-{k}-message-{i}".encode()
                    i += 1
                    try:
                        result = await producer.send(self.topic, body)
                        self.acked[result.offset_msg_id] = body
                    except SendError as e:
                        self.failures[e.status] = self.failures.get(e.status, 0) + 1
                        await asyncio.sleep(0.05)

            await asyncio.gather(*[sender(k) for k in range(self.senders)])

    def start(self) -> Load:
        self.thread.start()
        return self

    def wait_for(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < count:
            assert time.monotonic() < deadline, f"only {len(self.acked)} acks, failures {self.failures}"
            time.sleep(0.05)

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "a client hung"


def assert_all_acked_stored(settings, acked: dict[str, bytes]) -> None:
    with MessageStore(settings, readonly=True) as store:
        for offset_id, body in acked.items():
            _, offset = decode_msg_id(offset_id)
            record = store.commitlog.read(offset, check_crc=True)
            assert isinstance(record, Record) and record.body == body, (offset_id, record)


# each topology and each flush mode once (the four pairs cost the suite a minute, and what a pair
# adds is covered: the front's flush thread and the flush process by the SYNC_FLUSH tests below)
@pytest.mark.parametrize(("flush", "topology"), [("ASYNC_FLUSH", "compact"), ("SYNC_FLUSH", "split")])
def test_kill_9_of_every_process_loses_no_acknowledged_message(tmp_path, flush, topology):
    """The conformance suite's crash part, over both topologies (tests/integration/test_node.py has the
    produce / consume / query / offsets part, the write-buffer and SYNC_FLUSH tests below theirs)."""
    settings = node_settings(tmp_path / "store", flushDiskType=flush, topology=topology)
    node = NodeProcess(settings, tmp_path / "node.log").start()
    load = Load(node.endpoint).start()
    load.wait_for(2000)
    node.kill_all()  # mid-stream: sends are in flight at every stage
    load.stop()
    acked = dict(load.acked)
    assert (settings.root / "abort").exists()
    node = NodeProcess(settings, tmp_path / "node.log").start()
    ready = [line for line in (tmp_path / "node.log").read_text().splitlines() if line.startswith("mqnode ready")]
    assert "recovery=abnormal" in ready[-1]
    # queues and index were completed from the CommitLog: every acked message can be pulled and found
    with PullConsumer(node.endpoint) as consumer:
        pulled = {m.offset_msg_id: m for m in consumer.consume("Crash", "after-crash", start="first", idle_timeout=2)}
        assert {i: m.body for i, m in pulled.items() if i in acked} == acked
        for offset_id in list(acked)[:: max(1, len(acked) // 20)]:
            found = consumer.query("Crash", pulled[offset_id].msg_id)  # by UNIQ_KEY, through the index
            assert offset_id in {m.offset_msg_id for m in found}
    assert node.stop() == 0
    # SYNC_FLUSH: every PUT_OK was fsync'd. ASYNC_FLUSH: a process kill leaves the page cache, so
    # the acknowledged messages are there too; only the host's power could take them.
    assert_all_acked_stored(settings, acked)
    report = verify_store(settings)
    assert report.ok, report.summary()


@pytest.mark.parametrize("topology", ["compact", "split"])
def test_sync_flush_acks_follow_their_fdatasync_and_a_killed_writer_or_flusher_loses_nothing(tmp_path, topology):
    """SYNC_FLUSH, each topology on one node. First: when a PUT_OK reaches the client, the
    control block's `flushed` (advanced only after fdatasync returns) is already past the
    message, also when a WAIT=false send (every tenth) shares its coalesced request; in the
    compact topology a thread of the front flushes and no flush process runs, in the split one
    the flush actor does. Then, under load, the processes that write or flush are killed one by
    one (split: the flush actor, the ingress worker, the writer; compact: the front, the
    CommitLog's writer, twice): Ray restarts each, the restarted writer scrubs what its
    predecessor left past `written`, the node serves again, every PUT_OK is stored and the store
    verifies."""
    compact = topology == "compact"
    settings = node_settings(tmp_path / "store", flushDiskType="SYNC_FLUSH", topology=topology,
                             **({} if compact else {"ingressWorkers": 1}))
    assert topology_module.hosts(settings)["write"] == (["front"] if compact else ["writer"])
    node = NodeProcess(settings, tmp_path / "node.log").start()
    try:
        assert ("flush" in node.actor_labels()) is not compact and ("writer" in node.actor_labels()) is not compact
        _acks_follow_their_fdatasync(node, settings, flush_in_front=compact)
        load = Load(node.endpoint).start()
        for label in ("front", "front") if compact else ("flush", "ingress-0", "writer"):
            load.wait_for(len(load.acked) + 500)
            victim = node.actor_process(label)
            victim.kill()
            victim.wait(10)
            before = len(load.acked)
            load.wait_for(before + 500, timeout=60)  # Ray restarted it and the node serves again
            assert node.actor_process(label).pid != victim.pid
        load.stop()
    finally:
        assert node.stop() == 0
    assert_all_acked_stored(settings, load.acked)
    report = verify_store(settings)
    assert report.ok, report.summary()


def _acks_follow_their_fdatasync(node, settings, *, flush_in_front: bool) -> None:
    control = ControlBlock(settings.root / "control")
    behind: list[tuple[int, int]] = []

    async def main() -> dict:
        async with AsyncProducer(node.endpoint, timeout=10.0) as producer:
            async def sender(k: int) -> None:
                for i in range(150):
                    result = await producer.send("Durable", f"{k}-{i}".encode() * 40, wait=i % 10 != 0)
                    assert result.status == "PUT_OK"
                    _, offset = decode_msg_id(result.offset_msg_id)
                    if i % 10 and control.get("flushed") <= offset:
                        behind.append((offset, control.get("flushed")))

            await asyncio.gather(*[sender(k) for k in range(24)])
            for _ in range(40):  # a flush actor's statistics reach the front once a second
                reply, _ = await producer.request({"code": protocol.GET_BROKER_RUNTIME_INFO})
                if reply["actors"]["flush"]["answered"]:
                    break
                await asyncio.sleep(0.1)
            return reply["actors"]

    try:
        actors = asyncio.run(main())
    finally:
        control.close()
    stats = actors["flush"]
    assert behind == [], f"{len(behind)} acks came before their flush, e.g. {behind[:3]}"
    # (a coalesced request of many sends is held, and answered, as one)
    assert stats["mode"] == "SYNC_FLUSH" and 0 < stats["answered"] <= 24 * 135 and stats["flushDiskTimeouts"] == 0
    assert (stats["pid"] == actors["front"]["pid"]) is flush_in_front


@pytest.mark.parametrize("topology", ["compact", "split"])
def test_write_buffer_mode_acks_before_commit_and_a_writer_crash_loses_only_the_uncommitted(tmp_path, topology):
    from shm.control_block import ControlBlock

    settings = node_settings(tmp_path / "store", transientStorePoolEnable=True, commitIntervalCommitLog=60000,
                             commitCommitLogThoroughInterval=60000, commitCommitLogLeastPages=100000,
                             topology=topology)
    node = NodeProcess(settings, tmp_path / "node.log").start()

    async def send(count: int, prefix: str) -> dict[str, bytes]:
        async with AsyncProducer(node.endpoint, timeout=5.0) as producer:
            acked = {}
            for i in range(count):
                body = f"{prefix}-{i}".encode()
                acked[(await producer.send("Buffered", body)).offset_msg_id] = body
            return acked

    committed = asyncio.run(send(1, "first"))  # the first append commits at once (the thorough commit)
    buffered = asyncio.run(send(50, "buffered"))
    control = ControlBlock(settings.root / "control")
    written = control.get("written")
    control.close()
    assert all(decode_msg_id(i)[1] >= written for i in buffered)  # acked, not yet readable
    victim = node.actor_process("front" if topology == "compact" else "writer")
    victim.kill()
    victim.wait(10)
    after = asyncio.run(send(5, "after"))  # the restarted writer serves again
    assert node.stop() == 0  # a clean stop commits what waits
    assert_all_acked_stored(settings, committed | after)
    with MessageStore(settings, readonly=True) as store:
        bodies = {r.body for r in store.commitlog.iterate(0, read_body=True) if isinstance(r, Record)}
    assert not bodies & set(buffered.values())  # the crash took exactly the uncommitted part
    report = verify_store(settings)
    assert report.ok, report.summary()


def test_a_full_disk_gives_clear_statuses_and_no_corruption(tmp_path):
    with small_disk(tmp_path / "small", "5m") as small:
        # the offsets, the timer checkpoint and the cleaner's look at the disk every half second; no
        # forced cleaning (it would free space at moments of its own)
        settings = node_settings(small / "store", runDir=str(tmp_path / "run"), flushConsumerOffsetInterval=500,
                                 cleanResourceInterval=500, timerFlushIntervalMs=500, cleanFileForciblyEnable=False)
        node = NodeProcess(settings, tmp_path / "node.log").start()

        async def fill() -> tuple[int, dict[str, int]]:
            ok, statuses = 0, {}
            async with AsyncProducer(node.endpoint, timeout=5.0, retries=0) as producer:
                for _ in range(20000):
                    try:
                        await producer.send("Full", b"z" * 4000)
                        ok += 1
                    except SendError as e:
                        statuses[e.status] = statuses.get(e.status, 0) + 1
                        if sum(statuses.values()) > 50:
                            break
            return ok, statuses

        ok, statuses = asyncio.run(fill())
        assert ok > 100
        assert set(statuses) <= {"CREATE_MAPEDFILE_FAILED", "SERVICE_NOT_AVAILABLE"} and statuses, statuses
        _not_a_byte_left(small / "filler")
        _full_disk_requests(node, expect_offset=7)
        assert node.stop() == 0
        assert not _deaths(tmp_path / "node.log"), "a service died of the full disk"

        # a start on the full disk: its run directory elsewhere it serves reads; there, it says why not
        started = NodeProcess(settings, tmp_path / "again.log").start()
        _full_disk_requests(started, expect_offset=9)
        (small / "filler").unlink()  # room again: the offset kept in memory is written
        offsets = small / "store" / "config" / "consumerOffset.json"
        _wait_for(lambda: offsets.exists() and '"Full@G":{0:9}' in offsets.read_text().replace("\t", "").replace("\n", ""))
        assert started.stop() == 0 and not _deaths(tmp_path / "again.log")
        _not_a_byte_left(small / "filler")
        inside = dataclasses.replace(settings, runDir=str(small / "store" / "run"))
        with pytest.raises(RuntimeError, match="node exited 2: .* bytes free, under the 4 MiB"):
            NodeProcess(inside, tmp_path / "inside.log").start()
        report = verify_store(settings)
        assert report.ok, report.summary()


def _not_a_byte_left(filler) -> None:
    try:
        with open(filler, "wb") as f:
            while True:
                f.write(b"f" * 4096)
                f.flush()
    except OSError as e:
        assert e.errno == errno.ENOSPC


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.1)


def _deaths(log) -> list[str]:
    return re.findall(r"actor \S+ died|service \S+ restarted|supervision thread failed", log.read_text())


def _full_disk_requests(node, *, expect_offset: int) -> None:
    """Not a byte free on the store's disk: reads are served, offsets committed, sends and pops
    refused with a status, and no service dies of a file it cannot write (the consumer offsets,
    the timer checkpoint, a new group's or topic's config) in the second that follows."""
    consumer = PullConsumer(node.endpoint)
    assert consumer.pull("Full", 0, 0, max_count=4).messages
    consumer.commit("G", "Full", 0, expect_offset)
    assert consumer.committed("G", "Full", 0) == expect_offset
    with pytest.raises(SendError) as refused:
        consumer.pop("Full", "PopGroup", max_count=4, invisible_ms=5000)
    assert refused.value.status == "SERVICE_NOT_AVAILABLE" and "disk is full" in str(refused.value)

    async def send() -> str:
        async with AsyncProducer(node.endpoint, timeout=5.0, retries=0) as producer:
            try:
                return (await producer.send("NewOnAFullDisk", b"x")).status
            except SendError as e:
                return e.status

    assert asyncio.run(send()) in ("PUT_OK", "SERVICE_NOT_AVAILABLE", "CREATE_MAPEDFILE_FAILED")
    time.sleep(1.5)
    assert node.process.poll() is None
