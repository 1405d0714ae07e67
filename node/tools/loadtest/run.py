"""`scripts/loadtest`: the coordinator. Parses the flags (over a `--scenario` preset), starts a
node on a temporary store unless `--endpoint` is given, spawns the producer and consumer
processes, draws the live dashboard, strikes with `--chaos`, verifies with `--verify`, and
writes results.json, the plots and report.html. Exit status: 0 when the run completed (and
verified), 1 when anything went wrong (listed), 2 for bad flags.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import multiprocessing
import os
import platform
import queue as queue_module
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import psutil
from rich.console import Console
from rich.live import Live

from node import protocol
from node.client import SendError, aio
from node.tools.loadtest import records, replication, report, verify
from node.tools.loadtest.chaos import Chaos
from node.tools.loadtest.monitor import NodeMonitor
from node.tools.loadtest.params import PRESETS, RunParams
from node.tools.loadtest.profile import Profiler
from node.tools.loadtest.progress import Progress
from node.tools.loadtest.workers import consumer_main, producer_main
from node.tools.local_node import ROOT, NodeProcess, free_port, local_settings
from shm import settings as settings_module

JOIN_TIMEOUT = 30.0     # seconds a finished worker gets to exit
OPEN_ENDED = 1800.0     # the hard limit of a run bounded by count only, before the drain
PROBE_TIMEOUT = 5.0     # seconds the node gets to answer before any worker starts
LINE_EVERY = 5.0        # seconds between progress lines when stdout is not a terminal


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="loadtest", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", choices=sorted(PRESETS), help="a preset of the published figures (flags override it)")
    p.add_argument("--endpoint", help="target a running node (default: start one on a temporary store)")
    p.add_argument("--topic", help="topic to load (default LoadTest); nobody else should write to it")
    p.add_argument("--topics", type=int, help="spread the load over N topics <topic>-0..N-1 (default 1)")
    p.add_argument("--queues", type=int, help="queues of the topic on a node the run starts (default 8)")
    p.add_argument("--producers", type=int, help="producer processes (default 1)")
    p.add_argument("--consumers", type=int, help="consumer processes, each taking a share of the queues (default 1)")
    p.add_argument("--size", help="body bytes: N, A-B (uniform), or A,B,C (one of); e.g. 1k, 200-4000 (default 1024)")
    p.add_argument("--rate", type=float, help="target msgs/s over all producers (default 0: as fast as possible)")
    p.add_argument("--batch", type=int, help="messages per send_batch; 1 = single sends (default 1)")
    p.add_argument("--concurrency", type=int, help="sends or batches in flight per producer (default 64)")
    p.add_argument("--linger-ms", type=float, dest="linger_ms", help="coalescing linger of single sends (default 1)")
    p.add_argument("--tags", help="comma-separated tags, cycled over the messages")
    p.add_argument("--keys", action="store_true", default=None, help="give every message a key (indexed)")
    p.add_argument("--flush", choices=["ASYNC_FLUSH", "SYNC_FLUSH"], help="flushDiskType of the node the run starts")
    p.add_argument("--node-option", action="append", dest="node_options", metavar="KEY=VALUE",
                   help="any conf/broker.toml setting of the node the run starts (repeatable)")
    p.add_argument("--duration", type=float, help="seconds of producing")
    p.add_argument("--count", type=int, help="messages to produce in all (with --duration: whichever comes first)")
    p.add_argument("--backlog", action="store_true", default=None, help="consumers start after producing ends")
    p.add_argument("--pop", action="store_true", default=None,
                   help="consumers pop (RocketMQ 5's model) as one group from every queue and ack each message; "
                        "with --verify a message handed out again is counted, not a finding, and order is not checked")
    p.add_argument("--invisible-ms", type=int, dest="invisible_ms",
                   help="--pop: how long a popped message stays invisible before it comes back unless acked (default 5000)")
    p.add_argument("--drain-timeout", type=float, dest="drain_timeout", help="seconds consumers get to catch up (default 60)")
    p.add_argument("--send-timeout", type=float, dest="send_timeout", help="seconds before a send counts as unknown (default 5)")
    p.add_argument("--verify", action="store_true", default=None,
                   help="check every acknowledged message is consumed exactly once, intact, in queue order")
    p.add_argument("--chaos", action="store_true", default=None,
                   help="kill -9 an actor or the whole node at random instants and restart it")
    p.add_argument("--slave", action="store_true", default=None,
                   help="start a slave beside the node the run starts (--chaos strikes it and the HA processes "
                        "too); the run fails unless its CommitLog ends as the master's")
    p.add_argument("--chaos-interval", dest="chaos_interval", metavar="MIN,MAX",
                   help="seconds between chaos strikes, drawn uniformly (default 2,5)")
    p.add_argument("--profile", action="store_true", default=None,
                   help="py-spy every actor of a node the run starts and every worker; top functions in the report")
    p.add_argument("--seed", type=int, help="seed of sizes, fillers and the chaos schedule (default 1)")
    p.add_argument("--output", help="folder for results.json, plots, report.html (default results/<time>-<scenario>)")
    p.add_argument("--interval", type=float, help="seconds between progress samples (default 0.5)")
    p.add_argument("--quiet", action="store_true", help="no live progress, only the summary")
    p.add_argument("--keep-store", action="store_true", help="keep the temporary store of a node the run started")
    p.add_argument("--reverify", metavar="DIR", help="verify the records of an earlier --verify run again, and exit")
    return p


def resolve(args: argparse.Namespace) -> RunParams:
    values = dict(PRESETS[args.scenario]) if args.scenario else {}
    values["scenario"] = args.scenario
    for f in dataclasses.fields(RunParams):
        given = getattr(args, f.name, None)
        if given is not None and f.name != "scenario":
            values[f.name] = given
    if isinstance(values.get("chaos_interval"), str):
        low, _, high = values["chaos_interval"].partition(",")
        try:
            values["chaos_interval"] = (float(low), float(high or low))
        except ValueError:
            raise ValueError(f"--chaos-interval {values['chaos_interval']!r}: expected MIN,MAX seconds, e.g. 2,5") from None
    params = RunParams(**values).bounded()
    params.validate()
    return params


def node_options(params: RunParams) -> dict[str, str]:
    """The run's --node-option KEY=VALUE settings (ValueError: one without "=")."""
    options = {}
    for item in params.node_options:
        name, separator, value = item.partition("=")
        if not separator:
            raise ValueError(f"--node-option {item!r}: expected KEY=VALUE")
        options[name.strip()] = value.strip()
    return options


def node_settings(params: RunParams, directory: Path):
    values = {"flushDiskType": params.flush, "defaultTopicQueueNums": params.queues}
    if params.chaos:
        values["actorMaxRestarts"] = 1000
    if params.slave:
        values["haListenPort"] = free_port()
    values.update(node_options(params))
    return local_settings(directory, **values)


async def _probe(endpoint: str, topics: list[str], pop_group: str | None = None) -> dict[tuple[int, int], int]:
    """Each (topic index, queue)'s max offset now: where this run's messages will start. With
    `pop_group`, the group's offsets are set there: its pops begin at this run's messages."""
    from node.client import AsyncPullConsumer

    starts = {}
    async with AsyncPullConsumer(endpoint, timeout=PROBE_TIMEOUT) as consumer:
        for t, topic in enumerate(topics):
            for q in range(await consumer.client.queue_count(topic)):
                starts[t, q] = await consumer.max_offset(topic, q)
        if pop_group:
            await _start_pop_group(consumer, pop_group, topics, starts)
    return starts


async def _start_pop_group(consumer, group: str, topics: list[str], starts: dict[tuple[int, int], int]) -> None:
    """A pop group that starts at `starts`: an earlier run's state forgotten (the group deleted,
    DELETE_SUBSCRIPTIONGROUP), then its offsets committed there."""
    reply, _ = await consumer.client.request({"code": protocol.DELETE_SUBSCRIPTIONGROUP, "groupName": group})
    if reply.get("status") not in ("OK", "SUBSCRIPTION_GROUP_NOT_EXIST"):
        raise SendError(reply.get("status", "SYSTEM_ERROR"), reply.get("remark", "deleting the pop group"))
    for (t, q), offset in starts.items():
        await consumer.commit(group, topics[t], q, offset)


class Run:
    def __init__(self, params: RunParams, output: Path, console: Console, node: NodeProcess | None, quiet: bool,
                 slave: NodeProcess | None = None):
        self.params = params
        self.slave = slave
        self.output = output
        self.console = console
        self.node = node
        self.quiet = quiet
        self.run_id = int.from_bytes(os.urandom(4), "little")
        self.records_dir = output / "records" if params.verify else None
        if self.records_dir:  # the writers append; a reused --output must not mix in an old run
            shutil.rmtree(self.records_dir, ignore_errors=True)
        self.failures: list[str] = []
        self.progress = Progress(params.producers, params.consumers)
        self.monitor = NodeMonitor(node.process.pid) if node else NodeMonitor.for_endpoint(params.endpoint)
        self.chaos: Chaos | None = None
        self.profiler = Profiler(output / "profiles") if params.profile else None
        self.workers: list = []
        self.cpu_at_attach: dict[str, float] = {}  # worker CPU seconds (their reports) when profiling began

    def execute(self) -> dict:
        p = self.params
        starts = aio.run(_probe(p.endpoint, p.topic_names, p.pop_group if p.pop else None))
        context = multiprocessing.get_context("spawn")
        reports = context.Queue()
        stop, produced, abort = context.Event(), context.Event(), context.Event()
        records_dir = str(self.records_dir) if self.records_dir else None
        config = p.to_json()
        consumers = [context.Process(target=consumer_main, name=f"loadtest-consumer-{i}", daemon=True,
                                     args=(config, self.run_id, i, records_dir, reports, (produced, abort),
                                           {pair: o for k, (pair, o) in enumerate(starts.items())
                                            if p.pop or k % p.consumers == i}))  # (a pop group's members share all)
                     for i in range(p.consumers)]
        producers = [context.Process(target=producer_main, name=f"loadtest-producer-{i}", daemon=True,
                                     args=(config, self.run_id, i, records_dir, reports, stop))
                     for i in range(p.producers)]
        self.workers = consumers + producers
        if self.profiler:
            self._profile_actors()
        for worker in self.workers:
            worker.start()
        self.monitor.sample()
        if p.chaos:
            self.chaos = Chaos(self.node, p.seed, p.chaos_interval, self.slave).start()
        try:
            self._watch(reports, producers, consumers, stop, produced, abort)
        finally:
            for event in (stop, produced, abort):
                event.set()
            if self.chaos:
                self.chaos.stop()
            self._drain(reports)
            self._reap(producers + consumers)
            self._drain(reports)
            self.progress.sample(*self.monitor.sample())  # the end point of the time series, however short the run
            if self.profiler:
                exited = {f"{role}-{i}": r["cpu"] - self.cpu_at_attach.get(f"{role}-{i}", 0.0)
                          for (role, i), r in self.progress.latest.items()}
                self.profiler.measure(exited)
                self.profiler.stop()
        return self._results(starts)

    def _watch(self, reports, producers, consumers, stop, produced, abort) -> None:
        p = self.params
        hard_limit = time.monotonic() + (p.duration or OPEN_ENDED) + p.drain_timeout + 120
        title = f"mqnode loadtest {p.scenario or ''}".rstrip()
        live = Live(console=self.console, refresh_per_second=4, transient=False) \
            if self.console.is_terminal and not self.quiet else contextlib.nullcontext()
        last_line = time.monotonic()
        interrupted = 0
        with live:
            while True:
                try:
                    self._tick(reports)
                    if isinstance(live, Live):
                        live.update(self.progress.dashboard(title, self._remaining()))
                    elif not self.quiet and time.monotonic() - last_line > LINE_EVERY:
                        self.console.print(self.progress.line(), highlight=False)
                        last_line = time.monotonic()
                    if self.progress.done("producer") and not produced.is_set():
                        if self.chaos:  # no strikes while consumers read to the end
                            self.chaos.stop()
                        produced.set()
                    if produced.is_set() and self.progress.done("consumer"):
                        return
                    self._check_workers(producers + consumers, reports)
                    if self.failures:
                        return
                    if time.monotonic() > hard_limit:
                        self.failures.append("the run passed its time limit; workers were stopped")
                        return
                except KeyboardInterrupt:  # first: stop producing and drain; second: stop now
                    interrupted += 1
                    stop.set()
                    if interrupted > 1:
                        abort.set()
                        self.failures.append("interrupted")
                        return

    def _tick(self, reports) -> None:
        deadline = time.monotonic() + self.params.interval
        self._drain(reports, until=deadline)
        if self.node and self.node.process:
            self.monitor.root_pid = self.node.process.pid
        cpu, memory = self.monitor.sample()
        self.progress.sample(cpu, memory)
        if self.profiler:
            self._profile_workers()

    def _profile_actors(self) -> None:
        if not self.node:
            self.profiler.errors["node"] = "the actors are profiled on a node the run starts (no --endpoint)"
            return
        for label in self.node.actor_labels():
            try:
                self.profiler.attach(label, self.node.actor_process(label).pid)
            except (OSError, ValueError, psutil.Error) as e:
                self.profiler.errors[label] = str(e)

    def _profile_workers(self) -> None:
        """Each worker once it has reported: py-spy cannot attach to a process still starting up."""
        for w in self.workers:
            label = w.name.removeprefix("loadtest-")
            role, _, index = label.partition("-")
            first = self.progress.latest.get((role, int(index)))
            if first is not None and label not in self.cpu_at_attach:
                self.cpu_at_attach[label] = first["cpu"]
                self.profiler.attach(label, w.pid)

    def _drain(self, reports, until: float | None = None) -> None:
        while True:
            timeout = None if until is None else until - time.monotonic()
            try:
                if timeout is None:
                    report_ = reports.get_nowait()
                elif timeout <= 0:
                    return
                else:
                    report_ = reports.get(timeout=timeout)
            except queue_module.Empty:
                return
            self.progress.update(report_)

    def _check_workers(self, workers, reports) -> None:
        for w in workers:
            role, index = w.name.split("-")[1], int(w.name.split("-")[2])
            report_ = self.progress.latest.get((role, index))
            if w.exitcode not in (None, 0) or (w.exitcode == 0 and not (report_ and report_["done"])):
                time.sleep(0.2)  # its last report may still be in the queue
                self._drain(reports)
                report_ = self.progress.latest.get((role, index))
                if not (report_ and report_["done"]):
                    self.failures.append(f"{w.name} exited with status {w.exitcode} before finishing")
        if self.chaos and self.chaos.failure:
            self.failures.append(f"chaos: the node did not come back: {self.chaos.failure}")

    def _reap(self, workers) -> None:
        deadline = time.monotonic() + JOIN_TIMEOUT
        for w in workers:
            w.join(max(0.1, deadline - time.monotonic()))
            if w.is_alive():
                w.kill()
                w.join(5)

    def _remaining(self) -> str:
        p = self.params
        elapsed = time.time() - self.progress.started
        if not self.progress.done("producer"):
            bounds = []
            if p.duration:
                bounds.append(f"{max(0.0, p.duration - elapsed):.0f} s left")
            if p.count:
                bounds.append(f"{self.progress.total('producer', 'messages'):,}/{p.count:,} msgs")
            return "producing: " + ", ".join(bounds)
        return f"draining (up to {p.drain_timeout:.0f} s)"

    def _results(self, starts: dict[tuple[int, int], int]) -> dict:
        verdict = None
        if self.records_dir:
            verdict = verify.verify(records.load(self.records_dir, "sent"), records.load(self.records_dir, "consumed"),
                                    popped=self.params.pop)
        copied = replication.check(self.node.settings, self.slave.settings) if self.slave else None
        if copied is not None and not copied["ok"]:
            self.failures.append(f"the slave's CommitLog is not the master's: {copied['problem']}")
        if copied is not None:
            copied["popLog"] = replication.check_pop(self.node.settings, self.slave.settings)
            if not copied["popLog"]["ok"]:
                self.failures.append(f"the slave's copy of the pop log is not the master's: {copied['popLog']['problem']}")
        summary = self.progress.summary()
        if summary["unfinishedQueues"]:
            self.failures.append(f"consumers did not reach the end of queues {summary['unfinishedQueues']} "
                                 f"within --drain-timeout")
        return {
            "runId": self.run_id, "params": self.params.to_json(), "command": " ".join(sys.argv),
            "started": self.progress.started, "elapsed": time.time() - self.progress.started,
            "startedText": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.progress.started)),
            "machine": {"host": platform.node(), "cores": psutil.cpu_count(), "python": platform.python_version(),
                        "memory": psutil.virtual_memory().total},
            "node": {"endpoint": self.params.endpoint, "started": self.node is not None,
                     "log": str(self.output / "node.log") if self.node else None},
            "startOffsets": {f"{self.params.topic_names[t]}:{q}": o for (t, q), o in starts.items()},
            "summary": summary, "series": self.progress.series,
            "histograms": {"ack": self.progress.histogram("producer", "ack").to_sparse(),
                           "e2e": self.progress.histogram("consumer", "e2e").to_sparse()},
            "verify": verdict.to_json() if verdict else None,
            "chaos": self.chaos.events if self.chaos else None,
            "replication": copied,
            "profile": self.profiler.summary() if self.profiler else None,
            "failures": self.failures,
        }


def default_output(params: RunParams) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return ROOT / "results" / f"{stamp}-{params.scenario or 'custom'}"


def reverify(directory: Path, console: Console) -> int:
    """Verify the records of an earlier run again (or records someone edited): 0 if clean."""
    records_dir = directory / "records"
    if not records_dir.is_dir():
        console.print(f"loadtest: {records_dir} does not exist (was the run made with --verify?)")
        return 2
    popped = _was_popped(directory)
    verdict = verify.verify(records.load(records_dir, "sent"), records.load(records_dir, "consumed"), popped=popped)
    counts = ", ".join(f"{k} {v:,}" for k, v in verdict.counts.items())
    console.print(f"verify {'PASSED' if verdict.ok else 'FAILED'}: {counts}", highlight=False)
    for line in verdict.lines():
        console.print(line, highlight=False)
    return 0 if verdict.ok else 1


def _was_popped(directory: Path) -> bool:
    """Whether the run whose output `directory` is consumed by pops (its results.json says)."""
    try:
        return bool(json.loads((directory / "results.json").read_text())["params"].get("pop"))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM ends a run as Ctrl-C does: stop producing, drain, report


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console()
    if args.reverify:
        return reverify(Path(args.reverify), console)
    try:
        params = resolve(args)
    except (ValueError, TypeError) as e:
        console.print(f"loadtest: {e}", highlight=False)
        return 2
    output = Path(params.output) if params.output else default_output(params)
    output.mkdir(parents=True, exist_ok=True)
    store = Path(tempfile.mkdtemp(prefix="mqnode-loadtest-")) if not params.endpoint else None
    node = slave = None
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)  # also when started with SIGINT ignored (a background job)
    try:
        if store:
            try:
                settings = node_settings(params, store)
            except (ValueError, settings_module.SettingsError) as e:
                console.print(f"loadtest: {e}", highlight=False)
                return 2
            console.print(f"loadtest: starting a node ({params.flush}) on {store}", highlight=False)
            node = NodeProcess(settings, output / "node.log")
            try:
                node.start(timeout=120)
            except (RuntimeError, TimeoutError) as e:
                console.print(f"loadtest: the node did not start (log: {output / 'node.log'}): {e}", highlight=False)
                return 1
            params = dataclasses.replace(params, endpoint=node.endpoint)
            if params.slave:
                slave = replication.start_slave(settings, store / "slave", output / "slave.log", params.chaos,
                                                  node_options(params))
        try:
            results = Run(params, output, console, node, args.quiet, slave).execute()
        except SendError as e:  # before any worker started: the node did not answer the probe
            console.print(f"loadtest: no answer from {params.endpoint} ({e})", highlight=False)
            return 1
    finally:
        if slave:
            slave.stop(timeout=60, strict=False)
        if node:
            node.stop(timeout=60, strict=False)
        if store and not args.keep_store:
            shutil.rmtree(store, ignore_errors=True)
    report.write_all(results, output)
    report.print_summary(results, console)
    for failure in results["failures"]:
        console.print(f"[red]failed:[/red] {failure}", highlight=False)
    if results["verify"] and not results["verify"]["ok"]:
        for line in verify.Verdict(results["verify"]["findings"]).lines():
            console.print(line, highlight=False)
    console.print(f"results: {output}/report.html", highlight=False, soft_wrap=True)  # (a path to copy: never wrapped)
    ok = not results["failures"] and (results["verify"] is None or results["verify"]["ok"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
