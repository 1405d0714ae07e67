"""Prometheus metrics: with `metricsPort` set, the launcher serves `/metrics` on `metricsAddress`
(prometheus_client's HTTP server, a thread of the launcher's process: a scrape never runs in a
service's loop).

Every figure comes from the services' `statistics()`, as the front gathers them for
GET_BROKER_RUNTIME_INFO, asked over the node's own endpoint at each scrape; consumer lag is the
committed offsets (GET_ALL_CONSUMER_OFFSET) against each queue's max offset, read from the store's
ConsumeQueue files; process CPU and RSS are psutil's for each service's pid. The names and labels
are listed in docs/operations.md ("Metrics").
"""

from __future__ import annotations

import re

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import CollectorRegistry

from node import protocol
from actors import guard
from node.server.asker import NodeAsker

# RocketMQ's putMessageDistributeTime ranges, by their upper bound in ms ("+Inf": the last)
_DISTRIBUTION = re.compile(r"\[([^\]]+)\]:(\d+)")


class NodeCollector:
    """One scrape: the node's statistics as metric families."""

    def __init__(self, asker: NodeAsker, max_offset):
        self.asker = asker
        self.max_offset = max_offset  # (topic, queue id, dispatched) -> the queue's max offset
        self.processes: dict[int, psutil.Process] = {}

    def collect(self):
        info = self.asker.ask({"code": protocol.GET_BROKER_RUNTIME_INFO})
        offsets = self.asker.ask({"code": protocol.GET_ALL_CONSUMER_OFFSET}).get("offsetTable") or {}
        actors = info.get("actors") or {}
        control = info.get("control") or {}
        yield from _puts(actors, info.get("runtime") or {})
        yield from _pulls(actors)
        yield from self._lag(offsets, control.get("dispatched", 0))
        yield from _store(actors, control)
        yield from _schedule(actors.get("schedule") or {})
        yield from _pop(actors.get("pop") or {})
        yield from _transactions(actors.get("transaction") or {})
        yield from _proxy(actors.get("proxy") or {})
        yield from self._processes(info.get("services") or {}, info.get("supervision") or {})

    def _lag(self, offsets: dict, dispatched: int):
        # per queue, the lag alone: a scrape's cost is mostly prometheus_client's ~11 µs a sample,
        # and 1,000 topics x 8 queues is 8,000 of them (the committed offsets: `admin offsets`)
        lag = GaugeMetricFamily("mqnode_consumer_lag_messages", "Messages a group has yet to consume in a queue "
                                "(the queue's max offset minus the group's committed offset)",
                                labels=["group", "topic", "queue"])
        for key, queues in offsets.items():
            topic, _, group = key.rpartition("@")
            for queue, offset in queues.items():
                lag.add_metric([group, topic, queue], max(0, self.max_offset(topic, int(queue), dispatched) - offset))
        yield lag

    def _processes(self, services: dict, supervision: dict):
        cpu = CounterMetricFamily("mqnode_process_cpu_seconds", "CPU time of a service's process", labels=["process"])
        rss = GaugeMetricFamily("mqnode_process_resident_memory_bytes", "Resident memory of a service's process",
                                labels=["process"])
        restarts = CounterMetricFamily("mqnode_process_restarts", "Times Ray restarted a service's process",
                                       labels=["process"])
        hangs = CounterMetricFamily("mqnode_process_hangs", "Hung processes the node's watch killed", labels=["process"])
        placed = {(h["process"], h["pid"]) for hosts in services.values() for h in hosts}  # (several services a process)
        for label, pid in sorted(placed):
            process = self._process(pid)
            if process is None:
                continue
            try:
                times, memory = process.cpu_times(), process.memory_info()
            except psutil.Error:
                continue
            cpu.add_metric([label], times.user + times.system)
            rss.add_metric([label], memory.rss)
        for label in sorted({label for label, _ in placed} | set(supervision)):  # (0 until the watch has counted)
            counts = supervision.get(label) or {}
            restarts.add_metric([label], counts.get("restarts", 0))
            hangs.add_metric([label], counts.get("hangs", 0))
        yield from (cpu, rss, restarts, hangs)

    def _process(self, pid) -> psutil.Process | None:
        if not isinstance(pid, int):
            return None
        process = self.processes.get(pid)
        if process is None:
            try:
                process = self.processes[pid] = psutil.Process(pid)
            except psutil.Error:
                return None
        return process


def _puts(actors: dict, runtime: dict):
    writer = actors.get("writer") or {}
    messages = CounterMetricFamily("mqnode_put_messages", "Messages sent, by topic and status",
                                   labels=["topic", "status"])
    size = CounterMetricFamily("mqnode_put_bytes", "Bytes stored, by topic", labels=["topic"])
    for topic, counts in sorted((writer.get("topics") or {}).items()):
        for status, n in sorted(counts["messages"].items()):
            messages.add_metric([topic, status], n)
        size.add_metric([topic], counts["bytes"])
    yield messages
    yield size
    buckets = _latency_buckets(runtime.get("putMessageDistributeTime", ""))
    if buckets:
        yield HistogramMetricFamily("mqnode_put_latency_seconds", "Time to append a group of sends "
                                    "(RocketMQ's putMessageDistributeTime ranges)", buckets=buckets, sum_value=None)
    failed = CounterMetricFamily("mqnode_put_failed", "Sends the write path failed to store")
    failed.add_metric([], writer.get("putMessageFailedTimes", 0))
    yield failed
    front = actors.get("front") or {}
    for name, what, key in (("mqnode_requests", "Requests the front took", "requests"),
                            ("mqnode_requests_refused", "Requests the front refused (busy, shutting down, illegal)",
                             "refused"),
                            ("mqnode_requests_malformed", "Requests the front could not read", "malformed")):
        family = CounterMetricFamily(name, what)
        family.add_metric([], front.get(key, 0))
        yield family
    replies = front.get("replies")
    if replies is not None:  # request-reply (actors.replies): pushed to their requesters, or not
        family = CounterMetricFamily("mqnode_replies", "Replies of request-reply, by whether the front pushed them to "
                                     "their requester's connection", labels=["pushed"])
        family.add_metric(["true"], replies.get("pushed", 0))
        family.add_metric(["false"], replies.get("unpushed", 0))
        yield family
    config = front.get("brokerConfig")
    if config is not None:  # (admin config update changes it while the node runs: a drained node shows 4)
        family = GaugeMetricFamily("mqnode_broker_permission", "The node's brokerPermission now: 6 read and write, "
                                   "4 read only, 2 write only")
        family.add_metric([], config["brokerPermission"])
        yield family
    if "acl" in front:
        family = CounterMetricFamily("mqnode_acl_refused", "Requests the ACL refused (NO_PERMISSION)")
        family.add_metric([], front["acl"]["refused"])
        yield family
    if "curve" in front:
        family = CounterMetricFamily("mqnode_curve_handshakes_refused", "CURVE clients the allow-list turned away")
        family.add_metric([], front["curve"]["handshakesRefused"])
        yield family


def _latency_buckets(text: str) -> list[tuple[str, float]]:
    """RocketMQ's "[<=0ms]:0 [0~10ms]:10 ... [10s~]:0" as cumulative (le, count) buckets."""
    out, total = [], 0
    for label, count in _DISTRIBUTION.findall(text):
        total += int(count)
        upper = label.split("~")[-1] if "~" in label else label.lstrip("<=")
        out.append((_upper_seconds(upper), total))
    if out:
        out[-1] = ("+Inf", total)
    return out


def _upper_seconds(text: str) -> str:
    """A range's upper end ("10ms", "1s") in seconds, Prometheus's base unit."""
    if not text:
        return "+Inf"
    if text.endswith("ms"):
        return repr(float(text[:-2]) / 1000)
    if text.endswith("s"):
        return repr(float(text[:-1]))
    return "+Inf"


def _pulls(actors: dict):
    messages = CounterMetricFamily("mqnode_pull_messages", "Messages pulled, by topic and group", labels=["topic", "group"])
    size = CounterMetricFamily("mqnode_pull_bytes", "Bytes pulled, by topic and group", labels=["topic", "group"])
    totals: dict[tuple[str, str], list[int]] = {}
    for label, stats in actors.items():  # the read service's shells, whichever process hosts them
        reads = stats if label.startswith("pull") else None
        for topic, group, n, bytes_ in (reads or {}).get("pulled") or []:
            counts = totals.setdefault((topic, group), [0, 0])
            counts[0] += n
            counts[1] += bytes_
    for (topic, group), (n, bytes_) in sorted(totals.items()):
        messages.add_metric([topic, group], n)
        size.add_metric([topic, group], bytes_)
    yield messages
    yield size


def _store(actors: dict, control: dict):
    for name, what, value in (
            ("mqnode_commitlog_written_bytes", "CommitLog offset acknowledged sends reach", control.get("written", 0)),
            ("mqnode_commitlog_flushed_bytes", "CommitLog offset on disk", control.get("flushed", 0)),
            ("mqnode_dispatch_lag_bytes", "CommitLog bytes not yet in the ConsumeQueues and index",
             max(0, control.get("written", 0) - control.get("dispatched", 0))),
            ("mqnode_commitlog_min_offset_bytes", "The oldest CommitLog offset kept", control.get("min_offset", 0))):
        family = GaugeMetricFamily(name, what)
        family.add_metric([], value)
        yield family
    flush = actors.get("flush") or {}
    for name, what, key in (("mqnode_flushes", "Group commits (flushes of the CommitLog)", "flushes"),
                            ("mqnode_flush_disk_timeouts", "SYNC_FLUSH sends answered FLUSH_DISK_TIMEOUT",
                             "flushDiskTimeouts")):
        family = CounterMetricFamily(name, what)
        family.add_metric([], flush.get(key, 0))
        yield family
    for name, what, key in (("mqnode_flush_average_seconds", "Average flush time", "flushAvgMicros"),
                            ("mqnode_flush_max_seconds", "Longest flush", "flushMaxMicros")):
        family = GaugeMetricFamily(name, what)
        family.add_metric([], flush.get(key, 0) / 1e6)
        yield family
    clean = actors.get("clean") or {}
    ratio = GaugeMetricFamily("mqnode_disk_used_ratio", "Used share of the disk holding each store part",
                              labels=["store"])
    for store, value in sorted((clean.get("diskRatio") or {}).items()):
        ratio.add_metric([store], value)
    yield ratio
    full = GaugeMetricFamily("mqnode_disk_full", "1 while sends are refused for a full disk")
    full.add_metric([], 1 if clean.get("diskFull") else 0)
    yield full
    deleted = CounterMetricFamily("mqnode_clean_deleted_bytes", "CommitLog bytes deleted, by cause", labels=["cause"])
    for cause, value in sorted((clean.get("deletedBytes") or {}).items()):
        deleted.add_metric([cause], value)
    yield deleted


def _schedule(schedule: dict):
    lag = GaugeMetricFamily("mqnode_schedule_lag_messages", "Delayed messages of a level not yet delivered",
                            labels=["level"])
    lateness = GaugeMetricFamily("mqnode_schedule_lag_seconds", "How late the oldest due message of a level is",
                                 labels=["level"])
    delivered = CounterMetricFamily("mqnode_schedule_delivered", "Delayed messages delivered, by level",
                                    labels=["level"])
    for level, stats in sorted((schedule.get("levels") or {}).items(), key=lambda item: int(item[0])):
        lag.add_metric([level], stats.get("lag", 0))
        lateness.add_metric([level], stats.get("lagMillis", 0) / 1000)
        delivered.add_metric([level], stats.get("delivered", 0))
    yield from (lag, lateness, delivered)
    timers = schedule.get("timers") or {}
    for name, what, value, kind in (
            ("mqnode_timers_pending", "Timer messages waiting for their time", timers.get("pending", 0), GaugeMetricFamily),
            ("mqnode_timers_due_undelivered", "Timer messages due and not yet stored", timers.get("dueUndelivered", 0),
             GaugeMetricFamily),
            ("mqnode_timers_delivered", "Timer messages delivered", timers.get("delivered", 0), CounterMetricFamily),
            ("mqnode_timers_recalled", "Timer messages recalled before their time (not delivered)",
             timers.get("recalled", 0), CounterMetricFamily),
            ("mqnode_timers_lateness_p99_seconds", "p99 lateness of the last 1024 timer deliveries",
             ((timers.get("latenessMillis") or {}).get("p99") or 0) / 1000, GaugeMetricFamily),
            ("mqnode_send_backs", "Consumers' send-backs stored", schedule.get("sendBacks", 0), CounterMetricFamily),
            ("mqnode_dead_letters", "Send-backs that went to a %DLQ% topic", schedule.get("deadLetters", 0),
             CounterMetricFamily)):
        family = kind(name, what)
        family.add_metric([], value)
        yield family


class MetricsServer:
    """`/metrics` on metricsAddress:metricsPort until `stop`."""

    def __init__(self, settings, max_offset):
        from prometheus_client import start_http_server

        self.asker = NodeAsker(settings.local_endpoint, guard.node_credentials(settings))
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NodeCollector(self.asker, max_offset))
        self.server, self.thread = start_http_server(settings.metricsPort, settings.metricsAddress, self.registry)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.asker.close()


def _proxy(proxy: dict):
    """The gRPC proxy (actors.proxy): its calls by RPC and messages, since its process started;
    the clients it knows and the messages it keeps invisible for push consumers."""
    calls = CounterMetricFamily("mqnode_grpc_calls", "gRPC calls the proxy took, by RPC", labels=["rpc"])
    for rpc, count in sorted((proxy.get("calls") or {}).items()):
        calls.add_metric([rpc], count)
    yield calls
    for name, what, key, kind in (
            ("mqnode_grpc_refused", "gRPC calls or messages answered with a refusal", "refused", CounterMetricFamily),
            ("mqnode_grpc_messages_sent", "Messages stored through SendMessage", "messagesSent", CounterMetricFamily),
            ("mqnode_grpc_messages_received", "Messages handed out through ReceiveMessage", "messagesReceived",
             CounterMetricFamily),
            ("mqnode_grpc_messages_acked", "Messages acked through AckMessage", "messagesAcked", CounterMetricFamily),
            ("mqnode_grpc_messages_pulled", "Messages handed out through PullMessage", "messagesPulled",
             CounterMetricFamily),
            ("mqnode_grpc_renewals", "Invisible times the proxy renewed for push consumers", "renewals",
             CounterMetricFamily),
            ("mqnode_grpc_clients", "RocketMQ 5 clients the proxy heard from lately", "clients", GaugeMetricFamily),
            ("mqnode_grpc_renewing_messages", "Messages the proxy keeps invisible for push consumers now", "renewing",
             GaugeMetricFamily)):
        family = kind(name, what)
        family.add_metric([], proxy.get(key, 0))
        yield family


def _transactions(service: dict):
    """Transactional messages (actors.transaction): halves open now, outcomes and checks."""
    outcomes = CounterMetricFamily("mqnode_transactions", "Half messages ended, by outcome (as the op records "
                                   "still on disk say)", labels=["outcome"])
    for outcome, key in (("commit", "committed"), ("rollback", "rolledBack"), ("discard", "discarded")):
        outcomes.add_metric([outcome], service.get(key, 0))
    yield outcomes
    for name, what, key, kind in (
            ("mqnode_transactions_pending", "Half messages no end has closed yet", "pending", GaugeMetricFamily),
            ("mqnode_transaction_checks", "CHECK_TRANSACTION_STATE sent to producers (since the service's "
             "process started)", "checksSent", CounterMetricFamily),
            ("mqnode_transactions_oldest_pending_seconds", "Age of the oldest open half", "oldestPendingMillis",
             GaugeMetricFamily)):
        family = kind(name, what)
        family.add_metric([], service.get(key, 0) / (1000 if key == "oldestPendingMillis" else 1))
        yield family


def _pop(pop: dict):
    """Pop consumption (actors.pop): counters since the pop service's process started."""
    for name, what, key, kind in (
            ("mqnode_pop_popped", "Messages handed out by pops (again included)", "popped", CounterMetricFamily),
            ("mqnode_pop_acked", "Popped messages acked", "acked", CounterMetricFamily),
            ("mqnode_pop_redelivered", "Popped messages whose invisible time ran out unacked", "redelivered",
             CounterMetricFamily),
            ("mqnode_pop_dead_lettered", "Popped messages moved to %DLQ% past their group's retries", "deadLettered",
             CounterMetricFamily),
            ("mqnode_pop_in_flight_messages", "Popped messages invisible now, not yet acked", "inFlight",
             GaugeMetricFamily),
            ("mqnode_pop_held_requests", "Empty pops held (long polling)", "held", GaugeMetricFamily)):
        family = kind(name, what)
        family.add_metric([], pop.get(key, 0))
        yield family
