"""Rows of a DataFrame sent into topics: the write side of the `mqnode` data source. Runs on the
executors. Columns: `body` (binary or string, required), optional `topic` (else the `topic`
option), `tags`, `keys` (a string or an array of strings), `properties` (a map), `queueId`,
`shardingKey`, `delayLevel`; a null key or property value is none. Rows without a delay go as batches per queue (RocketMQ's batch
send); a row with a delay level goes alone (a batch may carry no delay). A transactional write's
rows go as halves, many to a half (`rows`, node.pipeline.transactions; a half carries no delay)."""

from __future__ import annotations

from collections import defaultdict

import pyarrow as pa

from node.client import Message, Producer, SendError
from node.pipeline.ranges import PipelineError, credentials_option, timeout_option

BATCH = 128  # rows a batch send


class SendRefused(RuntimeError):
    """The node refused a row: its status and remark."""


def send_batches(options: dict, batches) -> int:
    get = {str(k).lower(): v for k, v in options.items()}.get
    endpoint, namesrv, default_topic = get("endpoint"), get("namesrv"), get("topic")
    if bool(endpoint) == bool(namesrv):
        raise PipelineError("option `endpoint` (one node) or `namesrv` (a cluster's name services) is required, not both")
    sent = 0
    timeout = timeout_option(get)
    target = {"namesrv": namesrv} if namesrv else {"endpoint": endpoint}
    with Producer(**target, timeout=timeout, credentials=credentials_option(get)) as producer:
        for batch in batches:
            columns = _columns(batch, default_topic)
            sent += _send_rows(producer, columns, default_topic, batch.num_rows)
    return sent


def rows(options: dict, batches):
    """Each row as (Message, queue id, sharding key): a transactional write's, sent as halves."""
    get = {str(k).lower(): v for k, v in options.items()}.get
    default_topic = get("topic")
    if not get("endpoint"):
        raise PipelineError("option `endpoint` is required: a transactional write ends its halves on one node "
                            "(`namesrv` is for plain writes)" if get("namesrv") else "option `endpoint` is required")
    for batch in batches:
        columns = _columns(batch, default_topic)
        column = lambda name: columns.get(name) or [None] * batch.num_rows  # noqa: E731
        topics, tags, keys, properties = column("topic"), column("tags"), column("keys"), column("properties")
        queue_ids, shards = column("queueId"), column("shardingKey")
        for i, body in enumerate(columns["body"]):
            yield _message(i, topics[i] or default_topic, body, tags[i], keys[i], properties[i]), queue_ids[i], shards[i]


def _columns(batch, default_topic: str | None) -> dict:
    if "body" not in batch.schema.names:
        raise PipelineError("writing to mqnode needs a `body` column (binary or string)")
    for field in batch.schema:  # (each wrong type was a task's error at its first row: an int shardingKey's
        # AttributeError, an int keys' "not iterable")
        expected = _COLUMN_TYPES.get(field.name)
        if expected is not None and not (expected[1](field.type) or (field.name != "body" and field.type == pa.null())):
            raise PipelineError(f"the `{field.name}` column must be {expected[0]}, not {field.type}")
    columns = batch.to_pydict()
    if "topic" not in columns and not default_topic:
        raise PipelineError("writing to mqnode needs a `topic` column or the `topic` option")
    return columns


def _text(kind) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


_COLUMN_TYPES = {  # a column the sink reads -> (what it must be, the test of its Arrow type)
    "body": ("binary or string (cast it: CAST(body AS STRING))",
             lambda t: _text(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)),
    "topic": ("a string", _text), "tags": ("a string", _text), "shardingKey": ("a string", _text),
    "keys": ("a string or an array of strings",
             lambda t: _text(t) or ((pa.types.is_list(t) or pa.types.is_large_list(t)) and _text(t.value_type))),
    "properties": ("a map of strings to strings", lambda t: pa.types.is_map(t) and _text(t.key_type) and _text(t.item_type)),
    "queueId": ("an integer", pa.types.is_integer), "delayLevel": ("an integer", pa.types.is_integer),
}


def _send_rows(producer: Producer, columns: dict, default_topic: str | None, rows: int) -> int:
    column = lambda name: columns.get(name) or [None] * rows  # noqa: E731 - a missing column is all nulls
    topics, bodies, tags, keys = column("topic"), columns["body"], column("tags"), column("keys")
    properties, queue_ids, shards, delays = column("properties"), column("queueId"), column("shardingKey"), column("delayLevel")
    groups: dict[tuple, list[Message]] = defaultdict(list)
    for i in range(rows):
        topic = topics[i] or default_topic
        message = _message(i, topic, bodies[i], tags[i], keys[i], properties[i], delays[i] or 0)
        if message.delay_level:
            _check(lambda: producer.send(topic, message.body, tags=message.tags, keys=message.keys,
                                         properties=message.properties, delay_level=message.delay_level,
                                         queue_id=queue_ids[i], shard_key=shards[i]))
            continue
        group = groups[topic, queue_ids[i], shards[i]]
        group.append(message)
        if len(group) >= BATCH:
            _flush(producer, (topic, queue_ids[i], shards[i]), group)
    for key, group in groups.items():
        if group:
            _flush(producer, key, group)
    return rows


def _message(i: int, topic: str, body, tags, keys, properties, delay_level: int = 0) -> Message:
    """Row `i` as a message. A null in `keys` or a null value in `properties` is no key or property,
    as a null column is none (a message stores no null: it was the string "None"); what a message
    cannot carry (an empty value, a separator character) fails the row, named."""
    if body is None:
        raise PipelineError(f"row {i}: `body` is null")
    if keys is not None and not isinstance(keys, str):
        keys = [key for key in keys if key is not None]
    pairs = properties.items() if isinstance(properties, dict) else properties or ()  # (Arrow's map: (name, value) pairs)
    props = {name: value for name, value in pairs if value is not None}
    message = Message(topic, body, tags=tags, keys=keys, properties=props, delay_level=delay_level)
    if tags or keys or props:
        try:
            message.wire_properties("")
        except (TypeError, ValueError) as e:
            raise PipelineError(f"row {i}: {e}") from None
    return message


def _flush(producer: Producer, key: tuple, group: list[Message]) -> None:
    topic, queue_id, shard = key
    _check(lambda: producer.send_batch(topic, list(group), queue_id=queue_id, shard_key=shard))
    group.clear()


def _check(send) -> None:
    try:
        results = send()
    except SendError as e:
        raise SendRefused(f"the node refused a send: {e.status} {e.remark}".strip()) from None
    for result in results if isinstance(results, list) else [results]:
        status = getattr(result, "status", "PUT_OK")
        if status != "PUT_OK":
            raise SendRefused(f"the node answered {status} for a send")
