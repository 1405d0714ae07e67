"""What GET_RUNTIME_INFO (`mqnode admin stats`) answers, gathered by the front: each actor's
statistics as it pushes them once a second (actors.base), RocketMQ's put figures from the
writer's counters and the front's reply latencies (actors.store_stats), the declared topology
with each process's pid, the node's watch counts and its memory."""

from __future__ import annotations

import orjson

from actors.memory import node_memory
from actors.store_stats import StoreStats


class NodeStatistics:
    def __init__(self, settings, hosts: dict[str, list[str]], now_ms: int):
        self.settings, self.hosts = settings, hosts
        self.actors: dict[str, dict] = {}  # label -> its last statistics
        self.store = StoreStats(now_ms)

    def take(self, raw: bytes, now_ms: int) -> None:
        """One actor's statistics, as it pushed them."""
        stats = orjson.loads(raw)
        self.actors[stats["actor"]] = stats
        if stats["actor"] == "writer" and "putMessageTimesTotal" in stats:  # (a slave's writer has no core)
            self.store.sample(now_ms, stats["putMessageTimesTotal"], stats["putMessageSizeTotal"],
                              stats["putMessageFailedTimes"])

    def answer(self, live: dict[str, dict], control: dict, now_ms: int) -> dict:
        """The reply's fields; `live` the statistics of the front's own process, taken now."""
        actors = dict(self.actors) | live
        return {"runtime": self.store.runtime_info(now_ms), "actors": dict(sorted(actors.items())),
                "control": control, "services": services_with_pids(self.hosts, actors),
                "supervision": supervision_counts(self.settings),
                "memory": node_memory(stats["pid"] for stats in actors.values() if "pid" in stats)}


def services_with_pids(hosts: dict[str, list[str]], actors: dict[str, dict]) -> dict[str, list[dict]]:
    """Each service of the declared topology with the process that hosts it and its pid (None
    until that process has sent its first statistics): `admin stats`' `services`."""
    return {service: [{"process": label, "pid": actors.get(label, {}).get("pid")} for label in labels]
            for service, labels in hosts.items()}


def supervision_counts(settings) -> dict:
    """Restarts and hangs per service process, as the node's watch last counted them
    (`supervision.json` in the run directory, node.server.supervision): `admin stats`' `supervision`."""
    try:
        return orjson.loads((settings.run_dir / "supervision.json").read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return {}  # not written yet (or a node whose launcher is not watching)
