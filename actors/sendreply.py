"""Append results -> send replies: what each message of a request became, as the reply header
its code calls for (docs/protocol.md). No I/O.

The writer answers with `answer` once a request's records are placed: the offset msgId is the
store host plus the record's physical offset, the msgId the client's UNIQ_KEY when it sent one.
"""

from __future__ import annotations

import orjson

from node import protocol
from actors.sendcore import PendingSend
from shm.codec import offset_ids, offset_msg_id


def results(pending: PendingSend, physical: list[int], queue: list[int], store_host: bytes,
            status: str = "PUT_OK", remark: str = "") -> list[dict]:
    """Per message: status, msgId (UNIQ_KEY, else the offset msgId), offsetMsgId, queueId,
    queueOffset. `physical`/`queue` are the batch's append results."""
    out = []
    for i, index in enumerate(pending.indices):
        if index < 0:
            refused = pending.refusals.get(i, ("UNKNOWN_ERROR", "not appended"))
            out.append({"status": refused[0], "remark": refused[1], "queueId": pending.queue_ids[i]})
            continue
        offset_id = offset_msg_id(store_host, physical[index])
        entry = {"status": status, "msgId": pending.uniq_keys[i] or offset_id, "offsetMsgId": offset_id,
                 "queueId": pending.queue_ids[i], "queueOffset": queue[index], "topic": pending.topics[i]}
        if remark:
            entry["remark"] = remark
        out.append(entry)
    return out


def answer(pending: PendingSend, physical: list[int], queue: list[int], store_host: bytes) -> bytes:
    """The reply header for an appended request: `reply(pending, results(...))`, with a request
    whose messages were all stored answered without the general path's per-message detours
    (same bytes), and in the compact form when a SEND_MESSAGES request asked for it."""
    indices = pending.indices
    if not indices or pending.refusals or min(indices) < 0 or pending.code == protocol.SEND_MESSAGE:
        return reply(pending, results(pending, physical, queue, store_host))
    ids = offset_ids(store_host, physical, indices)
    if pending.code == protocol.SEND_MESSAGES and pending.compact:
        # a quarter of the bytes and no dict a message, to build here and to read at the client
        msg_ids = ",".join([u or o for u, o in zip(pending.uniq_keys, ids)])
        return orjson.dumps(protocol.reply_header(pending.opaque, "PUT_OK", count=len(indices), msgId=msg_ids,
                                                  offsetMsgId=",".join(ids), queueOffsets=[queue[i] for i in indices]))
    if pending.code == protocol.SEND_MESSAGES:
        header = protocol.reply_header(pending.opaque, "PUT_OK", results=[
            {"status": "PUT_OK", "msgId": u or o, "offsetMsgId": o, "queueId": q, "queueOffset": queue[i], "topic": t}
            for i, u, o, q, t in zip(indices, pending.uniq_keys, ids, pending.queue_ids, pending.topics)])
        return orjson.dumps(header)
    msg_ids = ",".join([u or o for u, o in zip(pending.uniq_keys, ids)])
    return orjson.dumps(protocol.reply_header(
        pending.opaque, "PUT_OK", queueId=pending.queue_ids[0], count=len(indices), msgId=msg_ids,
        offsetMsgId=",".join(ids), queueOffset=queue[indices[0]]))


def reply(pending: PendingSend, per_message: list[dict]) -> bytes:
    """The reply header for the request's code (see docs/protocol.md)."""
    if pending.code == protocol.SEND_MESSAGES:
        # status and code: PUT_OK (0) when every message has it, else the first other status
        # and its code (docs/protocol.md); each result has its own
        header = protocol.reply_header(pending.opaque, _worst(per_message), results=per_message)
    elif pending.code == protocol.SEND_BATCH_MESSAGE:
        first = per_message[0]
        stored = [r for r in per_message if "offsetMsgId" in r]
        status = first["status"] if len(stored) == len(per_message) else _worst(per_message)
        fields = {"queueId": first.get("queueId"), "count": len(per_message)}
        if len(stored) == len(per_message):
            fields.update(msgId=",".join(r["msgId"] for r in stored),
                          offsetMsgId=",".join(r["offsetMsgId"] for r in stored), queueOffset=first["queueOffset"])
        header = protocol.reply_header(pending.opaque, status, first.get("remark", ""), **fields)
    else:
        result = dict(per_message[0])
        status, remark = result.pop("status"), result.pop("remark", "")
        result.pop("topic", None)
        header = protocol.reply_header(pending.opaque, status, remark, **result)
    return orjson.dumps(header)


def _worst(per_message: list[dict]) -> str:
    for r in per_message:
        if r["status"] != "PUT_OK":
            return r["status"]
    return "PUT_OK"


def downgraded(header: bytes, status: str) -> bytes:
    """A stored send's reply with PUT_OK replaced by a weaker `status` (SLAVE_NOT_AVAILABLE:
    stored on the master only), in the header and in each result."""
    reply = orjson.loads(header)
    if reply.get("status") == "PUT_OK":
        reply["status"], reply["code"] = status, protocol.STATUS_CODES[status]
    for result in reply.get("results") or []:
        if result.get("status") == "PUT_OK":
            result["status"] = status
    return orjson.dumps(reply)
