"""scripts/bench-produce: the write path's speed on this machine, 1 KiB bodies, client beside node.

Starts `mqnode start` on a temporary store for each configuration (`--topology`, and under
split each `--ingress-workers` value; `--rounds` alternates them) and each flush mode, and
prints: ASYNC_FLUSH with send_batch and with concurrent single sends, SYNC_FLUSH with 64
concurrent senders, ack latency p50/p99 at a fixed 5k msgs/s, and the node's CPU and memory
(psutil over every process of the node), with its CPU per message in all and per process (the
service processes by label, Ray's together): what predicts a host with more cores. A benchmark, never a test: the figures depend on the machine, so the
machine's floors (`node.tools.floors`) are printed before and after them.

The latency is measured once the node has settled after the throughput figures: the dispatcher
has caught up with what they wrote (up to SETTLE_S; how long it took is printed), so a backlog
left by them cannot count against it. (So far none was left: it had caught up by the first
look.) The front's CPU pinning state is printed with it (`frontPinBelowCpu`, actors.host_tuning),
and its CPU wake-up latency request (`cpuIdleLatencyUs`, actors.host_tuning): the figures are
the node's as users run it, with idle CPUs polling while it serves where it may ask for that.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import tempfile
import time
from pathlib import Path

import psutil

from node import protocol
from node.client import AsyncProducer, Message, aio
from node.tools import floors
from node.tools.local_node import NodeProcess, local_settings
from node.tools.pacing import paced, paced_by_loop_timers

BODY = bytes(range(256)) * 4
SETTLE_S = 30.0


@contextlib.contextmanager
def bench_node(directory: Path, flush: str, config: tuple[str, int] | None, options: dict[str, str]):
    """`mqnode start` on `directory` with this flush mode, topology and ingress processes
    (`config`; None: the settings' defaults) and `options` (--node-option), stopped after."""
    shape = {} if config is None else {"topology": config[0], "ingressWorkers": config[1]}
    node = NodeProcess(local_settings(directory, flushDiskType=flush, **shape, **options),
                       directory / "node.log").start(timeout=120)
    try:
        yield node
    finally:
        node.stop(timeout=60, strict=False)


class Usage:
    """CPU seconds and peak RSS of the node's processes over a measured stretch, in all and per
    process: each service process by its label (its pid file in the run directory), the node's
    own launcher as `launcher`, Ray's processes together as `ray`."""

    def __init__(self, node: NodeProcess):
        self.processes = node.tree()
        labels = {}
        for label in node.actor_labels():
            with contextlib.suppress(OSError, ValueError):
                labels[int((node.settings.run_dir / f"{label}.pid").read_text())] = label
        root = node.process.pid
        self.labels = {p.pid: labels.get(p.pid, "launcher" if p.pid == root else "ray") for p in self.processes}
        self.cpu0 = self._cpu()
        self.began = time.perf_counter()

    def _cpu(self) -> dict[str, float]:
        """CPU seconds (user + system, every thread) by label."""
        out: dict[str, float] = {}
        for p in self.processes:
            try:
                times = p.cpu_times()
            except psutil.Error:
                continue
            label = self.labels[p.pid]
            out[label] = out.get(label, 0.0) + times.user + times.system
        return out

    def report(self, messages: int = 0) -> str:
        """The node's CPU as a share of one core, its RSS, and (given the messages the stretch
        carried) its CPU per message, in all and by process: what predicts a bigger host."""
        elapsed = time.perf_counter() - self.began
        rss = 0
        for p in self.processes:
            try:
                rss += p.memory_info().rss
            except psutil.Error:
                pass
        now = self._cpu()
        spent = {label: now.get(label, 0.0) - self.cpu0.get(label, 0.0) for label in now}
        total = sum(spent.values())
        text = f"node CPU {100 * total / elapsed:.0f}% of one core, RSS {rss / 2**20:.0f} MiB"
        if messages:
            parts = ", ".join(f"{label} {1e6 * seconds / messages:.2f}"
                              for label, seconds in sorted(spent.items(), key=lambda kv: -kv[1]) if seconds > 0)
            text += f"; CPU {1e6 * total / messages:.2f} µs/msg ({parts})"
        return text


async def batches(endpoint: str, count: int, batch: int, senders: int) -> float:
    async with AsyncProducer(endpoint) as producer:
        messages = [Message("BenchBatch", BODY) for _ in range(batch)]
        await producer.send_batch("BenchBatch", messages)

        async def sender(k: int) -> None:
            for _ in range(count // batch // senders):
                await producer.send_batch("BenchBatch", messages)

        began = time.perf_counter()
        await asyncio.gather(*[sender(k) for k in range(senders)])
        sent = (count // batch // senders) * batch * senders
        return sent / (time.perf_counter() - began), sent


async def singles(endpoint: str, count: int, senders: int, topic: str) -> float:
    async with AsyncProducer(endpoint) as producer:
        await producer.send(topic, BODY)

        async def sender(k: int) -> None:
            for _ in range(count // senders):
                await producer.send(topic, BODY)

        began = time.perf_counter()
        await asyncio.gather(*[sender(k) for k in range(senders)])
        sent = (count // senders) * senders
        return sent / (time.perf_counter() - began), sent


async def settle(endpoint: str, timeout: float = SETTLE_S) -> tuple[float, dict]:
    """Wait until the dispatcher has caught up with the written end (at most `timeout` s) and a
    second more, for the front's CPU reading to see a quiet node; (seconds waited, the front's
    statistics)."""
    began = time.monotonic()
    async with AsyncProducer(endpoint) as producer:
        while True:
            info, _ = await producer.request({"code": protocol.GET_BROKER_RUNTIME_INFO})
            control = info.get("control", {})
            if control.get("dispatched", 0) >= control.get("written", 0) or time.monotonic() - began > timeout:
                break
            await asyncio.sleep(0.1)
        waited = time.monotonic() - began
        await asyncio.sleep(1.0)
        info, _ = await producer.request({"code": protocol.GET_BROKER_RUNTIME_INFO})
    return waited, info.get("actors", {}).get("front", {})


def pinning(front: dict) -> str:
    stats = front.get("cpuPinning", {})
    if not stats:
        return "front not pinned (frontPinBelowCpu = 0)"
    if not stats.get("enabled"):
        return "front pinning unavailable here"
    where = "none" if stats.get("pinnedCpu") is None else f"CPU {stats['pinnedCpu']}"
    return f"front pinned to {where} ({stats.get('pins')} pins, {stats.get('unpins')} unpins so far)"


def wake_ups(front: dict) -> str:
    stats = front.get("cpuLatency")
    if not stats:
        return "no CPU wake-up latency request (cpuIdleLatencyUs = -1)"
    if stats.get("unavailable"):
        return f"no CPU wake-up latency request ({stats['unavailable']})"
    return (f"idle CPUs held to {stats.get('limitUs')} µs wake-ups while the front serves "
            f"({stats.get('holds')} holds, {stats.get('heldSeconds')} s so far)")


async def latency(endpoint: str, rate: int, seconds: float, pace=paced) -> tuple[float, float]:
    """Single sends at `rate`/s, one every 1/rate s (`pace`); (p50, p99) ack latency in µs, sends."""
    async with AsyncProducer(endpoint, linger_ms=0) as producer:
        await producer.send("BenchLatency", BODY)
        samples: list[float] = []

        async def one(_: int) -> None:
            began = time.perf_counter()
            await producer.send("BenchLatency", BODY)
            samples.append(time.perf_counter() - began)

        await pace(rate, seconds, one)
        samples.sort()
        return samples[len(samples) // 2] * 1e6, samples[int(len(samples) * 0.99)] * 1e6, len(samples)


def add_node_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting for every node it starts, e.g. cpuIdleLatencyUs=0 (host tuning, opt-in)")


def node_options(args: argparse.Namespace) -> dict[str, str]:
    return dict(item.split("=", 1) for item in args.node_option)


def configurations(args: argparse.Namespace) -> list[tuple[str, int]]:
    """(topology, ingressWorkers) to measure, in order, `--rounds` times over: compact once a
    round (it runs no ingress process), split once for each `--ingress-workers` value."""
    one = []
    for topology in args.topology:
        for ingress in (args.ingress_workers if topology == "split" else [0]):
            if (topology, ingress) not in one:
                one.append((topology, ingress))
    return one * args.rounds


def measure(base: Path, config: tuple[str, int], count: int, options: dict[str, str]) -> None:
    """Every figure of one configuration, each line labelled with it."""
    name = f"[{config[0]} ingressWorkers={config[1]}]"
    directory = base / f"async-{len(list(base.iterdir()))}"
    directory.mkdir()
    with bench_node(directory, "ASYNC_FLUSH", config, options) as node:
        usage = Usage(node)
        rate, sent = aio.run(batches(node.endpoint, count, 128, 4))
        print(f"{name} ASYNC_FLUSH send_batch (128/batch, 4 senders): {rate:>9,.0f} msgs/s "
              f"(target >= 150,000); {usage.report(sent)}", flush=True)
        usage = Usage(node)
        rate, sent = aio.run(singles(node.endpoint, count, 1024, "BenchSingle"))
        print(f"{name} ASYNC_FLUSH concurrent single sends (1024):    {rate:>9,.0f} msgs/s "
              f"(target >= 80,000); {usage.report(sent)}", flush=True)
        waited, front = aio.run(settle(node.endpoint))
        print(f"{name} settled: dispatcher caught up in {waited:.1f} s; {pinning(front)}; {wake_ups(front)}")
        usage = Usage(node)
        p50, p99, sent = aio.run(latency(node.endpoint, 5000, 5.0))
        print(f"{name} ack latency at 5k msgs/s: p50 {p50:,.0f} µs (target <= 300), "
              f"p99 {p99:,.0f} µs (target <= 2,000); {usage.report(sent)}", flush=True)
        usage = Usage(node)  # paced by the loop's timers (bursts), to compare with the even pacing
        p50, p99, sent = aio.run(latency(node.endpoint, 5000, 5.0, paced_by_loop_timers))
        print(f"{name} ack latency at 5k msgs/s in bursts (~5 sends a ms, the loop's "
              f"timers): p50 {p50:,.0f} µs, p99 {p99:,.0f} µs; {usage.report(sent)}", flush=True)
    directory = base / f"sync-{len(list(base.iterdir()))}"
    directory.mkdir()
    with bench_node(directory, "SYNC_FLUSH", config, options) as node:
        usage = Usage(node)
        rate, sent = aio.run(singles(node.endpoint, count // 2, 64, "BenchSync"))
        print(f"{name} SYNC_FLUSH, 64 concurrent senders:            "
              f"{rate:>9,.0f} msgs/s (target >= 50,000); {usage.report(sent)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=200_000, help="messages per throughput figure")
    parser.add_argument("--topology", nargs="+", choices=("compact", "split"), default=["split", "compact"],
                        help="topologies to compare (node.server.topology)")
    parser.add_argument("--ingress-workers", type=int, nargs="+", default=[0, 2],
                        help="ingressWorkers settings to compare under split (0: the writer encodes)")
    parser.add_argument("--rounds", type=int, default=1, help="times over every configuration, alternating")
    add_node_options(parser)
    args = parser.parse_args()
    options = node_options(args)
    base = Path(tempfile.mkdtemp(prefix="mqnode-bench-produce-"))
    print(f"mqnode bench-produce: 1 KiB bodies, {psutil.cpu_count()} cores, client on the same machine; "
          f"CPU per message: every process of the node (Ray's too) over the figure's stretch")
    try:
        print(f"before: {floors.report(base)}", flush=True)
        for config in configurations(args):
            measure(base, config, args.count, options)
        print(f"after: {floors.report(base)}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
