"""The edge: every field of every request checked for type and range before anything uses it.

The front calls `check_request` on each decoded request before routing it. What passes can be
routed, encoded and served without another type check; an exception past this point is the
node's bug, not the client's, and stops the process (its restart is recovery). So the checks
here are the whole contract of docs/protocol.md's field tables, and a field a code does not
name is ignored. Three modules: this one (sends, reads, offsets, admin; `CHECKS`, the table of
every code's check), actors.edge_clients (what clients say of themselves and their groups:
heartbeats, asks and answers, locks, transactions' ends, pops and acks) and
actors.edge_fields (the checks of one field the others are built from).

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

from node import protocol
from node.protocol import ProtocolError
from actors import edge_clients
from actors.edge_fields import (
    INT32, INT64, MAX_PULL_COUNT, SUSPEND_MS_MAX, bool_problem, born_host_problem, filter_problem,
    group_problem, int_problem, is_int, offset_msg_id_problem, properties_problem, queue_problem, read_topic_problem, shown,
)

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
        return f"`topic` must be a string, not {shown(topic)}"
    if not is_int(message.get("queueId")):
        return f"`queueId` must be an integer, not {shown(message.get('queueId'))}"
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


def _pull(header: dict) -> str | None:
    return (queue_problem(header)
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
    return filter_problem(header, "expressionType", "subscription")  # (its syntax: the read core's)


def _query(header: dict) -> str | None:
    key = header.get("key")
    if not isinstance(key, str) or not key:
        return f"`key` must be a non-empty string, not {shown(key)}"
    return (read_topic_problem(header.get("topic"))
            or int_problem(header, "beginTimestamp", *INT64)
            or int_problem(header, "endTimestamp", *INT64)
            or int_problem(header, "maxNum", 1, INT32[1]))


def _view(header: dict) -> str | None:
    return offset_msg_id_problem(header.get("offsetMsgId"), "offsetMsgId")


def _offsets(header: dict) -> str | None:
    problem = group_problem(header.get("consumerGroup"))
    if problem or header["code"] == protocol.GET_CONSUME_STATS:
        return problem
    problem = queue_problem(header)
    if problem or header["code"] != protocol.UPDATE_CONSUMER_OFFSET:
        return problem
    return int_problem(header, "commitOffset", 0, INT64[1], required=True)


def _max_offset(header: dict) -> str | None:
    return queue_problem(header) or bool_problem(header, "indexed")


def _send_back(header: dict) -> str | None:
    if not isinstance(header.get("offsetMsgId"), str) and "offset" not in header:
        return "CONSUMER_SEND_MSG_BACK needs `offsetMsgId` (or `offset`, the physical offset)"
    if isinstance(header.get("offsetMsgId"), str) and len(header["offsetMsgId"]) not in (32, 56):
        return f"`offsetMsgId` must be 32 or 56 hex characters, not {shown(header['offsetMsgId'])}"
    if isinstance(header.get("offsetMsgId"), str):
        try:
            bytes.fromhex(header["offsetMsgId"])
        except ValueError:
            return f"`offsetMsgId` must be hex, not {shown(header['offsetMsgId'])}"
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
        return f"`groupRetryPolicy` must be an object whose type is EXPONENTIAL or CUSTOMIZED, not {shown(policy)}"
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


CHECKS = {
    protocol.PULL_MESSAGE: _pull,
    protocol.QUERY_MESSAGE: _query,
    protocol.VIEW_MESSAGE_BY_ID: _view,
    protocol.GET_MAX_OFFSET: _max_offset,
    protocol.GET_MIN_OFFSET: queue_problem,
    protocol.SEARCH_OFFSET_BY_TIMESTAMP: lambda h: queue_problem(h) or int_problem(h, "timestamp", *INT64, required=True),
    protocol.QUERY_CONSUMER_OFFSET: _offsets,
    protocol.UPDATE_CONSUMER_OFFSET: _offsets,
    protocol.GET_CONSUME_STATS: _offsets,
    # a bad name: MESSAGE_ILLEGAL, as its send would be; `create` false: a consumer's ask, which makes no topic
    protocol.GET_ROUTEINFO_BY_TOPIC: lambda h: bool_problem(h, "create"),
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
    protocol.GET_BROKER_HA_STATUS: lambda h: None,
    protocol.HA_ROLE: lambda h: (None if h.get("role") in ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE")
                                 else f"role must be ASYNC_MASTER or SYNC_MASTER, not {shown(h.get('role'))}"),
    **edge_clients.CHECKS,
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
