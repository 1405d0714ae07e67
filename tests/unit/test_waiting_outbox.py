"""The read side's links: WaitingOutbox (requests wait, in order and within bounds, while a
service's ring is full, and are given back for refusal past their patience), SpreadOutbox over
real rings, and the launcher's making of the rings."""

from __future__ import annotations

import contextlib
import os
import shutil
from types import SimpleNamespace

import orjson
import pytest

from actors.links import Inbox, Outbox, SpreadOutbox, WaitingOutbox
from actors.wire import read_from_wire, read_to_wire
from shm import ring
from shm import settings as settings_module
from shm.mapped_file import StoreError


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


def _node(tmp_path, **values):
    """The settings of a node whose run directory is `tmp_path`, with its rings made."""
    s = settings_module.load(None, {"runDir": str(tmp_path), **{k: str(v) for k, v in values.items()}})
    ring.make_rings(s)
    return s


@contextlib.contextmanager
def _two_pull_workers(tmp_path, **spread):
    """The front's SpreadOutbox to two pull workers, and the workers' inboxes."""
    s = _node(tmp_path, pullWorkers=2)
    out = SpreadOutbox([Outbox(s, f"front-to-pull-{i}", read_to_wire) for i in range(2)], **spread)
    workers = [Inbox(s, f"pull-{i}", read_from_wire) for i in range(2)]
    try:
        yield out, workers
    finally:
        out.close()
        for worker in workers:
            worker.close()
        shutil.rmtree(ring.ring_dir(s), ignore_errors=True)


def test_reads_go_to_the_first_pull_worker_keeping_up_and_spill_over_while_it_is_behind(tmp_path):
    with _two_pull_workers(tmp_path, spill_bytes=1024) as (spread, workers):
        reads = [({"code": 11, "opaque": i}, b"client-%d" % i, 1000 + i, b'{"code":11,"opaque":%d}' % i)
                 for i in range(40)]
        for read in reads[:3]:
            assert spread.send(read)
        assert [r[1] for r in workers[0].take()] == [b"client-0", b"client-1", b"client-2"]
        assert workers[1].take() == []  # (a worker that keeps up takes every read: the other sleeps)
        for read in reads[3:]:  # pull-0 takes nothing meanwhile: past 1 KiB behind, pull-1 gets the rest
            assert spread.send(read)
        first, second = workers[0].take(), workers[1].take()
        assert first and second and len(first) + len(second) == 37
        assert sorted(first + second, key=lambda r: r[2]) == [(h, c, t) for h, c, t, _ in reads[3:]]


def test_a_pull_worker_that_is_not_alive_gets_no_reads_while_another_is(tmp_path):
    dead = {"pull-0"}
    with _two_pull_workers(tmp_path, alive=lambda label: label not in dead) as (spread, workers):
        read = ({"code": 11}, b"c", 1, b'{"code":11}')
        assert spread.send(read) and workers[0].take() == [] and len(workers[1].take()) == 1
        dead.clear()  # back: the first keeping up again
        assert spread.send(read) and len(workers[0].take()) == 1 and workers[1].take() == []
        dead.update({"pull-0", "pull-1"})  # none alive: the read waits in the first ring for a successor
        assert spread.send(read) and len(workers[0].take()) == 1
        assert spread.statistics()["skippedNotAlive"] == 1


def test_a_pop_ring_that_is_full_makes_pops_wait_until_the_service_takes_them(tmp_path):
    s = _node(tmp_path)
    out = WaitingOutbox(Outbox(s, "front-to-pop", read_to_wire), limit=100_000, patience_s=5.0)
    service = Inbox(s, "pop", read_from_wire)
    try:
        header = {"code": 200050, "pad": "x" * 60_000}
        sent = 0
        while not out.waiting:  # the service takes nothing: the ring fills, then pops wait here
            assert out.send((header, b"c", sent, orjson.dumps(header)), now=0.0)
            sent += 1
        taken = service.take()
        assert [arrival for _, _, arrival in taken] == list(range(sent - 1)) and taken[0][0] == header
        assert out.retry(now=1.0) == [] and not out.waiting  # room again: the one that waited goes
        assert [arrival for _, _, arrival in service.take()] == [sent - 1]
    finally:
        out.close()
        service.close()
        shutil.rmtree(ring.ring_dir(s), ignore_errors=True)


def test_a_ring_directory_without_room_for_the_rings_is_refused_at_start(tmp_path, monkeypatch):
    s = settings_module.load(None, {"runDir": str(tmp_path)})
    need = sum(ring.HEADER_SIZE + capacity for capacity in ring.rings(s).values())
    real = os.statvfs

    def small(path):  # a container's /dev/shm: room for all but one page of the rings
        info = real(path)
        return SimpleNamespace(f_bavail=(need - 4096) // info.f_frsize, f_frsize=info.f_frsize)

    monkeypatch.setattr(ring.os, "statvfs", small)
    try:
        with pytest.raises(StoreError, match="rings need"):
            ring.make_rings(s)
        assert not list(ring.ring_dir(s).glob("*.ring"))  # (nothing made)
        monkeypatch.setattr(ring.os, "statvfs", real)
        made = ring.make_rings(s)
        assert sorted(p.stem for p in made.glob("*.ring")) == sorted(ring.rings(s))
    finally:
        shutil.rmtree(ring.ring_dir(s), ignore_errors=True)
