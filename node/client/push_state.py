"""The push consumer's state, apart from its loops (node.client.push): its options with
RocketMQ's names and defaults, what one queue holds (`ProcessQueue`), and a broadcasting
member's offsets file."""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from node.client.allocate import STRATEGIES
from node.client.received import ReceivedMessage, retopic
from node.security import Credentials

CONSUME_SUCCESS, RECONSUME_LATER = "CONSUME_SUCCESS", "RECONSUME_LATER"  # concurrent listeners
SUCCESS, SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUCCESS", "SUSPEND_CURRENT_QUEUE_A_MOMENT"  # orderly listeners
CLUSTERING, BROADCASTING = "CLUSTERING", "BROADCASTING"
FROM_WHERE = {"LAST_OFFSET": "CONSUME_FROM_LAST_OFFSET", "FIRST_OFFSET": "CONSUME_FROM_FIRST_OFFSET",
              "TIMESTAMP": "CONSUME_FROM_TIMESTAMP"}
RETRY_PREFIX = "%RETRY%"
PULL_SUSPEND_MS = 15_000  # a long poll's hold (RocketMQ's brokerSuspendMaxTimeMillis)
LOCAL_RETRY_S = 5.0  # a hand-back the node refused is consumed again after this
FLOW_CONTROL_S = 0.05
PULL_ERROR_S = 3.0
LOCK_RENEW_S = 20.0  # at most; a node with a shorter rebalanceLockMaxLiveTime gets a third of it


class ListenerStatuses:
    """What a listener's return value means. Either kind's success is a success: both constants
    are exported side by side (`from node.client import SUCCESS, CONSUME_SUCCESS`), and a concurrent
    listener that returned orderly's SUCCESS had every message taken as failed: sent back and
    consumed again up to its retries, then dead-lettered (a soak consumed each message twice and
    more). Any other value but its kind's failure (None, a typo) is a failure too, as RocketMQ
    takes a null (CR_RETURN_NULL), and is said once a consumer."""

    SUCCESSES = frozenset({CONSUME_SUCCESS, SUCCESS})

    def __init__(self, success: str, failure: str, log: logging.Logger):
        self.success, self.failure, self.log = success, failure, log
        self.told: set[str] = set()  # (added to from the pool's threads: at worst said twice)

    def succeeded(self, status: object) -> bool:
        if status in self.SUCCESSES:
            return True
        if status != self.failure and repr(status) not in self.told:
            self.told.add(repr(status))
            self.log.warning("a listener returned %r, not %s or %s: taken as %s", status, self.success, self.failure,
                             self.failure)
        return False


@dataclass
class PushOptions:
    message_model: str = CLUSTERING
    consume_thread_min: int = 20
    consume_thread_max: int = 20
    consume_message_batch_max_size: int = 1
    pull_batch_size: int = 32
    pull_threshold_for_queue: int = 1000
    pull_threshold_size_for_queue: int = 100  # MiB
    consume_from_where: str = "LAST_OFFSET"  # or FIRST_OFFSET, TIMESTAMP (then consume_timestamp, ms)
    consume_timestamp: int | None = None  # default: half an hour ago, as RocketMQ
    max_reconsume_times: int = 16
    consume_timeout: float = 15.0  # minutes
    allocate_strategy: str = "averagely"
    suspend_current_queue_time_millis: int = 1000
    heartbeat_interval: float = 30.0
    rebalance_interval: float = 20.0
    persist_interval: float = 5.0
    instance_name: str | None = None  # default: the process id
    offset_store_dir: str = "~/.mqnode/offsets"
    timeout: float = 5.0
    credentials: Credentials | None = None

    def check(self) -> None:
        if self.message_model not in (CLUSTERING, BROADCASTING):
            raise ValueError(f"message_model must be CLUSTERING or BROADCASTING, not {self.message_model!r}")
        if self.consume_from_where.removeprefix("CONSUME_FROM_") not in FROM_WHERE:
            raise ValueError(f"consume_from_where must be one of {', '.join(FROM_WHERE)}")
        if self.allocate_strategy not in STRATEGIES:
            raise ValueError(f"allocate_strategy must be one of {', '.join(STRATEGIES)}")
        if not 1 <= self.consume_thread_min <= self.consume_thread_max <= 1000:
            raise ValueError("need 1 <= consume_thread_min <= consume_thread_max <= 1000")
        if not 1 <= self.pull_batch_size <= 1024 or not 1 <= self.consume_message_batch_max_size <= 1024:
            raise ValueError("pull_batch_size and consume_message_batch_max_size must be 1..1024")
        # RocketMQ's DefaultMQPushConsumerImpl.checkConfig ranges; and the periods above 0 (heartbeat_interval=0
        # sent heartbeats in a loop that never slept, as fast as the node answered)
        for name, least, most in (("pull_threshold_for_queue", 1, 65535), ("pull_threshold_size_for_queue", 1, 1024),
                                  ("suspend_current_queue_time_millis", 10, 30000), ("max_reconsume_times", -1, 10_000)):
            value = getattr(self, name)
            if type(value) is not int or not least <= value <= most:
                raise ValueError(f"{name} must be an integer from {least} to {most}, not {value!r}")
        for name in ("heartbeat_interval", "rebalance_interval", "persist_interval", "consume_timeout", "timeout"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a number of seconds (minutes: consume_timeout) above 0, not {value!r}")


def as_subscribed(message: ReceivedMessage, read_from: str) -> None:
    """A message read from a group's retry topic (`read_from`), shown under the topic it was sent
    to (its RETRY_TOPIC), as RocketMQ's resetRetryAndNamespace shows it to the listener."""
    retry_topic = message.properties.get("RETRY_TOPIC") if read_from.startswith(RETRY_PREFIX) else None
    if retry_topic:
        retopic(message, retry_topic)


@dataclass
class ProcessQueue:
    """One queue this member consumes: what was pulled and is not done, and where to go on."""

    topic: str
    queue_id: int
    next_offset: int  # the next pull's offset
    pending: dict[int, list] = field(default_factory=dict)  # queue offset -> [message, size, given at (s)]
    buffer: deque = field(default_factory=deque)  # orderly: messages not yet given to the listener
    size: int = 0
    dropped: bool = False
    reset: bool = False  # the group's offsets were reset under it: nothing of it is committed any more
    locked_at: float = 0.0  # orderly: when the node last confirmed our lock (monotonic s)
    committed: int = -1  # what was last committed
    consuming: bool = False  # orderly: a task is consuming this queue
    in_listener: bool = False  # orderly: a batch is with the listener right now
    tries: dict[int, int] = field(default_factory=dict)  # orderly: suspensions of the batch at an offset
    last_pull_ms: int = 0  # wall ms of the last pull answered, and of the last listener call done (running info)
    last_consume_ms: int = 0

    def add(self, messages: list[ReceivedMessage]) -> None:
        now = time.monotonic()
        for message in messages:
            size = len(message.body)
            self.pending[message.queue_offset] = [message, size, now]
            self.size += size

    def done(self, offsets) -> None:
        for offset in offsets:
            entry = self.pending.pop(offset, None)
            if entry is not None:
                self.size -= entry[1]

    def commit_offset(self) -> int:
        """The lowest offset not done: a restart redelivers from here."""
        return min(self.pending) if self.pending else self.next_offset

    def lock_valid(self, valid_s: float) -> bool:
        return time.monotonic() - self.locked_at < valid_s


def load_offsets(path: Path) -> dict[str, int]:
    """A broadcasting member's offsets file: {"offsetTable": {"topic@queueId": offset}}."""
    try:
        return {k: int(v) for k, v in orjson.loads(path.read_bytes()).get("offsetTable", {}).items()}
    except FileNotFoundError:
        return {}


def save_offsets(path: Path, table: dict[str, int]) -> None:
    """Written whole, fsynced, renamed into place: a crash leaves the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    with open(temporary, "wb") as f:
        f.write(orjson.dumps({"offsetTable": dict(sorted(table.items()))}))
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
