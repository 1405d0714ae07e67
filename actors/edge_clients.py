"""The edge's checks of what clients say of themselves and their groups: heartbeats, the node's
asks of a member and their answers, offsets reset, orderly locks, transactions' ends, pops and
acks. `CHECKS` (code -> check) joins actors.edge's table; the contract is the same (actors.edge).
"""

from __future__ import annotations

from node import protocol
from actors.client_asks import MAX_TIMEOUT_MS
from actors.edge_fields import (
    GROUP_MAX_LENGTH, INT64, QUEUE_ID_MAX, SUSPEND_MS_MAX, bool_problem, client_id_problem, filter_problem,
    group_problem, int_problem, name_problem, offset_msg_id_problem, queue_list_problem, read_topic_problem, shown,
)


# -- consumer groups ------------------------------------------------------------------------------


def _running_info_ask(header: dict) -> str | None:
    client_id = header.get("clientId")
    if not isinstance(client_id, str) or not 1 <= len(client_id) <= 255:
        return f"`clientId` must be a string of 1 to 255 characters, not {shown(client_id)}"
    return (group_problem(header.get("consumerGroup")) or bool_problem(header, "jstackEnable")
            or int_problem(header, "timeoutMillis", 1, MAX_TIMEOUT_MS))


def _consume_directly(header: dict) -> str | None:
    return _running_info_ask(header) or offset_msg_id_problem(header.get("msgId"), "msgId")


# what a member may answer with (the gRPC proxy answers for its clients: busy, or one gone)
ANSWER_STATUSES = ("OK", "SYSTEM_ERROR", "SYSTEM_BUSY", "CONSUMER_NOT_ONLINE")


def _client_answer(header: dict) -> str | None:
    ask_id, status = header.get("askId"), header.get("status")
    if not isinstance(ask_id, str) or not 1 <= len(ask_id) <= 64:
        return f"`askId` must be a string of 1 to 64 characters, not {shown(ask_id)}"
    if status not in ANSWER_STATUSES:
        return f"`status` must be one of {', '.join(ANSWER_STATUSES)}, not {shown(status)}"
    if not isinstance(header.get("remark", ""), str):
        return f"`remark` must be a string, not {shown(header.get('remark'))}"
    answers = [name for name in protocol.ANSWER_FIELDS.values() if name in header]
    if status == "OK" and (len(answers) != 1 or not isinstance(header[answers[0]], dict)):
        return "an OK answer carries one object: runningInfo or consumeResult"
    return None


def _consumer_data(item) -> str | None:
    if not isinstance(item, dict):
        return f"each of `consumerDataSet` must be an object, not {shown(item)}"
    if item.get("messageModel", "CLUSTERING") not in ("CLUSTERING", "BROADCASTING"):
        return f"`messageModel` must be CLUSTERING or BROADCASTING, not {shown(item.get('messageModel'))}"
    subscriptions = item.get("subscriptionDataSet", [])
    if not isinstance(subscriptions, list) or len(subscriptions) > 1024:
        return f"`subscriptionDataSet` must be a list of at most 1024 {{topic, subString}}, not {shown(subscriptions)}"
    for s in subscriptions:
        problem = (f"each of `subscriptionDataSet` must be {{topic, subString}}, not {shown(s)}"
                   if not isinstance(s, dict) or not isinstance(s.get("subString", "*"), str) else
                   read_topic_problem(s.get("topic")))
        if problem:
            return problem
    return (name_problem(item.get("groupName"), "groupName", GROUP_MAX_LENGTH)
            or next((f"`{k}` must be a string, not {shown(item[k])}" for k in ("consumeType", "consumeFromWhere")
                     if k in item and not isinstance(item[k], str)), None)
            or queue_list_problem(item.get("queues", []), "queues", 4096))


def _heartbeat(header: dict) -> str | None:
    data = header.get("consumerDataSet", [])
    if not isinstance(data, list) or len(data) > 64:
        return f"`consumerDataSet` must be a list of at most 64 groups, not {shown(data)}"
    producers = header.get("producerDataSet", [])
    if not isinstance(producers, list) or len(producers) > 64:
        return f"`producerDataSet` must be a list of at most 64 {{groupName}}, not {shown(producers)}"
    for name in ("language", "version"):
        if name in header and not (isinstance(header[name], str) and len(header[name]) <= 64):
            return f"`{name}` must be a string of at most 64 characters, not {shown(header[name])}"
    return (client_id_problem(header) or next((p for p in map(_consumer_data, data) if p), None)
            or next((p for p in map(_producer_data, producers) if p), None))


def _producer_data(item) -> str | None:
    if not isinstance(item, dict):
        return f"each of `producerDataSet` must be {{groupName}}, not {shown(item)}"
    return name_problem(item.get("groupName"), "groupName", GROUP_MAX_LENGTH)


def _reset_offsets(header: dict) -> str | None:
    """RESET_CONSUMER_CLIENT_OFFSET and RESET_POP_OFFSET: `offsetTable` {queueId: offset} of one
    topic, as committed."""
    table = header.get("offsetTable")
    if not isinstance(table, dict) or not 1 <= len(table) <= 4096:
        return f"`offsetTable` must be an object {{queueId: offset}} of 1 to 4096 queues, not {shown(table)}"
    for queue, offset in table.items():
        if not (queue.isdigit() and str(int(queue)) == queue and int(queue) <= QUEUE_ID_MAX
                and type(offset) is int and 0 <= offset <= INT64[1]):
            return f"`offsetTable` maps a queue id to an offset of 0 or more, not {shown(queue)}: {shown(offset)}"
    return group_problem(header.get("consumerGroup")) or read_topic_problem(header.get("topic"))



# -- transactions -----------------------------------------------------------------------------------

TRANSACTION_OUTCOMES = (0, 8, 12)  # RocketMQ's TRANSACTION_NOT_TYPE, _COMMIT_TYPE, _ROLLBACK_TYPE


def _end_transaction(header: dict) -> str | None:
    return name_problem(header.get("producerGroup"), "producerGroup", GROUP_MAX_LENGTH) or _end(header)


def _end_transactions(header: dict) -> str | None:
    if header.get("openOfGroup") is True:  # every open half of the group, rolled back (a Spark job's leftovers)
        if header.get("commitOrRollback") != 12 or "ends" in header:
            return "`openOfGroup` rolls back (commitOrRollback 12) every open half of the group: it takes no `ends`"
        return name_problem(header.get("producerGroup"), "producerGroup", GROUP_MAX_LENGTH)
    ends = header.get("ends")
    if not isinstance(ends, list) or not 1 <= len(ends) <= protocol.MAX_ENDS_PER_REQUEST:
        return f"`ends` must be a list of 1 to {protocol.MAX_ENDS_PER_REQUEST} ends, not {shown(ends)}"
    return (name_problem(header.get("producerGroup"), "producerGroup", GROUP_MAX_LENGTH)
            or next((p for p in (f"each of `ends` must be an object, not {shown(e)}" if not isinstance(e, dict)
                                 else _end(e) for e in ends) if p), None))


def _end(header: dict) -> str | None:
    if header.get("commitOrRollback") not in TRANSACTION_OUTCOMES or type(header.get("commitOrRollback")) is not int:
        return f"`commitOrRollback` must be 8 (commit), 12 (rollback) or 0 (unknown), not {shown(header.get('commitOrRollback'))}"
    return (int_problem(header, "tranStateTableOffset", 0, INT64[1], required=True)
            or int_problem(header, "commitLogOffset", 0, INT64[1], required=True)
            or bool_problem(header, "fromTransactionCheck")
            or next((f"`{k}` must be a string of at most 128 characters, not {shown(header[k])}"
                     for k in ("msgId", "transactionId")
                     if k in header and not (isinstance(header[k], str) and len(header[k]) <= 128)), None))


def _locks(header: dict) -> str | None:
    return group_problem(header.get("consumerGroup")) or client_id_problem(header) or queue_list_problem(header.get("mqSet"), "mqSet",
                                                                                           1024)


# -- pop consumption --------------------------------------------------------------------------------

POP_MAX_COUNT, INVISIBLE_MS_MAX = protocol.POP_MAX_COUNT, protocol.INVISIBLE_MS_MAX  # (the pop consumer's checks too)
HANDLES_MAX = 4096  # receipt handles a BATCH_ACK_MESSAGE


def _pop(header: dict) -> str | None:
    return (read_topic_problem(header.get("topic")) or group_problem(header.get("consumerGroup"))
            or int_problem(header, "queueId", -1, QUEUE_ID_MAX)
            or int_problem(header, "maxMsgNums", 1, POP_MAX_COUNT)
            or int_problem(header, "invisibleTime", 1, INVISIBLE_MS_MAX)
            or int_problem(header, "pollTime", 0, SUSPEND_MS_MAX)
            or int_problem(header, "bornTime", *INT64)
            or int_problem(header, "initMode", 0, 1)
            or filter_problem(header, "expType", "exp")  # (its syntax: the pop service's)
            or bool_problem(header, "order"))


def _handle(header: dict, name: str = "extraInfo") -> str | None:
    value = header.get(name)
    if not isinstance(value, str) or not value or len(value) > 512:
        return f"`{name}` must be the receipt handle a pop gave, not {shown(value)}"
    return None


def _ack(header: dict) -> str | None:
    return group_problem(header.get("consumerGroup")) or _handle(header)


def _batch_ack(header: dict) -> str | None:
    handles = header.get("extraInfos")
    if not isinstance(handles, list) or not 1 <= len(handles) <= HANDLES_MAX:
        return f"`extraInfos` must be a list of 1 to {HANDLES_MAX} receipt handles"
    bad = next((h for h in handles if not isinstance(h, str) or not h or len(h) > 512), None)
    if bad is not None:
        return f"`extraInfos` must hold the receipt handles pops gave, not {shown(bad)}"
    return group_problem(header.get("consumerGroup"))


def _change_invisible(header: dict) -> str | None:
    # (0: visible again at once, as RocketMQ takes it: a push consumer's retry with no backoff)
    return _ack(header) or int_problem(header, "invisibleTime", 0, INVISIBLE_MS_MAX, required=True)


CHECKS = {
    protocol.POP_MESSAGE: _pop,
    protocol.PEEK_MESSAGE: _pop,
    protocol.ACK_MESSAGE: _ack,
    protocol.BATCH_ACK_MESSAGE: _batch_ack,
    protocol.CHANGE_MESSAGE_INVISIBLETIME: _change_invisible,
    protocol.GET_POP_STATE: lambda h: group_problem(h.get("consumerGroup")),
    protocol.RESET_POP_OFFSET: _reset_offsets,
    protocol.HEART_BEAT: _heartbeat,
    protocol.END_TRANSACTION: _end_transaction,
    protocol.END_TRANSACTIONS: _end_transactions,
    protocol.GET_TRANSACTION_STATE: lambda h: int_problem(h, "limit", 0, 100_000),
    protocol.UNREGISTER_CLIENT: lambda h: client_id_problem(h) or (
        name_problem(h.get("producerGroup"), "producerGroup", GROUP_MAX_LENGTH)
        if "producerGroup" in h and "consumerGroup" not in h else group_problem(h.get("consumerGroup"))),
    protocol.GET_CONSUMER_LIST_BY_GROUP: lambda h: group_problem(h.get("consumerGroup")),
    protocol.LOCK_BATCH_MQ: _locks,
    protocol.UNLOCK_BATCH_MQ: _locks,
    protocol.GET_CONSUMER_CONNECTION_LIST: lambda h: group_problem(h.get("consumerGroup")),
    protocol.GET_PRODUCER_CONNECTION_LIST: lambda h: group_problem(h.get("producerGroup")),
    protocol.GET_CONSUMER_RUNNING_INFO: _running_info_ask,
    protocol.CONSUME_MESSAGE_DIRECTLY: _consume_directly,
    protocol.RESET_CONSUMER_CLIENT_OFFSET: _reset_offsets,
    protocol.CLIENT_ANSWER: _client_answer,
}
