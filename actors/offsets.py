"""Consumer offsets: `config/consumerOffset.json` as RocketMQ writes it.

`{"offsetTable":{"<topic>@<group>":{0:12,1:7}}}` (bare integer keys, spec §8), the value being
the next queue offset to consume. Single writer: the front. Persisted every
`flushConsumerOffsetInterval` ms when changed, and at stop; RocketMQ's own files load. A write
that finds the disk full is made again at the next period (actors.config_files).
"""

from __future__ import annotations

import time
from pathlib import Path

from actors import config_files


class ConsumerOffsets:
    def __init__(self, config_dir: Path):
        self.path = Path(config_dir) / "consumerOffset.json"
        self.table: dict[str, dict[int, int]] = {}
        self.dirty = False
        data = config_files.read(self.path) or {}
        for key, queues in (data.get("offsetTable") or {}).items():
            self.table[key] = {int(q): int(o) for q, o in queues.items()}

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.table.setdefault(f"{topic}@{group}", {})[queue_id] = offset
        self.dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.table.get(f"{topic}@{group}", {}).get(queue_id)

    def forget(self, *, topic: str | None = None, group: str | None = None) -> int:
        """Drop every offset of a deleted topic or group; how many queues' offsets went."""
        gone = [key for key in self.table if (topic is not None and key.rpartition("@")[0] == topic)
                or (group is not None and key.rpartition("@")[2] == group)]
        for key in gone:
            dropped = self.table.pop(key)
            self.dirty = True
            del dropped
        return len(gone)

    def of_group(self, group: str) -> dict[str, dict[int, int]]:
        return {key.rpartition("@")[0]: dict(queues) for key, queues in self.table.items()
                if key.rpartition("@")[2] == group}

    def persist(self, *, force: bool = False) -> bool:
        if not (self.dirty or force):
            return False
        ordered = {key: dict(sorted(queues.items())) for key, queues in sorted(self.table.items())}
        if not config_files.persist(self.path, {"offsetTable": ordered}):
            return False  # (still dirty: again at the next period)
        self.dirty = False
        return True


class SubscriptionGroups(config_files.VersionedFile):
    """`config/subscriptionGroup.json`: a group is created (RocketMQ's defaults) the first time it
    commits an offset, as autoCreateSubscriptionGroup does. Single writer: the front."""

    table_name = "subscriptionGroupTable"

    def __init__(self, config_dir: Path, clock=time.time):
        path = Path(config_dir) / "subscriptionGroup.json"
        data = config_files.read(path) or {}
        super().__init__(path, int((data.get("dataVersion") or {}).get("counter", 0)), clock)
        self.groups: dict[str, dict] = dict(data.get("subscriptionGroupTable") or {})

    def ensure(self, group: str) -> bool:
        """True when the group was new (and has now been persisted)."""
        if group in self.groups:
            return False
        self.groups[group] = _default_group(group)
        self.persist()
        return True

    def update(self, group: str, changes: dict) -> dict:
        """A group created (RocketMQ's defaults) or changed: `admin group create|update`."""
        config = self.groups[group] = {**(self.groups.get(group) or _default_group(group)), **changes}
        self.persist()
        return dict(config)

    def delete(self, group: str) -> bool:
        if self.groups.pop(group, None) is None:
            return False
        self.persist()
        return True

    def retry_max_times(self, group: str) -> int:
        return int((self.groups.get(group) or {}).get("retryMaxTimes", 16))

    def table(self) -> dict:
        return dict(sorted(self.groups.items()))


def _default_group(group: str) -> dict:
    """subscriptionGroup.json's entry for a new group, RocketMQ 4.9's defaults."""
    return {"brokerId": 0, "consumeBroadcastEnable": True, "consumeEnable": True, "consumeFromMinEnable": True,
            "groupName": group, "notifyConsumerIdsChangedEnable": True, "retryMaxTimes": 16, "retryQueueNums": 1,
            "whichBrokerWhenConsumeSlowly": 1}
