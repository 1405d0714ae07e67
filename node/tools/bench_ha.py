"""scripts/bench-ha: replication's figures on this machine, master and slave both on it (loopback).

Prints, each against the issue's target:
- catch-up: an empty slave started beside a master holding `--catch-up-mib` of CommitLog (1 GiB
  by default), the bytes over the seconds from its `ready` to its written end equal to the
  master's (the zmq link; the slave dispatches as it goes);
- slave lag at `--rate` sends/s of 1 KiB (20k): for each of the master's written ends sampled
  every ms, the time until the slave's reached it; p50/p99;
- SYNC_MASTER, 64 concurrent senders, with ASYNC_FLUSH and with SYNC_FLUSH: msgs/s;
- promotion: `admin role` on a slave whose master is gone, to its first PUT_OK;
- pop take-over: `--pop-in-flight` messages (100k) popped on the master and not acked, its
  master gone once the slave's copy of the pop log has it all: `admin role` to the slave's
  first pop answered (its pop service restores the copy, cuts it at the log's end, compacts it
  into its own log), and that pop finds every one still in flight.

With `--acl off on` (the default: both, in this order, in the same run) the catch-up and
SYNC_MASTER figures are measured without the ACL and with it (`aclEnable` on the master, the
slave proving an account to follow: docs/operations.md "Replication with the ACL on"; every
client request signed), so the cost of authentication is read off one run.

A benchmark, never a test: master and slave share the machine's cores, so every figure is what
two nodes on one 2-core box do, not two hosts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import tempfile
import threading
import time
from pathlib import Path

from node import protocol
from node.client import AsyncProducer, Credentials, Message, Producer
from node.tools import floors
from node.tools.local_node import NodeProcess, free_port, local_settings
from node.tools.pacing import paced
from shm.control_block import ControlBlock, peek

BODY = bytes(range(256)) * 4
SEGMENT = 256 * 1024 * 1024
ACCOUNT = ("benchAdmin", "bench-admin-secret")  # with --acl on: the clients' and the slave's account


class Security:
    """What a pair runs with: no ACL, or the ACL on the master (an admin account the clients sign
    with and the slave proves itself with)."""

    def __init__(self, acl: bool):
        self.acl = acl
        self.credentials = Credentials(*ACCOUNT) if acl else Credentials()

    def master(self, directory: Path) -> dict:
        if not self.acl:
            return {}
        path = directory / "plain_acl.yml"
        path.write_text(f"accounts:\n  - accessKey: {ACCOUNT[0]}\n    secretKey: {ACCOUNT[1]}\n    admin: true\n")
        return {"aclEnable": True, "aclFile": str(path)}

    def slave(self) -> dict:
        return {"haAccessKey": ACCOUNT[0], "haSecretKey": ACCOUNT[1]} if self.acl else {}

    def __str__(self) -> str:
        return "ACL on" if self.acl else "ACL off"


NO_ACL = Security(False)


@contextlib.contextmanager
def pair(directory: Path, *, master_options: dict | None = None, start_slave: bool = True, link: str = "zmq",
         security: Security = NO_ACL):
    directory.mkdir(parents=True, exist_ok=True)
    master = local_settings(directory / "m", haListenPort=free_port(), mappedFileSizeCommitLog=SEGMENT, haProtocol=link,
                            **(master_options or {}), **security.master(directory))
    slave = local_settings(directory / "s", brokerRole="SLAVE", brokerId=1, haMasterAddress=f"127.0.0.1:{master.ha_port}",
                           haListenPort=free_port(), mappedFileSizeCommitLog=SEGMENT, haProtocol=link,
                           **security.slave())
    nodes = {"master": NodeProcess(master, directory / "m.log").start(timeout=120),
             "slave": NodeProcess(slave, directory / "s.log")}
    try:
        if start_slave:
            nodes["slave"].start(timeout=120)
        yield nodes
    finally:
        for node in reversed(list(nodes.values())):
            node.stop(timeout=60, strict=False)
        shutil.rmtree(directory, ignore_errors=True)  # (the next figure does not run behind this one's writeback)


def written(settings) -> int:
    return peek(settings.root, "written")


async def fill(endpoint: str, size: int, credentials: Credentials = Credentials()) -> None:
    async with AsyncProducer(endpoint, timeout=30, credentials=credentials) as producer:
        messages = [Message("BenchHaFill", BODY) for _ in range(64)]

        async def sender() -> None:
            for _ in range(size // (64 * 1024) // 4 + 1):
                await producer.send_batch("BenchHaFill", messages)

        await asyncio.gather(*[sender() for _ in range(4)])


def catch_up(directory: Path, mib: int, security: Security = NO_ACL) -> tuple[float, float]:
    """MB/s of an empty slave's catch-up: from its first byte to its written end equal to the
    master's, watched from outside while it starts (it begins following before it says ready)."""
    with pair(directory, start_slave=False, security=security) as nodes:
        master, slave = nodes["master"], nodes["slave"]
        asyncio.run(fill(master.endpoint, mib * 1024 * 1024, security.credentials))
        end = written(master.settings)
        starting = threading.Thread(target=slave.start, kwargs={"timeout": 120}, daemon=True)
        starting.start()
        first = began = None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                now, at = time.perf_counter(), written(slave.settings)
            except (OSError, ValueError):  # (its control block not made yet)
                now, at = time.perf_counter(), 0
            if at > 0 and began is None:
                first, began = at, now
            if at >= end:
                break
            time.sleep(0.001)
        starting.join(120)
        seconds = time.perf_counter() - began
    return (end - first) / seconds / 1e6, seconds

def lag(directory: Path, rate: int, seconds: float) -> tuple[float, float, int]:
    with pair(directory) as nodes:
        master, slave = nodes["master"].settings, nodes["slave"].settings
        m_control, s_control = ControlBlock(master.root / "control"), ControlBlock(slave.root / "control")
        samples: list[tuple[float, int]] = []
        reached: list[tuple[float, int]] = []
        stop = False

        async def sample() -> None:
            while not stop:
                now = time.perf_counter()
                samples.append((now, m_control.get("written")))
                reached.append((now, s_control.get("written")))
                await asyncio.sleep(0.001)

        async def run() -> None:
            nonlocal stop
            async with AsyncProducer(master.listen) as producer:
                watcher = asyncio.get_running_loop().create_task(sample())
                await paced(rate, seconds, lambda _: producer.send("BenchHaLag", BODY))
                await asyncio.sleep(0.5)
                stop = True
                await watcher

        asyncio.run(run())
        m_control.close()
        s_control.close()
    delays, j = [], 0
    for at, end in samples:
        while j < len(reached) and (reached[j][1] < end or reached[j][0] < at):
            j += 1
        if j == len(reached):
            break
        delays.append(reached[j][0] - at)
    delays.sort()
    return delays[len(delays) // 2] * 1000, delays[int(len(delays) * 0.99)] * 1000, len(delays)


def sync_master(directory: Path, flush: str, count: int, security: Security = NO_ACL) -> float:
    with pair(directory, master_options={"brokerRole": "SYNC_MASTER", "flushDiskType": flush}, security=security) as nodes:
        async def run() -> float:
            async with AsyncProducer(nodes["master"].endpoint, credentials=security.credentials) as producer:
                while (await producer.send("BenchHaSync", BODY)).status != "PUT_OK":
                    await asyncio.sleep(0.1)  # the slave's first hello
                statuses: dict[str, int] = {}

                async def sender() -> None:
                    for _ in range(count // 64):
                        status = (await producer.send("BenchHaSync", BODY)).status
                        statuses[status] = statuses.get(status, 0) + 1

                began = time.perf_counter()
                await asyncio.gather(*[sender() for _ in range(64)])
                rate = count // 64 * 64 / (time.perf_counter() - began)
                assert set(statuses) == {"PUT_OK"}, statuses
                return rate
        return asyncio.run(run())


def promotion(directory: Path) -> float:
    with pair(directory) as nodes:
        with Producer(nodes["master"].endpoint) as producer:
            producer.send("BenchHaPromote", BODY)
        nodes["master"].kill_all()
        with Producer(nodes["slave"].endpoint, retries=0) as producer:
            began = time.perf_counter()
            reply, _ = producer.request({"code": protocol.HA_ROLE, "role": "ASYNC_MASTER"})
            assert reply["status"] == "OK", reply
            while True:
                try:
                    if producer.send("BenchHaPromote", BODY).status == "PUT_OK":
                        return time.perf_counter() - began
                except Exception:  # SERVICE_NOT_AVAILABLE until its write core opens
                    time.sleep(0.005)


def pop_take_over(directory: Path, count: int) -> tuple[float, dict]:
    """(seconds from `admin role` to the promoted slave's first pop answered, its pop stats)."""
    from node.client import PullConsumer, SendError

    with pair(directory) as nodes:
        master, slave = nodes["master"].endpoint, nodes["slave"].endpoint
        asyncio.run(fill_topic(master, "BenchHaPop", count))
        with PullConsumer(master, timeout=30) as consumer:
            popped = 0
            while popped < count:
                popped += len(consumer.pop("BenchHaPop", "bench-ha-pop", max_count=1024, invisible_ms=600_000,
                                           wait_ms=1000))
        journal = _actors(master)["pop"]["log"]["journalBytes"]
        deadline = time.monotonic() + 120
        while _actors(slave)["ha-client"]["popReplica"]["bytes"] < journal:
            assert time.monotonic() < deadline, "the slave's copy of the pop log never caught up"
            time.sleep(0.2)
        nodes["master"].kill_all()
        with Producer(slave, retries=0) as producer, PullConsumer(slave, timeout=30) as consumer:
            began = time.perf_counter()
            reply, _ = producer.request({"code": protocol.HA_ROLE, "role": "ASYNC_MASTER"})
            assert reply["status"] == "OK", reply
            while True:
                try:
                    found = consumer.pop("BenchHaPop", "bench-ha-pop", max_count=32, wait_ms=0)
                    took = time.perf_counter() - began
                    break
                except SendError as e:  # SYSTEM_BUSY while its pop service takes the copy over
                    assert e.status == "SYSTEM_BUSY", e
                    time.sleep(0.005)
            assert found == [], f"{len(found)} of the messages in flight on the master were handed out again"
            time.sleep(1.5)  # (the statistics are published once a second)
            return took, _actors(slave)["pop"]


async def fill_topic(endpoint: str, topic: str, count: int) -> None:
    async with AsyncProducer(endpoint, timeout=30) as producer:
        for at in range(0, count, 1024):
            await producer.send_batch(topic, [Message(topic, BODY) for _ in range(min(1024, count - at))])


def _actors(endpoint: str) -> dict:
    with Producer(endpoint) as producer:
        reply, _ = producer.request({"code": protocol.GET_BROKER_RUNTIME_INFO})
    return reply["actors"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catch-up-mib", type=int, default=1024)
    parser.add_argument("--rate", type=int, default=20000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--sync-count", type=int, default=100_000)
    parser.add_argument("--pop-in-flight", type=int, default=100_000)
    parser.add_argument("--only", choices=["catch-up", "lag", "sync", "promotion", "pop"], action="append")
    parser.add_argument("--acl", choices=["off", "on"], nargs="+", default=["off", "on"],
                        help="measure catch-up and SYNC_MASTER without the ACL, with it, or both (the default)")
    args = parser.parse_args()
    securities = [Security(mode == "on") for mode in args.acl]
    only = set(args.only or ["catch-up", "lag", "sync", "promotion", "pop"])
    base = Path(tempfile.mkdtemp(prefix="mqnode-bench-ha-"))
    print(floors.report(base), flush=True)
    try:
        for security in securities if "catch-up" in only else ():
            rate, seconds = catch_up(base / f"catch-up-{security.acl}", args.catch_up_mib, security)
            print(f"catch-up of {args.catch_up_mib} MiB to an empty slave ({security}): {rate:.0f} MB/s in "
                  f"{seconds:.1f} s (target >= 200 MB/s)", flush=True)
        if "lag" in only:
            p50, p99, samples = lag(base / "lag", args.rate, args.seconds)
            median = f"{p50:.1f} ms" if p50 >= 1 else "< 1 ms (the sampling step)"
            print(f"slave lag at {args.rate} sends/s of 1 KiB: p50 {median}, p99 {p99:.1f} ms over {samples} "
                  f"samples (target p99 <= 50 ms)", flush=True)
        for flush, target in (("ASYNC_FLUSH", 40000), ("SYNC_FLUSH", 30000)) if "sync" in only else ():
            for security in securities:
                rate = sync_master(base / f"sync-{flush}-{security.acl}", flush, args.sync_count, security)
                print(f"SYNC_MASTER + {flush}, 64 concurrent senders ({security}): {rate:,.0f} msgs/s "
                      f"(target >= {target:,})", flush=True)
        if "promotion" in only:
            print(f"promotion: first PUT_OK {promotion(base / 'promotion') * 1000:.0f} ms after admin role "
                  f"(target <= 2000 ms)", flush=True)
        if "pop" in only:
            took, stats = pop_take_over(base / "pop", args.pop_in_flight)
            print(f"pop take-over of {args.pop_in_flight:,} in flight: first pop answered {took * 1000:.0f} ms after "
                  f"admin role (the pop service's take-over {stats['takeOverMs']:.0f} ms; {stats['inFlight']:,} still "
                  f"in flight, none handed out again)", flush=True)
        print(floors.report(base), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
