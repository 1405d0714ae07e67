"""CPU and memory of a node's processes, sampled with psutil.

The node is a process tree: `mqnode start`, Ray's own processes, and one Ray worker per actor.
The tree is re-read at every sample (Ray restarts actors as new processes). CPU is the sum of
user+system time deltas over the tree (100% = one core); memory is what an operator can act on
(actors.memory): the node's anonymous memory and its proportional set size, with the mapped
files' share apart; the sum of RSS, which counts the shared segments once per process that
touched them, is kept for comparison only. For a node this run did not start, the tree is found from the process
listening on the endpoint's port, walking up to the `mqnode start` process.
"""

from __future__ import annotations

import time
from urllib.parse import urlparse

import psutil

from actors.memory import node_memory


class NodeMonitor:
    def __init__(self, root_pid: int | None):
        self.root_pid = root_pid
        self.cpu_seen: dict[int, float] = {}
        self.last: float | None = None

    @classmethod
    def for_endpoint(cls, endpoint: str) -> NodeMonitor:
        return cls(find_node_pid(endpoint))

    def processes(self) -> list[psutil.Process]:
        if self.root_pid is None:
            return []
        try:
            root = psutil.Process(self.root_pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def sample(self) -> tuple[float | None, dict | None]:
        """(CPU % of one core since the last sample, the node's memory: actors.memory.node_memory);
        (None, None) if unknown."""
        processes = self.processes()
        if not processes:
            return None, None
        now, used, seen = time.monotonic(), 0.0, {}
        for p in processes:
            try:
                times = p.cpu_times()
            except psutil.Error:
                continue
            total = times.user + times.system + times.children_user + times.children_system
            seen[p.pid] = total
            used += total - self.cpu_seen.get(p.pid, total if self.last is None else 0.0)
        elapsed = None if self.last is None else now - self.last
        self.cpu_seen, self.last = seen, now
        return (100 * used / elapsed if elapsed else None), node_memory(seen)


def find_node_pid(endpoint: str) -> int | None:
    """The `mqnode start` process behind a tcp endpoint on this machine, if it can be seen."""
    port = urlparse(endpoint).port if endpoint.startswith("tcp://") else None
    if port is None:
        return None
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.Error:
        return None
    for c in connections:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            process = psutil.Process(c.pid)
            best = process
            for parent in process.parents():
                if "node.tools.cli" in " ".join(parent.cmdline()) or "mqnode" in parent.name():
                    best = parent
            return best.pid
    return None
