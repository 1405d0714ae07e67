"""Where a Spark read starts and ends in each queue: options parsed once, offsets resolved against a
running node over the wire protocol, ranges split into Spark partitions. No Spark here: the
driver-side planning of `node.pipeline.source`, testable without a session.

An offset map is Kafka's connector's shape: `{"topic": {"queueId": offset}}` (queue ids as JSON
strings), `-2` standing for earliest and `-1` for latest inside JSON, as Kafka's does.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from node import protocol
from node.client import Credentials, PullConsumer, SendError

EARLIEST, LATEST = -2, -1
DEFAULT_TIMEOUT_S = 10.0


class PipelineError(ValueError):
    """A bad option or a node that cannot serve the query: Spark shows the message."""


@dataclass(frozen=True)
class Options:
    endpoint: str | None
    topics: tuple[str, ...]
    subscription: str = "*"
    expression_type: str = "TAG"  # or SQL92: `subscription` a selector over the properties, applied at the node
    starting: str = "earliest"
    ending: str = "latest"
    starting_timestamp: int | None = None
    ending_timestamp: int | None = None
    min_partitions: int = 0
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    timeout: float = DEFAULT_TIMEOUT_S
    credentials: Credentials = Credentials()  # accessKey, secretKey, serverKey, clientKey (node.security)
    pull_batch_size: int = 32  # messages a pull asks: the node's maxTransferCountOnMessageInMemory
    namesrv: str | None = None  # a cluster's name services instead of one node's endpoint (its queues: "broker:id")

    @property
    def target(self) -> dict:
        """A client's way to the messages: the node's endpoint, or the cluster's name services."""
        return {"namesrv": self.namesrv} if self.namesrv else {"endpoint": self.endpoint}

    @property
    def where(self) -> str:
        return f"the name services {self.namesrv}" if self.namesrv else f"the node at {self.endpoint}"

    @classmethod
    def parse(cls, options: dict, *, streaming: bool = False) -> Options:
        """Spark's options (case-insensitive keys) -> Options; PipelineError naming what is wrong."""
        get = {str(k).lower(): v for k, v in options.items()}.get
        endpoint, namesrv = get("endpoint"), get("namesrv")
        if not endpoint and not namesrv:
            raise PipelineError("option `endpoint` (one node, e.g. tcp://127.0.0.1:10911) or `namesrv` (a cluster's "
                                "name services, host:port;host:port) is required")
        if endpoint and namesrv:
            raise PipelineError("options `endpoint` and `namesrv` exclude each other: one node, or a cluster")
        topics = tuple(t.strip() for t in (get("topics") or get("topic") or "").split(",") if t.strip())
        if not topics:
            raise PipelineError("option `topic` (or `topics`, a comma list) is required")
        for name in ("startingOffsets", "endingOffsets"):
            _check_offsets_option(name, get(name.lower()))
        if streaming and get("endingoffsets"):
            raise PipelineError("`endingOffsets` is for batch reads; a stream runs until stopped")
        return cls(
            endpoint=endpoint, topics=topics, subscription=get("subscription") or "*",
            expression_type=_expression_type(get),
            starting=get("startingoffsets") or ("latest" if streaming else "earliest"),
            ending=get("endingoffsets") or "latest",
            starting_timestamp=_int_option(get, "startingTimestamp"), ending_timestamp=_int_option(get, "endingTimestamp"),
            min_partitions=_positive_option(get, "minPartitions") or 0,
            max_offsets_per_trigger=_positive_option(get, "maxOffsetsPerTrigger"),
            fail_on_data_loss=_bool_option(get, "failOnDataLoss", True),
            timeout=timeout_option(get), credentials=credentials_option(get),
            pull_batch_size=_pull_batch_size(get), namesrv=namesrv or None)


def _expression_type(get) -> str:
    """`expressionType`: TAG (default) or SQL92, its `subscription` checked here (the driver) so
    a bad one fails the query before a task starts."""
    kind = (get("expressiontype") or "TAG").upper()
    try:
        protocol.check_expression(get("subscription") or "*", kind)
    except protocol.FilterRefused as e:
        raise PipelineError(f"options `expressionType` {kind} and `subscription`: {e}") from None
    return kind


def _pull_batch_size(get) -> int:
    size = _int_option(get, "pullBatchSize")
    size = 32 if size is None else size
    if not 1 <= size <= 1024:
        raise PipelineError(f"option `pullBatchSize` must be 1..1024 (a pull's maxMsgNums), not {size}")
    return size


def credentials_option(get) -> Credentials:
    """The options `accessKey`, `secretKey`, `serverKey`, `clientKey`, each missing one from the
    driver's MQNODE_* environment (the executors get them with the options)."""
    try:
        return Credentials.of(get("accesskey"), get("secretkey"), get("serverkey"), get("clientkey"))
    except ValueError as e:
        raise PipelineError(f"option `serverKey`: {e}") from None


def _int_option(get, name: str) -> int | None:
    value = get(name.lower())
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise PipelineError(f"option `{name}` must be an integer, not {value!r}") from None


def _positive_option(get, name: str) -> int | None:
    """An integer option that must be above 0 when given (as Kafka's connector checks
    minPartitions; a maxOffsetsPerTrigger of 0 or less read nothing, or everything)."""
    value = _int_option(get, name)
    if value is not None and value < 1:
        raise PipelineError(f"option `{name}` must be a positive integer, not {value}")
    return value


def timeout_option(get) -> float:
    """Option `timeout` (seconds a node may take to answer; DEFAULT_TIMEOUT_S when not given)."""
    value = get("timeout")
    if value is None or value == "":
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:
        raise PipelineError(f"option `timeout` must be a number of seconds above 0, not {value!r}")
    return seconds


def _bool_option(get, name: str, default: bool) -> bool:
    value = get(name.lower())
    if value is None:
        return default
    if str(value).lower() not in ("true", "false"):
        raise PipelineError(f"option `{name}` must be true or false, not {value!r}")
    return str(value).lower() == "true"


def _check_offsets_option(name: str, value) -> None:
    if value is None or value in ("earliest", "latest"):
        return
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise PipelineError(f"option `{name}` is not earliest, latest or JSON {{\"topic\": {{\"0\": 23}}}}: {e}") from None
    if not isinstance(parsed, dict) or not all(
            isinstance(t, str) and isinstance(q, dict) and all(k.isdigit() and type(v) is int for k, v in q.items())
            for t, q in parsed.items()):
        raise PipelineError(f"option `{name}` must map topics to {{\"queueId\": offset}} objects, not {value!r}")


class NodeView:
    """What planning asks a node: its queues and their bounds. Sync, for the driver."""

    def __init__(self, options: Options, *, streaming: bool = False):
        self.options = options
        self.streaming = streaming  # a stream's topic that does not exist yet has no queues yet (Kafka's subscribe)
        try:
            self.consumer = PullConsumer(**options.target, timeout=options.timeout, credentials=options.credentials)
        except Exception as e:  # a malformed endpoint: zmq says why
            raise PipelineError(f"cannot reach {options.where}: {e}") from None

    def close(self) -> None:
        self.consumer.close()

    def __enter__(self) -> NodeView:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, what: str, call):
        """`call()` of the consumer; PipelineError saying what failed."""
        try:
            return call()
        except SendError as e:
            raise self._failure(what, e) from None

    def _failure(self, what: str, e: SendError) -> PipelineError:
        if e.status == "TIMEOUT":
            return PipelineError(f"{self.options.where} did not answer within {self.options.timeout:g} s "
                                 f"(is it running?)")
        return PipelineError(f"{what}: {self.options.where} refused: {e}")

    def queues(self, topic: str) -> list[str]:
        """The keys of `topic`'s queues (`queue_key`). A topic that does not exist: PipelineError
        for a batch read; none yet for a stream, which reads it once a send has made it."""
        try:
            found = self.consumer.read_queues(topic)
        except SendError as e:
            if self.streaming and e.status == "TOPIC_NOT_EXIST":
                return []
            raise self._failure(f"topic {topic!r}", e) from None
        return [queue_key(b, q) for b, q in found]

    def min_offset(self, topic: str, key) -> int:
        broker, queue_id = queue_of(key)
        return self._call(f"{topic}/{key}", lambda: self.consumer.min_offset(topic, queue_id, broker=broker))

    def max_offset(self, topic: str, key) -> int:
        broker, queue_id = queue_of(key)
        return self._call(f"{topic}/{key}", lambda: self.consumer.max_offset(topic, queue_id, broker=broker))

    def offset_at(self, topic: str, key, timestamp: int) -> int:
        """The first offset whose message was stored at or after `timestamp` (Kafka's meaning;
        the node's search answers the nearest, which may be just before it)."""
        broker, queue_id = queue_of(key)
        offset = self._call(f"{topic}/{key}", lambda: self.consumer.offset_at_time(topic, queue_id, timestamp,
                                                                                    broker=broker))
        end = self.max_offset(topic, key)
        while offset < end:
            result = self.consumer.pull(topic, queue_id, offset, max_count=8, broker=broker)
            earlier = [m for m in result.messages if m.store_timestamp < timestamp]
            if result.status != "FOUND" or len(earlier) < len(result.messages):
                return offset + len(earlier)
            offset += len(earlier)
        return offset

    def all_queues(self) -> dict[str, list[str]]:
        return {topic: self.queues(topic) for topic in self.options.topics}

    def resolve(self, spec: str, timestamp: int | None, queues: dict[str, list[str]], *, start: bool) -> dict:
        """earliest / latest / JSON (with -2 and -1) / a timestamp -> {topic: {queueId: offset}}."""
        explicit = orjson.loads(spec) if spec not in ("earliest", "latest") else {}
        default = EARLIEST if spec == "earliest" or (spec != "latest" and start) else LATEST
        out: dict[str, dict[str, int]] = {}
        strangers = sorted(set(explicit) - set(queues))  # (a misspelt topic's offsets were ignored: read from the default)
        if strangers:
            raise PipelineError(f"offsets name topic {strangers[0]!r}, which this read does not read "
                                f"(it reads {', '.join(map(repr, queues))})")
        for topic, ids in queues.items():
            given = explicit.get(topic, {})
            for key in given:
                if key not in ids:
                    raise PipelineError(f"offsets name queue {key} of {topic!r}, which has {len(ids)} queues")
            for q in ids:
                if timestamp is not None:
                    value = self.offset_at(topic, q, timestamp)
                else:
                    value = given.get(q, default)
                    if value == EARLIEST:
                        value = self.min_offset(topic, q)
                    elif value == LATEST:
                        value = self.max_offset(topic, q)
                out.setdefault(topic, {})[q] = value
        return out


@dataclass(frozen=True)
class QueueRange:
    """One Spark partition: queue offsets [start, end) of one queue."""

    topic: str
    queue_id: int
    start: int
    end: int
    broker: str | None = None  # a cluster's: the broker group that holds the queue


def split(starts: dict, ends: dict, min_partitions: int) -> list[QueueRange]:
    """One range per queue with something to read, split evenly until there are at least
    `min_partitions` (Kafka's minPartitions: the largest ranges are cut first)."""
    ranges = [QueueRange(t, queue_of(q)[1], starts[t][q], ends[t][q], queue_of(q)[0]) for t in starts
              for q in starts[t] if ends.get(t, {}).get(q, 0) > starts[t][q]]
    while ranges and len(ranges) < min_partitions:
        ranges.sort(key=lambda r: r.end - r.start)
        largest = ranges.pop()
        if largest.end - largest.start < 2:
            ranges.append(largest)
            break
        middle = (largest.start + largest.end) // 2
        ranges += [QueueRange(largest.topic, largest.queue_id, largest.start, middle, largest.broker),
                   QueueRange(largest.topic, largest.queue_id, middle, largest.end, largest.broker)]
    return sorted(ranges, key=lambda r: (r.topic, r.broker or "", r.queue_id, r.start))


def queue_key(broker: str | None, queue_id: int) -> str:
    """A queue in an offset map: its id ("3") for one node, "<brokerName>:<id>" in a cluster."""
    return str(queue_id) if broker is None else f"{broker}:{queue_id}"


def queue_of(key) -> tuple[str | None, int]:
    """(broker group or None, queue id) of a `queue_key` (or a plain id)."""
    broker, _, queue_id = str(key).rpartition(":")
    return broker or None, int(queue_id)
