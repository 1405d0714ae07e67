"""Which of a group's queues one member consumes: RocketMQ's AllocateMessageQueueStrategy.

Every member computes its own share from the same inputs (the topic's queues and the group's
client ids, both sorted), so the shares cover every queue exactly once without talking to each
other. `averagely` (RocketMQ's default) gives each member a run of adjacent queues;
`averagely-by-circle` deals them out in turn; `consistent-hash` places the members on a ring of
virtual nodes (10 each) by MD5, so a member joining or leaving moves only its neighbours' queues.
"""

from __future__ import annotations

import bisect
import hashlib

Queue = tuple[str, int]  # (topic, queue id)
STRATEGIES = ("averagely", "averagely-by-circle", "consistent-hash")
VIRTUAL_NODES = 10


def allocate(strategy: str, me: str, queues: list[Queue], members: list[str], broker: str = "broker-a") -> list[Queue]:
    """My share of `queues` among `members` (a member not in the list gets nothing)."""
    queues, members = sorted(queues), sorted(members)
    if me not in members or not queues:
        return []
    if strategy == "averagely":
        return _averagely(me, queues, members)
    if strategy == "averagely-by-circle":
        index = members.index(me)
        return [q for i, q in enumerate(queues) if i % len(members) == index]
    if strategy == "consistent-hash":
        return _consistent_hash(me, queues, members, broker)
    raise ValueError(f"allocate_strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")


def _averagely(me: str, queues: list[Queue], members: list[str]) -> list[Queue]:
    index, count, total = members.index(me), len(members), len(queues)
    mod = total % count
    if total <= count:
        size = 1
    else:
        size = total // count + 1 if mod > 0 and index < mod else total // count
    start = index * size if mod > 0 and index < mod else index * size + mod
    return [queues[(start + i) % total] for i in range(min(size, total - start))]


def _hash(key: str) -> int:
    digest = hashlib.md5(key.encode()).digest()
    return int.from_bytes(digest[:4], "big")


def _consistent_hash(me: str, queues: list[Queue], members: list[str], broker: str) -> list[Queue]:
    ring = sorted((_hash(f"{member}-{replica}"), member) for member in members for replica in range(VIRTUAL_NODES))
    points = [point for point, _ in ring]
    mine = []
    for topic, queue_id in queues:
        at = bisect.bisect_left(points, _hash(f"MessageQueue [topic={topic}, brokerName={broker}, queueId={queue_id}]"))
        if ring[at % len(ring)][1] == me:
            mine.append((topic, queue_id))
    return mine
