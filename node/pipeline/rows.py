"""Pulled messages as Arrow record batches with the connector's schema, and a queue range read with
pulls in flight. Runs on the executors: needs only the client part of mqnode, pyarrow and pyzmq.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pyarrow as pa

from node.client import AsyncPullConsumer, ReceivedMessage, aio

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
PULL_STEP = 32  # the node answers at most 32 messages a pull
IN_FLIGHT = 8  # pulls in flight per range: a range is read at the node's pace, not the round trip's


class DataLoss(RuntimeError):
    """Offsets a query still needed were cleaned from the node."""


def to_batch(messages: list[ReceivedMessage], schema: pa.Schema = ARROW_SCHEMA) -> pa.RecordBatch:
    """The messages as one record batch of `schema`: the connector's columns, typed as Spark
    expects them (`arrow_schema`)."""
    columns: dict[str, list] = {name: [] for name in ARROW_SCHEMA.names}
    for m in messages:
        properties = m.properties
        columns["topic"].append(m.topic)
        columns["queueId"].append(m.queue_id)
        columns["queueOffset"].append(m.queue_offset)
        columns["commitLogOffset"].append(m.commit_log_offset)
        columns["msgId"].append(m.msg_id)
        columns["offsetMsgId"].append(m.offset_msg_id)
        columns["tags"].append(properties.get("TAGS"))
        columns["keys"].append(m.keys)
        columns["properties"].append(list(properties.items()))
        columns["body"].append(m.body)
        columns["bornTimestamp"].append(m.born_timestamp)
        columns["storeTimestamp"].append(m.store_timestamp)
        columns["bornHost"].append(m.born_host)
        columns["storeHost"].append(m.store_host)
        columns["reconsumeTimes"].append(m.reconsume_times)
        columns["flag"].append(m.flag)
        columns["sysFlag"].append(m.sys_flag)
    return pa.RecordBatch.from_arrays([_array(columns[f.name], f.type) for f in schema], schema=schema)


def _array(values: list, kind: pa.DataType) -> pa.Array:
    if pa.types.is_timestamp(kind):  # epoch ms, whatever unit and zone Spark asks for
        return pa.array(values, pa.timestamp("ms", tz=kind.tz)).cast(kind)
    return pa.array(values, type=kind)


def arrow_schema(spark_schema) -> pa.Schema:
    """The Arrow schema Spark checks a Python data source's batches against (UTC timestamps)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema, timezone="UTC")


async def read_range(consumer: AsyncPullConsumer, topic: str, queue_id: int, start: int, end: int, *,
                     subscription: str = "*", fail_on_data_loss: bool = True):
    """Yield lists of messages of queue offsets [start, end), in order, with IN_FLIGHT pulls
    ahead of the one being read (each asks for the next PULL_STEP offsets; a short answer
    leaves a gap, read before moving on). A start below the queue's min offset is data loss:
    raised, or skipped with `fail_on_data_loss` false."""
    pending: dict[int, asyncio.Task] = {}
    cursor = next_issue = start

    def issue(at: int) -> None:
        pending[at] = asyncio.ensure_future(consumer.pull(topic, queue_id, at, max_count=min(PULL_STEP, end - at),
                                                          subscription=subscription))
    try:
        while cursor < end:
            next_issue = max(next_issue, cursor)
            while len(pending) < IN_FLIGHT and next_issue < end:
                if next_issue not in pending:
                    issue(next_issue)
                next_issue += PULL_STEP
            if cursor not in pending:
                issue(cursor)
            result = await pending.pop(cursor)
            if result.status == "OFFSET_ILLEGAL" and cursor < result.min_offset:
                if fail_on_data_loss:
                    raise DataLoss(f"{topic}/{queue_id}: offsets {cursor}..{result.min_offset - 1} were cleaned "
                                   f"from the node (failOnDataLoss=false skips them)")
                moved = min(result.min_offset, end)
            elif result.status == "OFFSET_ILLEGAL" or result.next_begin_offset <= cursor:
                raise RuntimeError(f"{topic}/{queue_id}: offset {cursor} is past the queue's end "
                                   f"{result.max_offset} (status {result.status})")
            else:
                messages = [m for m in result.messages if m.queue_offset < end]
                if messages:
                    yield messages
                moved = min(result.next_begin_offset, end)
            for at in [at for at in pending if at < moved]:  # overtaken by a longer answer
                pending.pop(at).cancel()
            cursor = moved
    finally:
        for task in pending.values():
            task.cancel()


def read_batches(endpoint: str, topic: str, queue_id: int, start: int, end: int, *, subscription: str = "*",
                 fail_on_data_loss: bool = True, timeout: float = 10.0, rows: int = 4096,
                 schema: pa.Schema = ARROW_SCHEMA) -> Iterator[pa.RecordBatch]:
    """`read_range` as Arrow record batches of about `rows` rows, on a private event loop, one
    batch in memory at a time."""
    loop = aio.new_event_loop()

    async def opened() -> AsyncPullConsumer:
        consumer = AsyncPullConsumer(endpoint, timeout=timeout)
        await consumer.start()
        return consumer

    consumer = loop.run_until_complete(opened())
    pulls = read_range(consumer, topic, queue_id, start, end, subscription=subscription,
                       fail_on_data_loss=fail_on_data_loss)
    try:
        chunk: list = []
        while True:
            try:
                chunk += loop.run_until_complete(pulls.__anext__())
            except StopAsyncIteration:
                break
            if len(chunk) >= rows:
                yield to_batch(chunk, schema)
                chunk = []
        if chunk:
            yield to_batch(chunk, schema)
    finally:
        loop.run_until_complete(pulls.aclose())
        loop.run_until_complete(consumer.close())
        loop.close()
