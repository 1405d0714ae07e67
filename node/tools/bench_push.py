"""The push consumer's figures for scripts/bench-consume (node.client.push): throughput with a
no-op listener over a backlog, one member and four member processes, and how soon every queue is
consumed again after a member unregisters or is killed. Members run in their own processes
(`multiprocessing`, spawn) and report what they consumed through a queue."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

QUEUES = 8


def _member(endpoint: str, group: str, topic: str, name: str, reports, stop) -> None:
    """A push consumer with a no-op listener; reports (name, queue id, store ms, now) once a
    second per queue it consumed from, and its total when `stop` is set."""
    from node.client.push import CONSUME_SUCCESS, PushConsumer

    seen: dict[int, float] = {}
    count = [0]

    def listener(messages) -> str:
        count[0] += len(messages)
        seen[messages[0].queue_id] = time.time()
        return CONSUME_SUCCESS

    consumer = PushConsumer(endpoint, group, consume_from_where="FIRST_OFFSET", instance_name=name,
                            consume_message_batch_max_size=32)
    consumer.subscribe(topic)
    consumer.register_listener(listener)
    consumer.start()
    reports.put(("started", name, time.time()))
    while not stop.wait(0.05):
        reports.put(("progress", name, count[0], dict(seen)))
    consumer.shutdown()
    reports.put(("done", name, count[0]))


class Members:
    def __init__(self, endpoint: str, group: str, topic: str, count: int):
        context = multiprocessing.get_context("spawn")
        self.reports, self.stops = context.Queue(), {}
        self.processes = {}
        for i in range(count):
            name = f"{group}-{i}"
            self.stops[name] = context.Event()
            self.processes[name] = context.Process(target=_member, args=(endpoint, group, topic, name, self.reports,
                                                                         self.stops[name]), daemon=True)
            self.processes[name].start()
        self.counts = {name: 0 for name in self.processes}
        self.last_seen: dict[str, dict[int, float]] = {name: {} for name in self.processes}

    def poll(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                report = self.reports.get(timeout=max(0.01, deadline - time.monotonic()))
            except Exception:  # queue.Empty
                return
            if report[0] in ("progress", "done"):
                self.counts[report[1]] = report[2]
            if report[0] == "progress":
                self.last_seen[report[1]] = report[3]

    def total(self) -> int:
        return sum(self.counts.values())

    def stop(self, name: str) -> None:
        self.stops[name].set()
        self.processes[name].join(30)

    def kill(self, name: str) -> None:
        os.kill(self.processes[name].pid, signal.SIGKILL)
        self.processes[name].join(10)

    def close(self) -> None:
        for name, process in self.processes.items():
            if process.is_alive():
                self.stop(name)


def throughput(endpoint: str, topic: str, backlog: int, members: int) -> float:
    """msgs/s of `members` push consumers (one process each) draining the `backlog` messages
    the topic holds, from the first message consumed to the last (a start-up rebalance's few
    duplicates count towards the end)."""
    group = f"BenchPush{members}x{int(time.time())}"
    running = Members(endpoint, group, topic, members)
    try:
        began, at = None, 0
        deadline = time.monotonic() + 300
        while running.total() < backlog and time.monotonic() < deadline:
            running.poll(0.05)
            if began is None and running.total() > 0:
                began, at = time.perf_counter(), running.total()
        return (running.total() - at) / (time.perf_counter() - began) if began else 0.0
    finally:
        running.close()


def takeover(endpoint: str, topic: str, kill: bool, producer_send) -> float:
    """Two members; one leaves (stops: unregisters, or is killed); seconds until the other has
    consumed a message sent after that on every queue the leaver had."""
    group = f"BenchTakeover{'Kill' if kill else 'Leave'}{int(time.time())}"
    running = Members(endpoint, group, topic, 2)
    try:
        for _ in range(100):  # both in, each with its share
            producer_send()
            running.poll(0.2)
            if all(len(seen) >= QUEUES // 2 for seen in running.last_seen.values()):
                break
        leaver, stayer = sorted(running.processes)
        theirs = set(running.last_seen[leaver])
        left = time.time()  # (from the request to leave: a clean leaver's queues move while it shuts down)
        (running.kill if kill else running.stop)(leaver)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            producer_send()
            running.poll(0.05)
            seen = running.last_seen[stayer]
            if all(seen.get(q, 0) > left for q in theirs):
                return max(seen[q] for q in theirs) - left
        return float("inf")
    finally:
        running.close()
