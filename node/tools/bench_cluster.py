"""scripts/bench-cluster: a cluster's figures (issue 49), 1 KiB bodies, clients beside the nodes.
A benchmark, never a test.

Starts `mqnode cluster up` on temporary stores (an embedded Ray, one name service, two broker
groups of one master each, `--topology` compact by default: on a small host the groups share its
cores) and prints, in one run:
- async batch sends (`--batch` 64 a batch, `--in-flight` 8) to one group's master through
  `endpoint=`, then over both groups through `namesrv=`, and their ratio (the issue's figure:
  routing should cost nothing, >= 0.9); and through `namesrv=` to a topic only that group holds
  (routing's own cost, without two nodes sharing the cores); `--rounds` times, each round
  starting at the next of the three, and each round's ratio beside the medians';
- each group's node CPU per message in the namesrv run, and what N hosts of C cores would reach
  from it (the clients' CPU not counted);
- route lookups: a GET_ROUTEINFO_BY_TOPIC round trip to the name service (median, p99);
- failover: single sends in a loop while one group's master is killed (kill -9): the longest
  time without an acknowledged send, the sends that failed, and when every send went to the
  other group again.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from node.tools.local_node import ROOT, ClusterProcess, free_port

TOPIC = "BenchCluster"  # on both groups
ONE_GROUP_TOPIC = "BenchClusterOne"  # on broker-a only: routing's own cost, the CPU not shared
BODY = b"x" * 1024
READY_TIMEOUT_S = 300


class Running:
    """`mqnode cluster up` of two groups on `directory` until `stop`."""

    def __init__(self, directory: Path, topology: str):
        self.directory = directory
        self.namesrv = f"127.0.0.1:{free_port()}"
        self.listen = {name: f"tcp://127.0.0.1:{free_port()}" for name in ("a", "b")}
        nodes = "".join(f"""
[[node]]
brokerName = "broker-{name}"
store = "{directory / name}"
listen = "{self.listen[name]}"
haListenPort = {free_port()}
""" for name in ("a", "b"))
        self.conf = directory / "cluster.toml"
        self.conf.write_text(f"""[cluster]
name = "BenchCluster"
runDir = "{directory / 'run'}"

[defaults]
topology = "{topology}"
grpcServerPort = 0

[[namesrv]]
listen = "{self.namesrv}"
{nodes}""")
        self.up = ClusterProcess(self.conf, directory / "up.log").start(READY_TIMEOUT_S)

    def processes(self, name: str) -> list[psutil.Process]:
        """A group's node: its launcher (a Ray actor) and its services."""
        return [psutil.Process(pid) for pid in self.up.node_pids(self.directory / name) if psutil.pid_exists(pid)]

    def stop(self) -> None:
        self.up.stop()


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


async def batches(target: dict, total: int, batch: int, in_flight: int, topic: str = TOPIC) -> tuple[float, dict]:
    """msgs/s of async batch sends, and how many each group stored."""
    from node.client import AsyncProducer

    async with AsyncProducer(**target, timeout=10.0) as producer:
        await producer.send_batch(topic, [BODY] * batch)  # (the route, once)
        per = total // (batch * in_flight)
        counts: dict[str, int] = {}

        async def sender() -> None:
            for _ in range(per):
                results = await producer.send_batch(topic, [BODY] * batch)
                counts[results[0].broker] = counts.get(results[0].broker, 0) + len(results)

        began = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(in_flight)))
        return per * batch * in_flight / (time.perf_counter() - began), counts


def route_lookups(namesrv: str, count: int = 200) -> list[float]:
    """Milliseconds of GET_ROUTEINFO_BY_TOPIC round trips."""
    from node import protocol
    from node.security import Credentials
    from node.server.asker import NodeAsker

    asker = NodeAsker(f"tcp://{namesrv}", Credentials())
    out = []
    try:
        for _ in range(count):
            began = time.perf_counter()
            asker.ask({"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": TOPIC})
            out.append((time.perf_counter() - began) * 1000)
    finally:
        asker.close()
    return out


def failover(cluster: Running, seconds: float = 12.0) -> dict:
    """Single sends in a loop; broker-a's node killed (kill -9) after 3 s."""
    from node.client import Producer, SendError

    acked: list[tuple[float, str]] = []
    failed = [0]
    stopping = threading.Event()

    def loop(producer) -> None:
        while not stopping.is_set():
            try:
                acked.append((time.monotonic(), producer.send(TOPIC, BODY).broker))
            except SendError:
                failed[0] += 1

    with Producer(namesrv=cluster.namesrv, timeout=1.0) as producer:
        thread = threading.Thread(target=loop, args=(producer,), daemon=True)
        thread.start()
        time.sleep(3)
        victims = cluster.processes("a")
        killed_at = time.monotonic()
        for process in victims:
            try:
                process.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        time.sleep(seconds - 3)
        stopping.set()
        thread.join(10)
    after = [(t, b) for t, b in acked if t >= killed_at]
    times = [killed_at] + [t for t, _ in after]
    gap = max((b - a for a, b in zip(times, times[1:])), default=float("nan"))
    last_a = max((t for t, b in after if b == "broker-a"), default=killed_at)
    return {"longest gap without an ack (ms)": round(gap * 1000, 1), "sends failed": failed[0],
            "all to broker-b after (ms)": round((last_a - killed_at) * 1000, 1), "acked after the kill": len(after)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench-cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=300_000, help="messages a send figure")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="the three figures this many times over, each round starting at the next")
    parser.add_argument("--topology", default="compact", choices=["compact", "split"])
    parser.add_argument("--keep", action="store_true", help="keep the stores (printed)")
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="mqnode-bench-cluster-"))
    cluster = Running(directory, args.topology)
    try:
        subprocess.run([sys.executable, "-m", "node.tools.cli", "admin", "topic", "create", "--namesrv", cluster.namesrv,
                        "--topic", TOPIC, "--queues", "8"], cwd=ROOT, check=True, capture_output=True)
        subprocess.run([sys.executable, "-m", "node.tools.cli", "admin", "topic", "create", "--endpoint",
                        cluster.listen["a"], "--topic", ONE_GROUP_TOPIC, "--queues", "8"], cwd=ROOT, check=True,
                       capture_output=True)
        time.sleep(2)  # (each group registers the topic within a second)
        print(f"cluster up: two groups ({args.topology}), name service {cluster.namesrv}, {TOPIC} on both", flush=True)
        one, routed, over, per_message = [], [], [], {}
        alone = []

        def one_node() -> None:
            before = cpu_seconds(cluster.processes("a"))
            rate, counts = asyncio.run(batches({"endpoint": cluster.listen["a"]}, args.count, args.batch,
                                               args.in_flight, ONE_GROUP_TOPIC))
            alone.append((cpu_seconds(cluster.processes("a")) - before) / sum(counts.values()) * 1e6)
            one.append(rate)

        def one_group() -> None:
            rate, _ = asyncio.run(batches({"namesrv": cluster.namesrv}, args.count, args.batch, args.in_flight,
                                          ONE_GROUP_TOPIC))
            routed.append(rate)

        def two_groups() -> None:
            before = {name: cpu_seconds(cluster.processes(name)) for name in ("a", "b")}
            rate, counts = asyncio.run(batches({"namesrv": cluster.namesrv}, args.count, args.batch, args.in_flight))
            over.append(rate)
            stored.update(counts)
            for name in ("a", "b"):
                if counts.get(f"broker-{name}", 0):
                    used = cpu_seconds(cluster.processes(name)) - before[name]
                    per_message.setdefault(name, []).append(used / counts[f"broker-{name}"] * 1e6)

        # Each round starts at the next figure: writing gets dearer as a run goes on (on the
        # project's VM, once a run has written ~4-5 GiB, each new page of the CommitLog costs the
        # writing process ~3x the system time: docs/performance.md "How to read these figures"),
        # and a fixed order would charge that to the last figure every time.
        figures, stored = [one_node, one_group, two_groups], {}
        for turn in range(args.rounds):
            for figure in figures[turn % 3:] + figures[:turn % 3]:
                figure()
            print(f"  one node (endpoint=) {one[-1]:,.0f} msgs/s   one group (namesrv=) {routed[-1]:,.0f} msgs/s   "
                  f"two groups (namesrv=) {over[-1]:,.0f} msgs/s: {over[-1] / one[-1]:.2f}x   stored {stored}",
                  flush=True)
        ratio = statistics.median(over) / statistics.median(one)
        rounds = sorted(b / a for a, b in zip(one, over))
        print(f"async batch sends: one node {statistics.median(one):,.0f} msgs/s, two groups through the name service "
              f"{statistics.median(over):,.0f} msgs/s: {ratio:.2f}x (target >= 0.9; by round "
              f"{rounds[0]:.2f}-{rounds[-1]:.2f}x)")
        print(f"routing alone: one group through the name service {statistics.median(routed):,.0f} msgs/s: "
              f"{statistics.median(routed) / statistics.median(one):.2f}x of endpoint= to the same node")
        cores, us = os.cpu_count() or 1, statistics.median(alone)
        print(f"node CPU a message: alone {us:.2f} us; sharing the cores with the other group "
              + ", ".join(f"broker-{n} {statistics.median(v):.2f} us" for n, v in sorted(per_message.items())))
        print(f"  -> a group alone on a host of {cores} cores ~{cores / us * 1e6:,.0f} msgs/s (the clients elsewhere); "
              f"N such hosts ~N x that")
        lookups = sorted(route_lookups(cluster.namesrv))
        print(f"route lookup (GET_ROUTEINFO_BY_TOPIC at the name service): median {statistics.median(lookups):.2f} ms, "
              f"p99 {lookups[int(len(lookups) * 0.99) - 1]:.2f} ms")
        print("failover (broker-a killed -9 under single sends):", failover(cluster), flush=True)
    finally:
        cluster.stop()
        if args.keep:
            print(f"stores kept in {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
