"""Topic names and the topic table, persisted in `config/topics.json` as RocketMQ writes it.

Single writer: the front, which sees every request first; it validates names, auto-creates
topics (`autoCreateTopicEnable`, `defaultTopicQueueNums` queues) and persists the table.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from actors import config_files

TOPIC_MAX_LENGTH = 127
_TOPIC_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")
# RocketMQ's system topics: stored by the broker itself, never sent to by clients.
SYSTEM_TOPICS = frozenset({"SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC",
                           "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC",
                           "OFFSET_MOVED_EVENT", "TBW102", "rmq_sys_wheel_timer"})
SYSTEM_TOPIC_PREFIX = "RMQ_SYS_"
NODE_STORED_PREFIXES = ("%RETRY%", "%DLQ%")  # a group's topics, which the node makes at their first use
REPLY_TOPIC_SUFFIX = "_REPLY_TOPIC"  # <brokerClusterName>_REPLY_TOPIC (node.protocol.reply_topic)
PERM_READ, PERM_WRITE = 4, 2


def topic_error(topic) -> str | None:
    """Why `topic` cannot be sent to (Validators.checkTopic plus the system-topic rule), or None."""
    if not isinstance(topic, str):
        return f"the topic must be a string, not {type(topic).__name__}"
    if not topic:
        return "the topic is missing or empty"
    if len(topic) > TOPIC_MAX_LENGTH:
        return f"the topic is {len(topic)} characters; at most {TOPIC_MAX_LENGTH} are allowed"
    if not _TOPIC_PATTERN.match(topic):
        return f"the topic {topic!r} may only contain characters from [%|a-zA-Z0-9_-]"
    if topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX):
        return f"the topic {topic} is a system topic"
    return None


DELETED_KEY = "deletedTopics"  # mqnode's key in topics.json: {topic: the CommitLog's end at its deletion}


def deletion_floors(config_dir: Path) -> dict[str, int]:
    """topic -> its deletion floor: the CommitLog's end when it was last deleted. Every reader
    passes over a queue's entries below it (shm.reader.QueueView.floor): those messages are the
    deleted topic's, whatever was sent under the name since. {} without a readable topics.json."""
    return _floors(config_files.read(Path(config_dir) / "topics.json"))


def _floors(data) -> dict[str, int]:
    kept = data.get(DELETED_KEY) if isinstance(data, dict) else None
    if not isinstance(kept, dict):
        return {}
    return {name: floor for name, floor in kept.items() if type(floor) is int and floor > 0}


def deleted_topics(config_dir: Path) -> Callable[[str], int | None] | None:
    """A ConsumeQueue directory's topic -> its deletion floor (deletion_floors; 0 when none is
    kept) for a topic clients send to that `topics.json` no longer holds, None for the others. A
    retry, dead-letter or request-reply topic counts only when deleted by name (it has a floor):
    the node makes those at their first use, and a store from before that has them without an
    entry. None without a readable `topics.json`: nothing is known to be deleted (a new store, or
    one written by RocketMQ with its table elsewhere)."""
    data = config_files.read(Path(config_dir) / "topics.json")
    if not isinstance(data, dict) or not isinstance(data.get("topicConfigTable"), dict):
        return None
    table, floors = frozenset(data["topicConfigTable"]), _floors(data)

    def deleted_at(topic: str) -> int | None:
        if topic in table or topic_error(topic) is not None:
            return None
        if topic in floors:
            return floors[topic]
        return None if topic.startswith(NODE_STORED_PREFIXES) or topic.endswith(REPLY_TOPIC_SUFFIX) else 0

    return deleted_at


@dataclass
class TopicConfig:
    topicName: str
    readQueueNums: int = 8
    writeQueueNums: int = 8
    perm: int = PERM_READ | PERM_WRITE
    topicFilterType: str = "SINGLE_TAG"
    topicSysFlag: int = 0
    order: bool = False

    def to_json(self) -> dict:
        return {"order": self.order, "perm": self.perm, "readQueueNums": self.readQueueNums,
                "topicFilterType": self.topicFilterType, "topicName": self.topicName,
                "topicSysFlag": self.topicSysFlag, "writeQueueNums": self.writeQueueNums}

    @classmethod
    def from_json(cls, name: str, data: dict) -> TopicConfig:
        return cls(topicName=data.get("topicName", name), readQueueNums=int(data.get("readQueueNums", 16)),
                   writeQueueNums=int(data.get("writeQueueNums", 16)), perm=int(data.get("perm", 6)),
                   topicFilterType=data.get("topicFilterType", "SINGLE_TAG"),
                   topicSysFlag=int(data.get("topicSysFlag", 0)), order=bool(data.get("order", False)))


class TopicTable(config_files.VersionedFile):
    table_name = "topicConfigTable"

    def __init__(self, config_dir: Path, *, auto_create: bool, default_queues: int, clock=time.time):
        super().__init__(Path(config_dir) / "topics.json", 0, clock)
        self.auto_create = auto_create
        self.default_queues = default_queues
        self.topics: dict[str, TopicConfig] = {}
        self.deleted: dict[str, int] = {}  # DELETED_KEY's: topic -> its deletion floor
        self.log_span: Callable[[], tuple[int, int]] = lambda: (0, 0)  # the CommitLog's (min offset, end) now
        self.on_auto_create: Callable[[str], None] = lambda topic: None  # (the front: its subscribers are told)
        self.load()
        self.floors_told = dict(self.deleted)  # (what the readers read at their start)

    def load(self) -> None:
        data = config_files.read(self.path) or {}
        table = data.get("topicConfigTable") or {}
        self.topics = {name: TopicConfig.from_json(name, value) for name, value in table.items()}
        # a table written by RocketMQ lists system topics too: known, still not for clients to send to
        self.unsendable = {name for name in self.topics if topic_error(name)}
        self.deleted = _floors(data)
        self.counter = int((data.get("dataVersion") or {}).get("counter", 0))

    def get(self, topic: str) -> TopicConfig | None:
        return self.topics.get(topic)

    def resolve(self, topic: str) -> tuple[TopicConfig | None, str, str]:
        """(config, "", "") for a usable topic, creating it when allowed; else (None, status,
        reason): MESSAGE_ILLEGAL for a bad name, TOPIC_NOT_EXIST for an unknown one."""
        config = self.topics.get(topic) if isinstance(topic, str) else None
        if config is not None and topic not in self.unsendable:
            return config, "", ""
        problem = topic_error(topic)
        if problem:
            return None, "MESSAGE_ILLEGAL", problem
        if not self.auto_create:
            return None, "TOPIC_NOT_EXIST", f"topic {topic} does not exist and autoCreateTopicEnable is false"
        config = self.create(topic, self.default_queues)
        self.on_auto_create(topic)
        return config, "", ""

    def create(self, topic: str, queues: int) -> TopicConfig:
        config = self.topics[topic] = TopicConfig(topic, queues, queues)
        self.persist()
        return config

    def table(self) -> dict:
        return {name: config.to_json() for name, config in sorted(self.topics.items())}

    def extras(self) -> dict:
        return {DELETED_KEY: dict(sorted(self.deleted.items()))} if self.deleted else {}

    def floors_changed(self) -> bool:
        """Whether the deletion floors changed since the last call (the front then tells the
        readers: the control block's `topics_deleted`)."""
        changed, self.floors_told = self.deleted != self.floors_told, dict(self.deleted)
        return changed

    def delete(self, topic: str) -> None:
        """`topic` goes, and with it every message stored under it so far: its deletion floor is
        the CommitLog's end now (`log_span`: the front's control block), which the readers follow.
        A floor cleaning has passed hides nothing any more and is forgotten."""
        low, end = self.log_span()
        del self.topics[topic]
        self.deleted[topic] = max(self.deleted.get(topic, 0), end)
        self.deleted = {name: floor for name, floor in self.deleted.items() if floor > low}
        self.persist()
