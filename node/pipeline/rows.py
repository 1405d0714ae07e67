"""Pulled messages as Arrow record batches with the connector's schema, and a queue range read with
pulls in flight. Runs on the executors: needs only the client part of mqnode, pyarrow and pyzmq.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from functools import lru_cache

import pyarrow as pa

from node import protocol
from node.client import AsyncPullConsumer, Credentials, aio
from node.pipeline.columns import columns_batch
from shm.codec import (
    FIXED_V4,
    TOTALSIZE,
    Record,
    decode,
    decode_host,
    envelope,
    offset_msg_id,
    parse_properties,
    split_keys,
    walk_records_v4,
)

SCHEMA_DDL = (
    "topic string, queueId int, queueOffset long, commitLogOffset long, msgId string, offsetMsgId string, "
    "tags string, keys array<string>, properties map<string,string>, body binary, bornTimestamp timestamp, "
    "storeTimestamp timestamp, bornHost string, storeHost string, reconsumeTimes int, flag int, sysFlag int")
ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()), ("queueId", pa.int32()), ("queueOffset", pa.int64()), ("commitLogOffset", pa.int64()),
    ("msgId", pa.string()), ("offsetMsgId", pa.string()), ("tags", pa.string()), ("keys", pa.list_(pa.string())),
    ("properties", pa.map_(pa.string(), pa.string())), ("body", pa.binary()),
    ("bornTimestamp", pa.timestamp("ms")), ("storeTimestamp", pa.timestamp("ms")), ("bornHost", pa.string()),
    ("storeHost", pa.string()), ("reconsumeTimes", pa.int32()), ("flag", pa.int32()), ("sysFlag", pa.int32())])
# The archive's columns: the connector's, plus each record without its body (`shm.codec.envelope`),
# from which the node's tiered reads give back the stored bytes exactly (actors.tiered).
ARCHIVE_SCHEMA = ARROW_SCHEMA.append(pa.field("envelope", pa.binary()))
PULL_STEP = 32  # messages a pull asks by default: a node answers at most maxTransferCountOnMessageInMemory (32)
IN_FLIGHT = 8  # pulls in flight per range: a range is read at the node's pace, not the round trip's


class DataLoss(RuntimeError):
    """Offsets a query still needed were cleaned from the node."""


def to_batch(bodies: list[bytes], end: int, tags: frozenset[str] | None = None,
             schema: pa.Schema = ARROW_SCHEMA) -> pa.RecordBatch:
    """Pull replies' records (queue offsets below `end`; with `tags`, only those tags) as one
    record batch of `schema`: the connector's columns, typed as Spark expects them
    (`arrow_schema`). Column-wise (`node.pipeline.columns`) when every record allows it, else
    record by record (`records_batch`): the same columns either way."""
    if bodies:
        batch = columns_batch(bodies[0] if len(bodies) == 1 else b"".join(bodies), end, tags, schema)
        if batch is not None:
            return batch
    return records_batch(bodies, end, tags, schema)


def records_batch(bodies: list[bytes], end: int, tags: frozenset[str] | None = None,
                  schema: pa.Schema = ARROW_SCHEMA) -> pa.RecordBatch:
    """`to_batch` record by record, for any record the codec reads: each record's layout is walked
    once and the columns are built from the walked tuples with comprehensions."""
    fixed, bodies_col, topics, texts, envelopes = [], [], [], [], []
    keep_envelopes = "envelope" in schema.names
    for buf in bodies:
        walked, left = walk_records_v4(buf)
        for f, body_at, topic_at, props_at, end_at in walked:
            if f[5] < end:
                fixed.append(f)
                bodies_col.append(buf[body_at: body_at + f[14]])
                topics.append(_text(buf[topic_at: props_at - 2]))
                texts.append(buf[props_at: end_at].decode("utf-8"))
                if keep_envelopes:
                    envelopes.append(buf[body_at - FIXED_V4.size: body_at] + buf[body_at + f[14]: end_at])
        for at in left:
            raw = buf[at: at + TOTALSIZE.unpack_from(buf, at)[0]]
            f, body, topic, text = _full(raw)
            if f[5] < end:
                fixed.append(f)
                bodies_col.append(body)
                topics.append(topic)
                texts.append(text)
                if keep_envelopes:
                    envelopes.append(envelope(raw))
    properties = [parse_properties(t) for t in texts]
    tags_col = [p.get("TAGS") for p in properties]
    if tags is not None:
        keep = [i for i, t in enumerate(tags_col) if t in tags]
        fixed, bodies_col, topics, properties, tags_col, envelopes = (
            [column[i] for i in keep] if column else column
            for column in (fixed, bodies_col, topics, properties, tags_col, envelopes))
    offset_ids = [offset_msg_id(f[11], f[6]) for f in fixed]
    columns = {
        "topic": topics, "queueId": [f[3] for f in fixed], "queueOffset": [f[5] for f in fixed],
        "commitLogOffset": [f[6] for f in fixed],
        "msgId": [p.get("UNIQ_KEY") or o for p, o in zip(properties, offset_ids)], "offsetMsgId": offset_ids,
        "tags": tags_col, "keys": [split_keys(p["KEYS"]) if p.get("KEYS") else [] for p in properties],
        "properties": [list(p.items()) for p in properties], "body": bodies_col,
        "bornTimestamp": [f[8] for f in fixed], "storeTimestamp": [f[10] for f in fixed],
        "bornHost": [_host(f[9]) for f in fixed], "storeHost": [_host(f[11]) for f in fixed],
        "reconsumeTimes": [f[12] for f in fixed], "flag": [f[4] for f in fixed], "sysFlag": [f[7] for f in fixed],
        "envelope": envelopes}
    return pa.RecordBatch.from_arrays([_array(columns[f.name], f.type) for f in schema], schema=schema)


def _full(raw: bytes) -> tuple[tuple, bytes, str, str]:
    """A record `walk_v4` left (IPv6 hosts, V2 magic oddities): decoded whole, as a walked tuple."""
    record = decode(raw, check_crc=False)
    if not isinstance(record, Record):
        raise RuntimeError(f"undecodable record in a pull reply: {record}")
    f = (record.total_size, record.magic, record.body_crc, record.queue_id, record.flag, record.queue_offset,
         record.physical_offset, record.sys_flag, record.born_timestamp, record.born_host, record.store_timestamp,
         record.store_host,
         record.reconsume_times, record.prepared_transaction_offset, len(record.body))
    return f, record.body, record.topic, record.properties_string


@lru_cache(maxsize=1024)
def _text(raw: bytes) -> str:
    return raw.decode("utf-8")


@lru_cache(maxsize=4096)
def _host(raw) -> str:
    """A walked record's host bytes, or a decoded record's Host, as text."""
    return str(decode_host(raw) if isinstance(raw, bytes) else raw)


def _array(values: list, kind: pa.DataType) -> pa.Array:
    if pa.types.is_timestamp(kind):  # epoch ms, whatever unit and zone Spark asks for
        return pa.array(values, pa.timestamp("ms", tz=kind.tz)).cast(kind)
    return pa.array(values, type=kind)


def arrow_schema(spark_schema) -> pa.Schema:
    """The Arrow schema Spark checks a Python data source's batches against (UTC timestamps)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema, timezone="UTC")


async def read_range(consumer: AsyncPullConsumer, topic: str, queue_id: int, start: int, end: int, *,
                     subscription: str = "*", fail_on_data_loss: bool = True, step: int = PULL_STEP,
                     broker: str | None = None, expression_type: str = protocol.EXPRESSION_TAG):
    """Yield pull replies' records (raw bytes) covering queue offsets [start, end), in order, with
    IN_FLIGHT pulls ahead of the one being read (each asks for the next `step` offsets, which
    should be what the node answers at most, its maxTransferCountOnMessageInMemory; a
    short answer leaves a gap, read before moving on). The last reply may hold records at or
    past `end` (the caller drops them). A start below the queue's min offset is data loss:
    raised, or skipped with `fail_on_data_loss` false."""
    pending: dict[int, asyncio.Task] = {}
    cursor = next_issue = start

    def issue(at: int) -> None:
        pending[at] = asyncio.ensure_future(consumer.pull_raw(topic, queue_id, at, max_count=min(step, end - at),
                                                              subscription=subscription, broker=broker,
                                                              expression_type=expression_type))
    try:
        while cursor < end:
            next_issue = max(next_issue, cursor)
            while len(pending) < IN_FLIGHT and next_issue < end:
                if next_issue not in pending:
                    issue(next_issue)
                next_issue += step
            if cursor not in pending:
                issue(cursor)
            status, next_begin, min_offset, max_offset, records = await pending.pop(cursor)
            if status == "OFFSET_ILLEGAL" and cursor < min_offset:
                if fail_on_data_loss:
                    raise DataLoss(f"{topic}/{queue_id}: offsets {cursor}..{min_offset - 1} were cleaned "
                                   f"from the node (failOnDataLoss=false skips them)")
                moved = min(min_offset, end)
            elif status == "OFFSET_ILLEGAL" or next_begin <= cursor:
                raise RuntimeError(f"{topic}/{queue_id}: offset {cursor} is past the queue's end "
                                   f"{max_offset} (status {status})")
            else:
                if records:
                    yield records
                moved = min(next_begin, end)
            for at in [at for at in pending if at < moved]:  # overtaken by a longer answer
                pending.pop(at).cancel()
            cursor = moved
    finally:
        for task in pending.values():
            task.cancel()


def read_batches(endpoint: str | None, topic: str, queue_id: int, start: int, end: int, *, subscription: str = "*",
                 fail_on_data_loss: bool = True, timeout: float = 10.0, rows: int = 4096,
                 schema: pa.Schema = ARROW_SCHEMA, credentials: Credentials | None = None,
                 step: int = PULL_STEP, namesrv=None, broker: str | None = None,
                 expression_type: str = protocol.EXPRESSION_TAG) -> Iterator[pa.RecordBatch]:
    """`read_range` as Arrow record batches of about `rows` rows, on a private event loop, one
    batch in memory at a time. A cluster's queue: `namesrv` and the queue's `broker` group.
    `subscription` is a tag expression, or with `expression_type` SQL92 a selector the node applies."""
    loop = aio.new_event_loop()

    async def opened() -> AsyncPullConsumer:
        consumer = AsyncPullConsumer(endpoint, namesrv=namesrv, timeout=timeout, credentials=credentials)
        await consumer.start()
        return consumer

    consumer = loop.run_until_complete(opened())
    pulls = read_range(consumer, topic, queue_id, start, end, subscription=subscription,
                       fail_on_data_loss=fail_on_data_loss, step=step, broker=broker, expression_type=expression_type)
    exact = expression_type == protocol.EXPRESSION_TAG and subscription.strip() != "*"
    tags = frozenset(protocol.parse_subscription(subscription)) if exact else None

    async def next_chunk() -> list[bytes] | None:
        """Replies for about `rows` records (one loop entry a batch, not one a pull)."""
        chunk: list[bytes] = []
        async for records in pulls:
            chunk.append(records)
            if len(chunk) * step >= rows:
                break
        return chunk or None

    try:
        while (chunk := loop.run_until_complete(next_chunk())) is not None:
            yield to_batch(chunk, end, tags, schema)
    finally:
        loop.run_until_complete(pulls.aclose())
        loop.run_until_complete(consumer.close())
        loop.close()
