"""The `mqnode` Spark data source (PySpark's Python data source API): batch and streaming reads of
topics, batch and streaming writes into them. Registered by `node.pipeline.register(spark)`.

Reads: one Spark partition per queue range (`node.pipeline.ranges`), read with pulls in flight and
handed to Spark as Arrow record batches (`node.pipeline.rows`). A stream's offset is Kafka's
connector's map, `{"topic": {"queueId": next offset}}`: Spark checkpoints it, so a query restarted
from its checkpoint reads on from exactly there; queues a topic gains are read from their start.

Writes: each task sends its rows with the batching producer (`node.client.Producer`), as batches
per queue when no row asks for a delay; at-least-once, like Kafka's sink (a task Spark retries
sends its rows again). A send the node refuses fails the task with the node's status and remark.
With `transactional`, all or nothing instead (node.pipeline.transactions): rows go as halves,
visible only once the job (or a stream's micro-batch, once per batch id) commits.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
    WriterCommitMessage,
)

from node.pipeline import offline
from node.pipeline.offline import Segment
from node.pipeline.ranges import NodeView, Options, PipelineError, QueueRange, split
from node.pipeline.rows import SCHEMA_DDL, arrow_schema, read_batches
from node.pipeline import transactions
from node.pipeline.sink import rows, send_batches

try:  # Spark 4.1+: the streaming sink takes Arrow batches too
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
except ImportError:  # pragma: no cover
    from pyspark.sql.datasource import DataSourceStreamWriter as _StreamWriterBase


@dataclass
class RangePartition(InputPartition):
    range: QueueRange


class MqnodeDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "mqnode"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema) -> DataSourceReader:
        if any(str(k).lower() == "store" for k in self.options):  # a store directory, no node
            return OfflineReader(OfflineOptions.parse(self.options), arrow_schema(schema))
        return BatchReader(Options.parse(self.options), arrow_schema(schema))

    def streamReader(self, schema) -> DataSourceStreamReader:
        return StreamReader(Options.parse(self.options, streaming=True), arrow_schema(schema))

    def writer(self, schema, overwrite: bool) -> DataSourceArrowWriter:
        return Writer(dict(self.options))

    def streamWriter(self, schema, overwrite: bool):
        return StreamWriter(dict(self.options))


def _read(options: Options, schema, partition: RangePartition):
    r = partition.range
    yield from read_batches(options.endpoint, r.topic, r.queue_id, r.start, r.end, subscription=options.subscription,
                            fail_on_data_loss=options.fail_on_data_loss, timeout=options.timeout, schema=schema,
                            credentials=options.credentials, step=options.pull_batch_size, namesrv=options.namesrv,
                            broker=r.broker, expression_type=options.expression_type)


@dataclass
class SegmentPartition(InputPartition):
    segment: Segment


NODE_READ_OPTIONS = ("endpoint", "namesrv", "startingOffsets", "endingOffsets", "subscription", "expressionType",
                     "minPartitions", "failOnDataLoss", "pullBatchSize", "maxOffsetsPerTrigger")


@dataclass(frozen=True)
class OfflineOptions:
    store: str
    commitlog: str | None = None
    topics: frozenset[str] | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    failfast: bool = False

    @classmethod
    def parse(cls, options: dict) -> OfflineOptions:
        given = {str(k).lower(): v for k, v in options.items()}
        get = given.get
        for name in NODE_READ_OPTIONS:  # (they were ignored: a "count" from offset 5 counted every message)
            if name.lower() in given:
                raise PipelineError(f"option `{name}` is for reads from a node (endpoint, namesrv); a store "
                                    f"directory is read by topic and startingTimestamp / endingTimestamp, or a "
                                    f"DataFrame filter (queueId, queueOffset, tags)")
        topics = frozenset(t.strip() for t in (get("topics") or get("topic") or "").split(",") if t.strip())
        mode = (get("mode") or "PERMISSIVE").upper()
        if mode not in ("PERMISSIVE", "FAILFAST"):
            raise PipelineError(f"option `mode` must be PERMISSIVE or FAILFAST, not {mode!r}")
        since, until = (get(n) for n in ("startingtimestamp", "endingtimestamp"))
        return cls(get("store"), get("storepathcommitlog"), topics or None, int(since) if since else None,
                   int(until) if until else None, mode == "FAILFAST")


class OfflineReader(DataSourceReader):
    """A store directory read without a node (node.pipeline.offline): a partition a segment."""

    def __init__(self, options: OfflineOptions, schema):
        self.options, self.schema = options, schema

    def pushFilters(self, filters):
        """`topic` = / IN and `storeTimestamp` bounds narrow what each segment yields; Spark
        evaluates every filter again all the same (all are returned)."""
        import dataclasses

        for f in filters:
            column = ".".join(f.attribute) if hasattr(f, "attribute") else None
            if column == "topic" and isinstance(f, EqualTo | In):
                values = frozenset([f.value] if isinstance(f, EqualTo) else f.value)
                topics = values if self.options.topics is None else self.options.topics & values
                self.options = dataclasses.replace(self.options, topics=topics)
            elif column == "storeTimestamp" and isinstance(f, GreaterThan | GreaterThanOrEqual):
                self.options = dataclasses.replace(self.options, since_ms=max(self.options.since_ms or 0, _ms(f.value)))
            elif column == "storeTimestamp" and isinstance(f, LessThan | LessThanOrEqual):
                bound = _ms(f.value) + 1
                self.options = dataclasses.replace(self.options, until_ms=min(self.options.until_ms or bound, bound))
        return filters

    def partitions(self):
        try:
            found = offline.segments(offline.commitlog_dir(self.options.store, self.options.commitlog))
        except FileNotFoundError as e:
            raise PipelineError(str(e)) from None
        return [SegmentPartition(s) for s in found] or [SegmentPartition(Segment("", 0, 0))]

    def read(self, partition: SegmentPartition):
        o = self.options
        if partition.segment.size:
            yield from offline.read_segment(partition.segment, topics=o.topics, since_ms=o.since_ms,
                                            until_ms=o.until_ms, failfast=o.failfast, schema=self.schema)


def _ms(value) -> int:
    """A filter's timestamp (a datetime) as epoch ms."""
    return int(value.timestamp() * 1000) if hasattr(value, "timestamp") else int(value)


class BatchReader(DataSourceReader):
    def __init__(self, options: Options, schema):
        self.options, self.schema = options, schema

    def partitions(self):
        o = self.options
        with NodeView(o) as node:
            queues = node.all_queues()
            starts = node.resolve(o.starting, o.starting_timestamp, queues, start=True)
            ends = node.resolve(o.ending, o.ending_timestamp, queues, start=False)
            if o.fail_on_data_loss:
                _check_bounds(node, starts, ends)
        ranges = split(starts, ends, o.min_partitions)
        return [RangePartition(r) for r in ranges] or [RangePartition(QueueRange(o.topics[0], 0, 0, 0))]

    def read(self, partition: RangePartition):
        if partition.range.end > partition.range.start:
            yield from _read(self.options, self.schema, partition)


def _check_bounds(node: NodeView, starts: dict, ends: dict) -> None:
    """A batch read whose start the node no longer holds, or whose start lies after its end,
    fails (Kafka's reportDataLoss: a start past the end read nothing, silently, with no hint
    that the offsets were wrong); failOnDataLoss=false reads what there is."""
    for topic, by_queue in starts.items():
        for q, offset in by_queue.items():
            low, end = node.min_offset(topic, q), ends[topic][q]
            if offset < low and end > offset:
                raise PipelineError(f"{topic}/{q}: startingOffsets {offset} was cleaned from the node "
                                    f"(its first offset is {low}; failOnDataLoss=false skips it)")
            if offset > end:
                raise PipelineError(f"{topic}/{q}: startingOffsets {offset} is after endingOffsets {end} "
                                    f"(failOnDataLoss=false reads nothing there)")


class StreamReader(DataSourceStreamReader):
    """Micro-batches over every queue of the topics; `maxOffsetsPerTrigger` caps a batch,
    shared among the queues in proportion to what each has waiting."""

    def __init__(self, options: Options, schema):
        self.options, self.schema = options, schema
        self._view: NodeView | None = None

    def _node(self) -> NodeView:
        """One connection for the query's life (each micro-batch asks for the bounds again)."""
        if self._view is None:
            self._view = NodeView(self.options, streaming=True)
        return self._view

    def initialOffset(self) -> dict:
        o, node = self.options, self._node()
        return node.resolve(o.starting, o.starting_timestamp, node.all_queues(), start=True)

    def getDefaultReadLimit(self):
        if self.options.max_offsets_per_trigger:
            from pyspark.sql.datasource_internal import ReadMaxRows
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return super().getDefaultReadLimit()

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        o, node = self.options, self._node()
        queues = node.all_queues()
        latest = node.resolve("latest", None, queues, start=False)
        base = {t: dict(by_queue) for t, by_queue in (start or {}).items()}
        for topic, ids in queues.items():  # queues the topic gained start at their first offset
            for q in ids:
                if q not in base.get(topic, {}):
                    base.setdefault(topic, {})[q] = node.min_offset(topic, q)
        cap = getattr(limit, "max_rows", None) if limit is not None else o.max_offsets_per_trigger
        return _capped(base, latest, cap)

    def partitions(self, start: dict, end: dict):
        # a queue the topic gained since `start` was planned from its first offset in `end`'s
        # latestOffset; reading it from 0 reads what it holds (below its min: data loss, as ever)
        starts = {t: {q: start.get(t, {}).get(q, 0) for q in end[t]} for t in end}
        return [RangePartition(r) for r in split(starts, end, 0)]

    def read(self, partition: RangePartition):
        yield from _read(self.options, self.schema, partition)

    def commit(self, end: dict) -> None:
        """Spark has checkpointed `end`: nothing is held at the node for it."""

    def stop(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None


def _capped(start: dict, latest: dict, cap: int | None) -> dict:
    """`latest`, or no more than `cap` offsets past `start` in all, shared in proportion."""
    waiting = {(t, q): max(0, latest[t][q] - start.get(t, {}).get(q, 0)) for t in latest for q in latest[t]}
    total = sum(waiting.values())
    if not cap or total <= cap:
        return {t: {q: max(latest[t][q], start.get(t, {}).get(q, 0)) for q in latest[t]} for t in latest}
    out: dict[str, dict[str, int]] = {}
    given = 0
    for (t, q), n in sorted(waiting.items()):
        share = n * cap // total
        given += share
        out.setdefault(t, {})[q] = start.get(t, {}).get(q, 0) + share
    for (t, q), n in sorted(waiting.items()):  # the rounding's remainder, to queues with more waiting
        if given >= cap:
            break
        if out[t][q] < start.get(t, {}).get(q, 0) + n:
            out[t][q] += 1
            given += 1
    return out


@dataclass
class SendCount(WriterCommitMessage):
    count: int
    halves: bytes = b""  # a transactional write's: its halves, packed (node.pipeline.transactions)


class Writer(DataSourceArrowWriter):
    """Made on the driver, pickled to the tasks: a transactional write's producer group is
    chosen here, once, so every task's halves and the commit share it."""

    def __init__(self, options: dict):
        self.options = options
        self.transactional = transactions.enabled(options)
        self.group = transactions.producer_group(options, streaming=False) if self.transactional else None

    def write(self, batches) -> SendCount:
        if self.transactional:
            return _send_halves(self.options, self.group, batches)
        return SendCount(send_batches(self.options, batches))

    def commit(self, messages) -> None:
        """Plain: every task's sends were acknowledged, nothing more to do. Transactional: every
        task's halves are ended with commit (all visible)."""
        if self.transactional:
            transactions.end_halves(self.options, self.group, _halves(messages), transactions.COMMIT)

    def abort(self, messages) -> None:
        """Plain: at-least-once, what a failed task sent stays sent (as with Kafka's sink).
        Transactional: what the tasks that finished sent is rolled back (none visible)."""
        if self.transactional:
            transactions.end_halves(self.options, self.group, _halves(messages), transactions.ROLLBACK,
                                    settle_s=transactions.KILLED_ATTEMPTS_SETTLE_S)


class StreamWriter(_StreamWriterBase):
    def __init__(self, options: dict):
        self.options = options
        self.transactional = transactions.enabled(options)
        self.group = transactions.producer_group(options, streaming=True) if self.transactional else None

    def write(self, batches) -> SendCount:
        if self.transactional:
            return _send_halves(self.options, self.group, batches)
        return SendCount(send_batches(self.options, batches))

    def commit(self, messages, batchId: int) -> None:
        """Plain: the micro-batch's sends were all acknowledged. Transactional: its halves are
        committed, once per batch id whatever Spark replays (node.pipeline.transactions)."""
        if self.transactional:
            transactions.commit_batch(self.options, self.group, batchId, _halves(messages))

    def abort(self, messages, batchId: int) -> None:
        """Plain: at-least-once, Spark reruns the micro-batch and its rows are sent again.
        Transactional: this attempt's halves are rolled back."""
        if self.transactional:
            transactions.end_halves(self.options, self.group, _halves(messages), transactions.ROLLBACK,
                                    settle_s=transactions.KILLED_ATTEMPTS_SETTLE_S)


def _send_halves(options: dict, group: str, batches) -> SendCount:
    sent = [0]

    def counted():
        for row in rows(options, batches):
            sent[0] += 1
            yield row

    packed = transactions.send_halves(options, group, counted())
    return SendCount(sent[0], packed)


def _halves(messages) -> list[bytes]:
    return [m.halves for m in messages if isinstance(m, SendCount) and m.halves]
