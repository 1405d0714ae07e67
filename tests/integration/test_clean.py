"""The clean service end to end, with real `mqnode start` processes on 1 MiB segments: `admin clean`
deletes aged segments and the files below them, readers answer from the new bounds and drop their
mappings, the store verifies and restarts to the same state; a full disk refuses sends and takes
them again once space is back, without a restart."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import orjson
import pytest
from nodes import HOST_DISK_BLIND, ROOT, NodeProcess, node_settings, small_disk

from node import protocol
from node.client import Message, Producer, PullConsumer, SendError
from shm.settings import Settings
from shm.verify import verify_store

pytestmark = pytest.mark.slow
DAY_NS = 24 * 3600 * 10**9
DISK_OF_ITS_OWN = {name: getattr(Settings(), name) for name in HOST_DISK_BLIND}  # the defaults' disk ratios


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node.tools.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=180)


def _stats(node) -> dict:
    done = _cli("admin", "stats", "--endpoint", node.endpoint)
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout)


def _fill(endpoint: str, batches: int) -> list[str]:
    """~2 KiB messages in batches of 100 over four queues, keyed k-<n>; returns the keys in order."""
    keys = []
    with Producer(endpoint, timeout=10.0) as producer:
        for b in range(batches):
            items = [Message("Clean", bytes([b % 251]) * 2000, keys=f"k-{b * 100 + i}") for i in range(100)]
            producer.send_batch("Clean", items, queue_id=b % 4)
            keys += [f"k-{b * 100 + i}" for i in range(100)]
    return keys


def _deleted_topic(node, topic: str) -> None:
    """`topic` created with two queues, a message sent to each, then deleted."""
    assert _cli("admin", "topic", "create", "--endpoint", node.endpoint, "--topic", topic, "--queues", "2").returncode == 0
    with Producer(node.endpoint) as producer:
        for queue in range(2):
            assert producer.send(topic, b"soon gone", queue_id=queue).status == "PUT_OK"
    with PullConsumer(node.endpoint) as consumer:  # a pull worker maps its queues
        assert consumer.pull(topic, 1, 0).status == "FOUND"
    assert _cli("admin", "topic", "delete", "--endpoint", node.endpoint, "--topic", topic).returncode == 0


def _mapped_deleted(node) -> list[str]:
    """Store files the node's processes still map after they were deleted."""
    found = []
    for process in node.tree():
        try:
            with open(f"/proc/{process.pid}/maps") as maps:
                found += [line.split()[-2] for line in maps
                          if line.rstrip().endswith("(deleted)") and str(node.settings.root) in line]
        except OSError:
            continue
    return found


def test_admin_clean_moves_every_bound_and_the_store_restarts_to_the_same_state(tmp_path):
    # deleteWhen twelve hours from now: the segments made old below are the clean service's own to
    # delete in its hour (04 by default: a run at 04:xx saw some go as "time", not "manual")
    away = f"{(time.localtime().tm_hour + 12) % 24:02d}"
    settings = node_settings(tmp_path / "store", runDir=str(tmp_path / "run"), cleanResourceInterval=300,
                             deleteCommitLogFilesInterval=5, deleteConsumeQueueFilesInterval=5, deleteWhen=away)
    node = NodeProcess(settings, tmp_path / "node.log").start()
    try:
        _deleted_topic(node, "Gone")  # its messages in the first segment
        keys = _fill(node.endpoint, 60)  # ~12 MiB: a dozen segments
        _deleted_topic(node, "GoneLate")  # in the last
        segments = sorted(p for p in settings.commitlog_dir.iterdir() if p.name.isdigit())  # (not one being made)
        assert len(segments) >= 10
        nothing = orjson.loads(_cli("admin", "clean", "--endpoint", node.endpoint).stdout)
        assert nothing["count"] == 0  # nothing is old enough yet
        old = time.time_ns() - 4 * DAY_NS  # four days: past the 72 h of fileReservedTime
        for path in segments:
            os.utime(path, ns=(old, old))
        # a segment goes only once flushed and dispatched whole (`stopped` says so): the last pages
        # wait for the thorough flush (flushCommitLogThoroughInterval, 10 s), longer on a busy machine
        # (over calls: a call deletes the oldest segments as far as they are flushed and dispatched,
        # and a busy machine's dispatcher may stand a few segments behind at the first that deletes any)
        deadline, deleted = time.monotonic() + 60, []
        while True:
            done = _cli("admin", "clean", "--endpoint", node.endpoint)
            assert done.returncode == 0, done.stderr
            report = orjson.loads(done.stdout)
            deleted += report["deleted"]
            if len(deleted) >= 5 or time.monotonic() > deadline:
                break
            assert report["stopped"] == "the oldest segment is not yet flushed and dispatched whole", report
            time.sleep(0.5)
        left = sorted(p for p in settings.commitlog_dir.iterdir() if p.name.isdigit())
        assert len(deleted) >= 5 and left and not {d["file"] for d in deleted} & {p.name for p in left}
        assert {d["cause"] for d in deleted} == {"manual"}
        assert [d["file"] for d in deleted] == [p.name for p in segments[:len(deleted)]]
        min_offset = int(left[0].name)

        queues = settings.consumequeue_dir
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            stats = _stats(node)
            clean = stats["actors"].get("clean", {})
            if clean.get("deletedFiles", {}).get("manual") == len(deleted) and not _mapped_deleted(node) \
                    and not (queues / "Gone").exists():
                break
            time.sleep(0.2)
        # a deleted topic's queues go at its deletion (the dispatcher drops them, below its deletion
        # floor; a pull worker that read them, its views): before, each kept its last file, and a
        # mapping and a descriptor in the dispatcher, for good
        assert not (queues / "Gone").exists() and not (queues / "GoneLate").exists()
        assert clean["deletedFiles"]["manual"] == len(deleted) and clean["minOffset"] == min_offset
        assert stats["control"]["min_offset"] == min_offset
        assert stats["services"]["clean"][0]["process"] == "clean"
        assert _mapped_deleted(node) == []  # every process dropped what was deleted: the space is free
        # (every process has followed the deletion now: with several pull workers, each follows it at
        # its own next turn, so a min offset asked just before could come from one that had not yet)
        with PullConsumer(node.endpoint) as consumer:
            low = consumer.min_offset("Clean", 0)
            assert low > 0
            below = consumer.pull("Clean", 0, 0)
            assert below.status == "OFFSET_ILLEGAL" and below.next_begin_offset == low
            first = consumer.pull("Clean", 0, low, max_count=1)
            assert first.status == "FOUND" and first.messages[0].queue_offset == low
            assert consumer.query("Clean", keys[0]) == []  # its record is gone
            assert [m.keys for m in consumer.query("Clean", keys[-1])] == [[keys[-1]]]
        with PullConsumer(node.endpoint) as consumer:
            bounds = [(consumer.min_offset("Clean", q), consumer.max_offset("Clean", q)) for q in range(4)]
        assert node.stop() == 0
        verified = verify_store(settings)
        assert verified.ok, verified.summary()

        node = NodeProcess(settings, tmp_path / "node.log").start()  # the same state after a restart
        with PullConsumer(node.endpoint) as consumer:
            assert [(consumer.min_offset("Clean", q), consumer.max_offset("Clean", q)) for q in range(4)] == bounds
            assert consumer.pull("Clean", 0, 0).next_begin_offset == bounds[0][0]
        assert not (queues / "Gone").exists()
        with Producer(node.endpoint) as producer:  # sent to again after a start (created anew): numbered on
            assert producer.send("Gone", b"again", queue_id=1).queue_offset == 1
    finally:
        node.stop(strict=False)


def test_a_full_disk_refuses_sends_and_takes_them_again_when_space_is_back(tmp_path):
    with small_disk(tmp_path / "small", "16m") as small:
        settings = node_settings(small / "store", runDir=str(tmp_path / "run"), cleanResourceInterval=200,
                                 fileReservedTime=1000.0, **DISK_OF_ITS_OWN)  # nothing expires: only space matters
        node = NodeProcess(settings, tmp_path / "node.log").start()
        with Producer(node.endpoint, timeout=5.0, retries=0) as producer:
            producer.send("Full", b"before")
            foreign = small / "foreign"
            free = os.statvfs(small).f_bavail * os.statvfs(small).f_frsize
            with open(foreign, "wb") as f:  # someone else fills the disk to ~95 %
                f.write(bytes(max(0, free - 800 * 1024)))
            status = _until_refused(producer)
            assert status.status == "SERVICE_NOT_AVAILABLE" and "disk is full" in status.remark
            with PullConsumer(node.endpoint) as consumer:  # reads go on
                assert consumer.pull("Full", 0, 0).status in ("FOUND", "NO_NEW_MSG", "OFFSET_ILLEGAL")
            foreign.unlink()
            deadline = time.monotonic() + 10
            while True:
                try:
                    producer.send("Full", b"after")
                    break
                except SendError as e:
                    assert e.status == "SERVICE_NOT_AVAILABLE" and time.monotonic() < deadline
                    time.sleep(0.1)
        deadline = time.monotonic() + 5
        while _stats(node)["actors"]["clean"]["diskFull"] and time.monotonic() < deadline:
            time.sleep(0.3)  # statistics reach the front once a second
        assert _stats(node)["actors"]["clean"]["diskFull"] is False
        assert node.stop() == 0
        verified = verify_store(settings)
        assert verified.ok, verified.summary()


def test_a_store_on_a_small_disk_sized_by_the_start_rule_takes_four_disks_of_sends(tmp_path):
    """The segment size `mqnode start` advises for a small disk (preflight.store_disk_needs) makes
    a store that keeps taking sends through its cleaning, nothing expiring (only space matters):
    four times the disk goes through it; a send refused while the cleaner catches up is taken when
    sent again. (The two-segment rule it replaced let 546 MiB segments on a 1.5 GB disk: 237 MiB
    taken, then every send refused for good, the segment being written all the cleaner could not
    delete and the index file holding the rest.)"""
    from node.server.preflight import store_disk_too_small
    from shm.disk import capacity_bytes

    with small_disk(tmp_path / "small", "24m") as small:
        # an index file a quarter of the disk, as RocketMQ's default one (420 MB) is of a 1.5 GB disk
        sizes = dict(DISK_OF_ITS_OWN, cleanResourceInterval=200, fileReservedTime=1000.0, maxHashSlotNum=100_000,
                     maxIndexNum=300_000)
        settings = node_settings(small / "store", runDir=str(tmp_path / "run"), **sizes, mappedFileSizeCommitLog=64 << 20)
        advice = store_disk_too_small(settings, capacity_bytes(small))
        segment = int(advice.rsplit("at most ", 1)[1].split()[0]) << 20
        settings = node_settings(small / "store", runDir=str(tmp_path / "run"), **sizes, mappedFileSizeCommitLog=segment)
        node = NodeProcess(settings, tmp_path / "node.log").start()
        body, taken = b"s" * 16384, 0
        with Producer(node.endpoint, timeout=5.0, retries=0) as producer:
            while taken < 4 * capacity_bytes(small):
                deadline = time.monotonic() + 10
                while True:
                    try:
                        producer.send_batch("Small", [body] * 16)
                        break
                    except SendError as e:
                        assert e.status in ("CREATE_MAPEDFILE_FAILED", "SERVICE_NOT_AVAILABLE"), e
                        assert time.monotonic() < deadline, f"refused for 10 s after {taken} bytes: {e}"
                        time.sleep(0.05)
                taken += 16 * len(body)
        assert node.stop() == 0
        verified = verify_store(settings)
        assert verified.ok, verified.summary()


def _until_refused(producer, timeout: float = 10.0) -> SendError:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            producer.send("Full", b"x")
        except SendError as e:
            return e
        time.sleep(0.05)
    raise AssertionError("sends were never refused")


def test_admin_clean_checks_its_fields():
    from actors.edge import check_request

    with pytest.raises(protocol.ProtocolError, match="force"):
        check_request(protocol.Request({"code": protocol.DELETE_EXPIRED_COMMITLOG, "force": "yes"}, b""))


def consumer_low(node) -> int:
    with PullConsumer(node.endpoint) as consumer:
        return consumer.min_offset("Clean", 0)


def test_a_kill_during_forced_cleaning_restarts_to_a_sound_store(tmp_path):
    """kill -9 of every process while the clean service deletes (forced: the disk 'full' by a
    forcible ratio below its use): the restarted node's bounds come from the files, the store
    verifies, and nothing still stored is lost."""
    settings = node_settings(tmp_path / "store", runDir=str(tmp_path / "run"), cleanResourceInterval=200,
                             deleteCommitLogFilesInterval=50, diskSpaceCleanForciblyRatio=0.01,
                             diskMaxUsedSpaceRatio=10, diskSpaceWarningLevelRatio=1.0)
    node = NodeProcess(settings, tmp_path / "node.log").start()
    try:
        _fill(node.endpoint, 60)
        deadline = time.monotonic() + 20
        while len([p for p in settings.commitlog_dir.iterdir() if p.name.isdigit()]) > 8 and time.monotonic() < deadline:
            time.sleep(0.02)
        node.kill_all()  # mid-clean: some segments gone, the rest still there
        left = sorted(int(p.name) for p in settings.commitlog_dir.iterdir() if p.name.isdigit())
        verified = verify_store(settings)
        assert verified.ok, verified.summary()
        node = NodeProcess(settings, tmp_path / "node.log").start()
        with PullConsumer(node.endpoint) as consumer:
            for q in range(4):
                low, high = consumer.min_offset("Clean", q), consumer.max_offset("Clean", q)
                assert high > 0 and low <= high
                if low < high:  # what is still stored reads back whole, from its first offset
                    found = consumer.pull("Clean", q, low, max_count=8)
                    assert found.status == "FOUND" and found.messages[0].queue_offset == low
                    assert found.messages[0].commit_log_offset >= left[0]
        queue_files = lambda: sorted((settings.consumequeue_dir / "Clean" / "0").iterdir())  # noqa: E731
        deadline = time.monotonic() + 10  # the restarted clean service finishes what the kill cut short
        while int(queue_files()[0].name) // 20 + 300 <= consumer_low(node) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert int(queue_files()[0].name) // 20 + 300 > consumer_low(node)
    finally:
        node.stop(strict=False)
