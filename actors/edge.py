"""The edge: every field of every request checked for type and range before anything uses it.

The front calls `check_request` on each decoded request before routing it. What passes can be
routed, encoded and served without another type check; an exception past this point is the
node's bug, not the client's, and stops the process (its restart is recovery). So the checks
here are the whole contract of docs/protocol.md's field tables, and a field a code does not
name is ignored.

Two outcomes besides success:
- `ProtocolError(remark)`: the request cannot be served as asked. Answered `SYSTEM_ERROR`
  with the remark: a read, query, offset or admin request with a bad field, or a send whose
  structure is broken (the `messages` list, `bodySize`s, a batch body).
- a send's refusal, `(MESSAGE_ILLEGAL, remark)`: a message field of the wrong type or range
  (`send_problem`). SEND_MESSAGE and SEND_BATCH_MESSAGE are refused whole; SEND_MESSAGES
  refuses only the message at fault, each message succeeding or failing on its own.

Names follow RocketMQ's `Validators`: topics and groups match `[%|a-zA-Z0-9_-]+`, a topic at
most 127 characters, a group at most 255. Reads may name system topics (`SCHEDULE_TOPIC_XXXX`
can be pulled); sends may not (actors.topics).
"""

from __future__ import annotations

import ipaddress
import re

from node import protocol
from node.protocol import ProtocolError
from actors.topics import TOPIC_MAX_LENGTH
from actors.client_asks import MAX_TIMEOUT_MS

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
GROUP_MAX_LENGTH = 255
QUEUE_ID_MAX = 2**31 - 1
SUSPEND_MS_MAX = 600_000  # a held pull waits at most 10 minutes
MAX_PULL_COUNT = 1024
MAX_PROPERTIES_CHARS = 32767
_NAME = re.compile(r"[%|a-zA-Z0-9_-]+")
_HEX = re.compile(r"[0-9a-fA-F]+")


def is_int(value) -> bool:
    """A JSON integer: not a bool, not a float (10.0 is refused), not a string."""
    return type(value) is int


def int_problem(header: dict, name: str, low: int, high: int, *, required: bool = False) -> str | None:
    value = header.get(name)
    if value is None and not required and name not in header:
        return None
    if not is_int(value) or not low <= value <= high:
        return f"`{name}` must be an integer from {low} to {high}, not {_shown(value)}"
    return None


def bool_problem(header: dict, name: str) -> str | None:
    if name in header and type(header[name]) is not bool:
        return f"`{name}` must be true or false, not {_shown(header[name])}"
    return None


def read_topic_problem(topic) -> str | None:
    """Why `topic` cannot name a queue to read (a system topic can), or None."""
    return _name_problem(topic, "topic", TOPIC_MAX_LENGTH)


def group_problem(group) -> str | None:
    return _name_problem(group, "consumerGroup", GROUP_MAX_LENGTH)


def _name_problem(value, field: str, max_length: int) -> str | None:
    """A topic or group name: `[%|a-zA-Z0-9_-]+`, 1 to `max_length` characters."""
    if not isinstance(value, str) or not value:
        return f"`{field}` must be a name, not {_shown(value)}"
    if len(value) > max_length:
        return f"`{field}` is {len(value)} characters; at most {max_length} are allowed"
    if not _NAME.fullmatch(value):
        return f"`{field}` {_shown(value)} may only contain characters from [%|a-zA-Z0-9_-]"
    return None


def born_host_problem(value) -> str | None:
    """`bornHost` is optional (stored as 127.0.0.1:0 when absent); present, it is "ip:port" or
    "[ipv6]:port" with a port 0..65535."""
    if value is None:
        return None
    if not isinstance(value, str):
        return f"`bornHost` must be \"ip:port\", not {_shown(value)}"
    host, separator, port = value.rpartition(":")
    try:
        ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
        port_ok = separator and port.isdigit() and 0 <= int(port) <= 65535
    except ValueError:
        port_ok = False
    if not port_ok:
        return f"`bornHost` must be \"ip:port\" (or \"[ipv6]:port\") with a port 0..65535, not {value!r}"
    return None


def properties_problem(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        if len(value) > MAX_PROPERTIES_CHARS:
            return f"the properties string of {len(value)} characters exceeds {MAX_PROPERTIES_CHARS}"
        return None
    if isinstance(value, dict):
        for name, text in value.items():
            if not isinstance(text, str):
                return f"property {name!r} must be a string, not {_shown(text)}"
            if "\x01" in name or "\x02" in name or "\x02" in text:
                return f"property {name!r}: names hold no \\x01 or \\x02, values no \\x02 (the separators)"
        return None
    return f"`properties` must be an object of strings or a RocketMQ properties string, not {_shown(value)}"


# -- sends ---------------------------------------------------------------------------------------------


def send_problem(message: dict) -> str | None:
    """Why one message of a send (a SEND_MESSAGE or SEND_BATCH_MESSAGE header, or an entry of
    SEND_MESSAGES) is MESSAGE_ILLEGAL by its fields' types and ranges, or None. Names and queue
    ids against the topic table are the front's (actors.topics).

    Runs for every message sent: the common message (the fields the Python client sends, of
    the right types) is passed by the first test alone."""
    flag, born, properties = message.get("flag", 0), message.get("bornTimestamp", 0), message.get("properties")
    if (type(message.get("topic")) is str and type(message.get("queueId")) is int and type(flag) is int
            and type(born) is int and -2**31 <= flag < 2**31 and -2**63 <= born < 2**63
            and "reconsumeTimes" not in message and (properties is None or type(properties) is dict)
            and all(type(v) is str for v in (properties or {}).values())):
        return None
    topic = message.get("topic")
    if not isinstance(topic, str):
        return f"`topic` must be a string, not {_shown(topic)}"
    if not is_int(message.get("queueId")):
        return f"`queueId` must be an integer, not {_shown(message.get('queueId'))}"
    return (properties_problem(message.get("properties"))
            or int_problem(message, "flag", *INT32)
            or int_problem(message, "reconsumeTimes", *INT32)
            or int_problem(message, "bornTimestamp", *INT64))


def check_send_request(header: dict) -> None:
    """The structure of a send request (ProtocolError: SYSTEM_ERROR); its messages' fields are
    `send_problem`'s."""
    problem = (bool_problem(header, "oneway") or bool_problem(header, "oneHalf")
               or born_host_problem(header.get("bornHost")))
    if problem:
        raise _Refused(problem)
    if "_reput" in header:  # a service's own (schedule, pop, transaction), over the node's links only
        raise _Refused("`_reput` is the node's own field")
    if header["code"] != protocol.SEND_MESSAGES:
        return
    messages = header.get("messages")
    if not isinstance(messages, list) or not 0 < len(messages) <= protocol.MAX_MESSAGES_PER_REQUEST:
        raise ProtocolError(f"`messages` must be a list of 1 to {protocol.MAX_MESSAGES_PER_REQUEST} objects")
    problem = bool_problem(header, "compact")
    if problem:
        raise ProtocolError(problem)
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ProtocolError(f"message {i} must be a JSON object")
        if not is_int(message.get("bodySize")) or message["bodySize"] < 0:
            raise ProtocolError(f"message {i} needs a `bodySize`, a non-negative integer")
        if "bornHost" in message:
            raise _Refused(f"message {i}: `bornHost` belongs in the SEND_MESSAGES header (one for all its messages)")


class _Refused(ValueError):
    """A send request refused whole as MESSAGE_ILLEGAL."""


def send_refusal(header: dict) -> str | None:
    """MESSAGE_ILLEGAL's remark for a send request refused whole, or None; raises ProtocolError
    for a broken structure."""
    try:
        check_send_request(header)
    except _Refused as e:
        return str(e)
    if header["code"] == protocol.SEND_MESSAGES:
        return None
    return send_problem(header)


# -- everything else -----------------------------------------------------------------------------------


def _queue(header: dict) -> str | None:
    return read_topic_problem(header.get("topic")) or int_problem(header, "queueId", 0, QUEUE_ID_MAX, required=True)


def _pull(header: dict) -> str | None:
    return (_queue(header)
            or ("consumerGroup" in header and group_problem(header["consumerGroup"]) or None)
            or ("commitOffset" in header and "consumerGroup" not in header and "`commitOffset` needs `consumerGroup`"
                or None)
            or int_problem(header, "commitOffset", 0, INT64[1])
            or int_problem(header, "queueOffset", *INT64, required=True)
            or int_problem(header, "maxMsgNums", 1, MAX_PULL_COUNT)
            or _subscription(header)
            or bool_problem(header, "suspend")
            or int_problem(header, "suspendTimeoutMillis", 0, SUSPEND_MS_MAX))


def _subscription(header: dict) -> str | None:
    return _filter_fields(header, "expressionType", "subscription")  # (its syntax: the read core's)


def _filter_fields(header: dict, kind_name: str, expression_name: str) -> str | None:
    """A pull's or pop's filter: an expression type TAG or SQL92 (absent: TAG) and a string;
    whether it parses, and whether SQL92 is on, the service that reads says."""
    kind, expression = header.get(kind_name), header.get(expression_name)
    if kind is not None and kind not in ("", "TAG", "SQL92"):
        return f"`{kind_name}` {_shown(kind)} is not one (TAG or SQL92)"
    if expression is not None and not isinstance(expression, str):
        return f"`{expression_name}` must be a string, not {_shown(expression)}"
    return None


def _query(header: dict) -> str | None:
    key = header.get("key")
    if not isinstance(key, str) or not key:
        return f"`key` must be a non-empty string, not {_shown(key)}"
    return (read_topic_problem(header.get("topic"))
            or int_problem(header, "beginTimestamp", *INT64)
            or int_problem(header, "endTimestamp", *INT64)
            or int_problem(header, "maxNum", 1, INT32[1]))


def _view(header: dict) -> str | None:
    return _offset_msg_id_problem(header.get("offsetMsgId"), "offsetMsgId")


def _offset_msg_id_problem(value, name: str) -> str | None:
    if not isinstance(value, str) or len(value) not in (32, 56) or not _HEX.fullmatch(value):
        return f"`{name}` must be 32 (IPv4 store host) or 56 (IPv6) hex characters, not {_shown(value)}"
    return None


def _offsets(header: dict) -> str | None:
    problem = group_problem(header.get("consumerGroup"))
    if problem or header["code"] == protocol.GET_CONSUME_STATS:
        return problem
    problem = _queue(header)
    if problem or header["code"] != protocol.UPDATE_CONSUMER_OFFSET:
        return problem
    return int_problem(header, "commitOffset", 0, INT64[1], required=True)


def _max_offset(header: dict) -> str | None:
    return _queue(header) or bool_problem(header, "indexed")


def _send_back(header: dict) -> str | None:
    if not isinstance(header.get("offsetMsgId"), str) and "offset" not in header:
        return "CONSUMER_SEND_MSG_BACK needs `offsetMsgId` (or `offset`, the physical offset)"
    if isinstance(header.get("offsetMsgId"), str) and len(header["offsetMsgId"]) not in (32, 56):
        return f"`offsetMsgId` must be 32 or 56 hex characters, not {_shown(header['offsetMsgId'])}"
    if isinstance(header.get("offsetMsgId"), str):
        try:
            bytes.fromhex(header["offsetMsgId"])
        except ValueError:
            return f"`offsetMsgId` must be hex, not {_shown(header['offsetMsgId'])}"
    return (group_problem(header.get("consumerGroup"))
            or int_problem(header, "offset", 0, INT64[1])
            or int_problem(header, "delayLevel", -1, 2**31 - 1)
            or int_problem(header, "maxReconsumeTimes", 0, 2**31 - 1)
            or (None if header.get("originTopic") is None else read_topic_problem(header.get("originTopic")))
            or (None if isinstance(header.get("originMsgId", ""), str) else "`originMsgId` must be a string"))


QUEUE_NUMS_MAX = 1024  # queues a topic may be given


def _group_config(header: dict) -> str | None:
    return (group_problem(header.get("groupName"))
            or bool_problem(header, "consumeEnable") or bool_problem(header, "consumeBroadcastEnable")
            or bool_problem(header, "consumeMessageOrderly")
            or bool_problem(header, "consumeFromMinEnable")
            or int_problem(header, "retryQueueNums", 1, QUEUE_NUMS_MAX)
            or int_problem(header, "retryMaxTimes", 0, 64)
            or int_problem(header, "whichBrokerWhenConsumeSlowly", 0, 1024)
            or int_problem(header, "brokerId", 0, 1024)
            or (retry_policy_problem(header["groupRetryPolicy"]) if "groupRetryPolicy" in header else None))


RETRY_DELAY_MS_MAX = 12 * 3600 * 1000  # a retry's delay, as the longest invisible time
RETRY_STEPS_MAX = 64  # the delays a customized retry policy lists


def retry_policy_problem(policy) -> str | None:
    """Why `policy` is not a RocketMQ 5 groupRetryPolicy (what gRPC consumers are told to back off
    by): {"type": "EXPONENTIAL", "exponentialRetryPolicy": {"initial", "max", "multiplier"}} or
    {"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": [ms, ...]}} (left out: the delay levels)."""
    if not isinstance(policy, dict) or policy.get("type") not in ("EXPONENTIAL", "CUSTOMIZED"):
        return f"`groupRetryPolicy` must be an object whose type is EXPONENTIAL or CUSTOMIZED, not {_shown(policy)}"
    if policy["type"] == "EXPONENTIAL":
        exponential = policy.get("exponentialRetryPolicy")
        if not isinstance(exponential, dict):
            return "an EXPONENTIAL `groupRetryPolicy` needs its `exponentialRetryPolicy`: initial, max (ms), multiplier"
        return (int_problem(exponential, "initial", 0, RETRY_DELAY_MS_MAX, required=True)
                or int_problem(exponential, "max", exponential["initial"], RETRY_DELAY_MS_MAX, required=True)
                or int_problem(exponential, "multiplier", 1, 100, required=True))
    customized = policy.get("customizedRetryPolicy")
    if customized is None:
        return None
    steps = customized.get("next") if isinstance(customized, dict) else None
    if not isinstance(steps, list) or not 1 <= len(steps) <= RETRY_STEPS_MAX or \
            not all(is_int(ms) and 0 <= ms <= RETRY_DELAY_MS_MAX for ms in steps):
        return f"`customizedRetryPolicy.next` must list 1 to {RETRY_STEPS_MAX} delays of 0 to {RETRY_DELAY_MS_MAX} ms"
    return None


# -- consumer groups --------------------------------------------------------------------------------


def _client_id(header: dict) -> str | None:
    value = header.get("clientID")
    if not isinstance(value, str) or not 1 <= len(value) <= 255:
        return f"`clientID` must be a string of 1 to 255 characters, not {_shown(value)}"
    return None


def _running_info_ask(header: dict) -> str | None:
    client_id = header.get("clientId")
    if not isinstance(client_id, str) or not 1 <= len(client_id) <= 255:
        return f"`clientId` must be a string of 1 to 255 characters, not {_shown(client_id)}"
    return (group_problem(header.get("consumerGroup")) or bool_problem(header, "jstackEnable")
            or int_problem(header, "timeoutMillis", 1, MAX_TIMEOUT_MS))


def _consume_directly(header: dict) -> str | None:
    return _running_info_ask(header) or _offset_msg_id_problem(header.get("msgId"), "msgId")


def _reset_offsets(header: dict) -> str | None:
    """RESET_CONSUMER_CLIENT_OFFSET and RESET_POP_OFFSET: `offsetTable` {queueId: offset} of one
    topic, as committed."""
    table = header.get("offsetTable")
    if not isinstance(table, dict) or not 1 <= len(table) <= 4096:
        return f"`offsetTable` must be an object {{queueId: offset}} of 1 to 4096 queues, not {_shown(table)}"
    for queue, offset in table.items():
        if not (queue.isdigit() and str(int(queue)) == queue and int(queue) <= QUEUE_ID_MAX
                and type(offset) is int and 0 <= offset <= INT64[1]):
            return f"`offsetTable` maps a queue id to an offset of 0 or more, not {_shown(queue)}: {_shown(offset)}"
    return group_problem(header.get("consumerGroup")) or read_topic_problem(header.get("topic"))


# what a member may answer with (the gRPC proxy answers for its clients: busy, or one gone)
ANSWER_STATUSES = ("OK", "SYSTEM_ERROR", "SYSTEM_BUSY", "CONSUMER_NOT_ONLINE")


def _client_answer(header: dict) -> str | None:
    ask_id, status = header.get("askId"), header.get("status")
    if not isinstance(ask_id, str) or not 1 <= len(ask_id) <= 64:
        return f"`askId` must be a string of 1 to 64 characters, not {_shown(ask_id)}"
    if status not in ANSWER_STATUSES:
        return f"`status` must be one of {', '.join(ANSWER_STATUSES)}, not {_shown(status)}"
    if not isinstance(header.get("remark", ""), str):
        return f"`remark` must be a string, not {_shown(header.get('remark'))}"
    answers = [name for name in protocol.ANSWER_FIELDS.values() if name in header]
    if status == "OK" and (len(answers) != 1 or not isinstance(header[answers[0]], dict)):
        return "an OK answer carries one object: runningInfo or consumeResult"
    return None


def _queue_list(value, field: str, limit: int) -> str | None:
    if not isinstance(value, list) or len(value) > limit:
        return f"`{field}` must be a list of at most {limit} {{topic, queueId}}, not {_shown(value)}"
    for item in value:
        problem = (f"each of `{field}` must be {{topic, queueId}}, not {_shown(item)}" if not isinstance(item, dict)
                   else read_topic_problem(item.get("topic")) or int_problem(item, "queueId", 0, QUEUE_ID_MAX,
                                                                             required=True))
        if problem:
            return problem
    return None


def _consumer_data(item) -> str | None:
    if not isinstance(item, dict):
        return f"each of `consumerDataSet` must be an object, not {_shown(item)}"
    if item.get("messageModel", "CLUSTERING") not in ("CLUSTERING", "BROADCASTING"):
        return f"`messageModel` must be CLUSTERING or BROADCASTING, not {_shown(item.get('messageModel'))}"
    subscriptions = item.get("subscriptionDataSet", [])
    if not isinstance(subscriptions, list) or len(subscriptions) > 1024:
        return f"`subscriptionDataSet` must be a list of at most 1024 {{topic, subString}}, not {_shown(subscriptions)}"
    for s in subscriptions:
        problem = (f"each of `subscriptionDataSet` must be {{topic, subString}}, not {_shown(s)}"
                   if not isinstance(s, dict) or not isinstance(s.get("subString", "*"), str) else
                   read_topic_problem(s.get("topic")))
        if problem:
            return problem
    return (_name_problem(item.get("groupName"), "groupName", GROUP_MAX_LENGTH)
            or next((f"`{k}` must be a string, not {_shown(item[k])}" for k in ("consumeType", "consumeFromWhere")
                     if k in item and not isinstance(item[k], str)), None)
            or _queue_list(item.get("queues", []), "queues", 4096))


def _heartbeat(header: dict) -> str | None:
    data = header.get("consumerDataSet", [])
    if not isinstance(data, list) or len(data) > 64:
        return f"`consumerDataSet` must be a list of at most 64 groups, not {_shown(data)}"
    producers = header.get("producerDataSet", [])
    if not isinstance(producers, list) or len(producers) > 64:
        return f"`producerDataSet` must be a list of at most 64 {{groupName}}, not {_shown(producers)}"
    for name in ("language", "version"):
        if name in header and not (isinstance(header[name], str) and len(header[name]) <= 64):
            return f"`{name}` must be a string of at most 64 characters, not {_shown(header[name])}"
    return (_client_id(header) or next((p for p in map(_consumer_data, data) if p), None)
            or next((p for p in map(_producer_data, producers) if p), None))


def _producer_data(item) -> str | None:
    if not isinstance(item, dict):
        return f"each of `producerDataSet` must be {{groupName}}, not {_shown(item)}"
    return _name_problem(item.get("groupName"), "groupName", GROUP_MAX_LENGTH)


# -- transactions -----------------------------------------------------------------------------------

TRANSACTION_OUTCOMES = (0, 8, 12)  # RocketMQ's TRANSACTION_NOT_TYPE, _COMMIT_TYPE, _ROLLBACK_TYPE


def _end_transaction(header: dict) -> str | None:
    return _name_problem(header.get("producerGroup"), "producerGroup", GROUP_MAX_LENGTH) or _end(header)


def _end_transactions(header: dict) -> str | None:
    if header.get("openOfGroup") is True:  # every open half of the group, rolled back (a Spark job's leftovers)
        if header.get("commitOrRollback") != 12 or "ends" in header:
            return "`openOfGroup` rolls back (commitOrRollback 12) every open half of the group: it takes no `ends`"
        return _name_problem(header.get("producerGroup"), "producerGroup", GROUP_MAX_LENGTH)
    ends = header.get("ends")
    if not isinstance(ends, list) or not 1 <= len(ends) <= protocol.MAX_ENDS_PER_REQUEST:
        return f"`ends` must be a list of 1 to {protocol.MAX_ENDS_PER_REQUEST} ends, not {_shown(ends)}"
    return (_name_problem(header.get("producerGroup"), "producerGroup", GROUP_MAX_LENGTH)
            or next((p for p in (f"each of `ends` must be an object, not {_shown(e)}" if not isinstance(e, dict)
                                 else _end(e) for e in ends) if p), None))


def _end(header: dict) -> str | None:
    if header.get("commitOrRollback") not in TRANSACTION_OUTCOMES or type(header.get("commitOrRollback")) is not int:
        return f"`commitOrRollback` must be 8 (commit), 12 (rollback) or 0 (unknown), not {_shown(header.get('commitOrRollback'))}"
    return (int_problem(header, "tranStateTableOffset", 0, INT64[1], required=True)
            or int_problem(header, "commitLogOffset", 0, INT64[1], required=True)
            or bool_problem(header, "fromTransactionCheck")
            or next((f"`{k}` must be a string of at most 128 characters, not {_shown(header[k])}"
                     for k in ("msgId", "transactionId")
                     if k in header and not (isinstance(header[k], str) and len(header[k]) <= 128)), None))


def _locks(header: dict) -> str | None:
    return group_problem(header.get("consumerGroup")) or _client_id(header) or _queue_list(header.get("mqSet"), "mqSet",
                                                                                           1024)


# code -> the check of its fields (None: fine); sends are `send_refusal`'s
# -- pop consumption --------------------------------------------------------------------------------

POP_MAX_COUNT = 1024  # messages a pop (RocketMQ 5's proxy allows 32 a receive; more helps a batch consumer)
INVISIBLE_MS_MAX = 12 * 3600 * 1000  # RocketMQ 5's maxInvisibleTime (12 h)
HANDLES_MAX = 4096  # receipt handles a BATCH_ACK_MESSAGE


def _pop(header: dict) -> str | None:
    return (read_topic_problem(header.get("topic")) or group_problem(header.get("consumerGroup"))
            or int_problem(header, "queueId", -1, QUEUE_ID_MAX)
            or int_problem(header, "maxMsgNums", 1, POP_MAX_COUNT)
            or int_problem(header, "invisibleTime", 1, INVISIBLE_MS_MAX)
            or int_problem(header, "pollTime", 0, SUSPEND_MS_MAX)
            or int_problem(header, "bornTime", *INT64)
            or int_problem(header, "initMode", 0, 1)
            or _filter_fields(header, "expType", "exp")  # (its syntax: the pop service's)
            or bool_problem(header, "order"))


def _handle(header: dict, name: str = "extraInfo") -> str | None:
    value = header.get(name)
    if not isinstance(value, str) or not value or len(value) > 512:
        return f"`{name}` must be the receipt handle a pop gave, not {_shown(value)}"
    return None


def _ack(header: dict) -> str | None:
    return group_problem(header.get("consumerGroup")) or _handle(header)


def _batch_ack(header: dict) -> str | None:
    handles = header.get("extraInfos")
    if not isinstance(handles, list) or not 1 <= len(handles) <= HANDLES_MAX:
        return f"`extraInfos` must be a list of 1 to {HANDLES_MAX} receipt handles"
    bad = next((h for h in handles if not isinstance(h, str) or not h or len(h) > 512), None)
    if bad is not None:
        return f"`extraInfos` must hold the receipt handles pops gave, not {_shown(bad)}"
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
    protocol.PULL_MESSAGE: _pull,
    protocol.QUERY_MESSAGE: _query,
    protocol.VIEW_MESSAGE_BY_ID: _view,
    protocol.GET_MAX_OFFSET: _max_offset,
    protocol.GET_MIN_OFFSET: _queue,
    protocol.SEARCH_OFFSET_BY_TIMESTAMP: lambda h: _queue(h) or int_problem(h, "timestamp", *INT64, required=True),
    protocol.QUERY_CONSUMER_OFFSET: _offsets,
    protocol.UPDATE_CONSUMER_OFFSET: _offsets,
    protocol.GET_CONSUME_STATS: _offsets,
    protocol.GET_ROUTEINFO_BY_TOPIC: lambda h: None,  # a bad name: MESSAGE_ILLEGAL, as its send would be
    protocol.GET_ALL_TOPIC_CONFIG: lambda h: None,
    protocol.GET_ALL_CONSUMER_OFFSET: lambda h: None,
    protocol.UPDATE_AND_CREATE_TOPIC: lambda h: (read_topic_problem(h.get("topic"))
                                                 or int_problem(h, "readQueueNums", 1, QUEUE_NUMS_MAX)
                                                 or int_problem(h, "writeQueueNums", 1, QUEUE_NUMS_MAX)
                                                 or int_problem(h, "perm", 0, 7) or bool_problem(h, "order")),
    protocol.DELETE_TOPIC_IN_BROKER: lambda h: read_topic_problem(h.get("topic")),
    protocol.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: lambda h: _group_config(h),
    protocol.DELETE_SUBSCRIPTIONGROUP: lambda h: group_problem(h.get("groupName")),
    protocol.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: lambda h: None,
    protocol.GET_BROKER_RUNTIME_INFO: lambda h: None,
    protocol.DELETE_EXPIRED_COMMITLOG: lambda h: bool_problem(h, "force"),
    protocol.CONSUMER_SEND_MSG_BACK: _send_back,
    protocol.HEART_BEAT: _heartbeat,
    protocol.END_TRANSACTION: _end_transaction,
    protocol.END_TRANSACTIONS: _end_transactions,
    protocol.GET_TRANSACTION_STATE: lambda h: int_problem(h, "limit", 0, 100_000),
    protocol.UNREGISTER_CLIENT: lambda h: _client_id(h) or (
        _name_problem(h.get("producerGroup"), "producerGroup", GROUP_MAX_LENGTH)
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
    protocol.GET_BROKER_HA_STATUS: lambda h: None,
    protocol.HA_ROLE: lambda h: (None if h.get("role") in ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE")
                                 else f"role must be ASYNC_MASTER or SYNC_MASTER, not {_shown(h.get('role'))}"),
}


def check_request(request: protocol.Request) -> str | None:
    """Raises ProtocolError (SYSTEM_ERROR) for a request that cannot be served; returns
    MESSAGE_ILLEGAL's remark for a send refused whole, else None. Unknown codes pass: the
    front answers them REQUEST_CODE_NOT_SUPPORTED."""
    header = request.header
    if request.code in protocol.SEND_CODES:
        return send_refusal(header)
    check = CHECKS.get(request.code)
    problem = check(header) if check is not None else None
    if problem:
        raise ProtocolError(problem)
    return None


def _shown(value) -> str:
    """A client's value in a remark: short, whatever its size."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
