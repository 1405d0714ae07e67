"""gRPC consumers as members of the node's consumer groups, and what the node asks them, without
I/O (docs/protocol.md "gRPC", "Consumer groups").

RocketMQ 5's proxy registers each gRPC consumer in the broker's consumer table, and so does this
one: a consumer's Heartbeat becomes a HEART_BEAT to the front under the client's own id, over
the proxy's own connection (`heartbeat`), and its termination or silence an UNREGISTER_CLIENT
(`unregister`). The front then lists it beside the ZeroMQ members (`admin group`, rebalancing's
member list, `admin consumer-status`), and sends what it asks of it, GET_CONSUMER_RUNNING_INFO
and CONSUME_MESSAGE_DIRECTLY with their `askId`, to the proxy's connection. `Asks` turns those
into the Telemetry commands RocketMQ 5 defines for them, PrintThreadStackTraceCommand and
VerifyMessageCommand with the askId as nonce, and the client's answer (ThreadStackTrace,
VerifyMessageResult) into the CLIENT_ANSWER the front hands to the admin. An ask the front timed
out is answered by nobody: the pending one is dropped here after MAX_WAIT_S.

A running-info ask without stacks is answered here from what the proxy knows of the client (its
type, language, version, group and subscriptions): RocketMQ's proxy sends the client nothing then,
and the admin gets nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from actors.proxy.apis import definition_pb2 as pb
from actors.proxy.apis import service_pb2 as rpc
from actors.proxy.core import Code, Refused, name_of, topic_name
from node import protocol

MAX_ASKS = 1024  # asks waiting for their clients' answers (the front's own limit)
MAX_WAIT_S = 15.0  # past the front's longest timeout (10 s): nobody waits for the answer any more
MAX_SUBSCRIPTIONS = 1024  # (a HEART_BEAT's limit)
MAX_STACKS_CHARS = 1 << 20
CONSUME_TYPES = {pb.SIMPLE_CONSUMER: "CONSUME_ACTIVELY", pb.PUSH_CONSUMER: "CONSUME_PASSIVELY"}  # (RocketMQ 5's proxy's)
EXPRESSION_TYPES = {pb.SQL: "SQL92"}  # else TAG
# what a client answers with (the official Node.js client answers a verify with a
# VerifyMessageCommand of the nonce and NOT_IMPLEMENTED)
ANSWERS = frozenset({"thread_stack_trace", "verify_message_result", "verify_message_command"})
# a client's verdict on a message verified (RocketMQ 5's proxy: ClientActivity.buildConsumeMessageDirectlyResult)
VERDICTS = {Code.OK: "CR_SUCCESS", Code.FAILED_TO_CONSUME_MESSAGE: "CR_LATER", Code.MESSAGE_CORRUPTED: "CR_RETURN_NULL"}


def consumer_data(client) -> dict | None:
    """A HEART_BEAT's consumerData for `client` (actors.proxy.sessions.Client), None for a client
    that is not a consumer of a group."""
    consume_type = CONSUME_TYPES.get(client.client_type)
    if consume_type is None or not client.group:
        return None
    return {"groupName": client.group, "consumeType": consume_type, "messageModel": "CLUSTERING",
            "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": client.subscriptions}


def heartbeat(client) -> dict | None:
    """The HEART_BEAT that makes `client` a member of its group at the node (None: not a consumer)."""
    data = consumer_data(client)
    if data is None:
        return None
    return {"code": protocol.HEART_BEAT, "clientID": client.client_id, "language": client.language[:64],
            "version": client.version[:64], "consumerDataSet": [data]}


def unregister(client) -> dict | None:
    if consumer_data(client) is None:
        return None
    return {"code": protocol.UNREGISTER_CLIENT, "clientID": client.client_id, "consumerGroup": client.group}


def subscriptions_of(settings: pb.Settings) -> list[dict]:
    """A consumer's subscriptions, from the settings it sent, as a HEART_BEAT's subscriptionDataSet
    (a topic whose name the node would refuse is left out: the client's receives are refused)."""
    out = []
    for entry in list(settings.subscription.subscriptions)[:MAX_SUBSCRIPTIONS]:
        try:
            topic = topic_name(entry.topic)
        except Refused:
            continue
        out.append({"topic": topic, "subString": entry.expression.expression or "*",
                    "expressionType": EXPRESSION_TYPES.get(entry.expression.type, "TAG")})
    return out


def running_info(client) -> dict:
    """GET_CONSUMER_RUNNING_INFO's answer from what the proxy knows of `client` (RocketMQ's
    ConsumerRunningInfo: no queue table, as a pop consumer holds no queue)."""
    return {"properties": {"PROP_CONSUME_TYPE": CONSUME_TYPES.get(client.client_type, ""),
                           "PROP_CLIENT_VERSION": client.version, "PROP_CLIENT_LANGUAGE": client.language,
                           "PROP_CLIENT_TYPE": name_of(pb.ClientType, client.client_type),
                           "PROP_CONSUMER_START_TIMESTAMP": str(client.first_seen_ms), "PROP_CLIENT_PROTOCOL": "gRPC"},
            "subscriptionSet": [{k: s[k] for k in ("topic", "subString", "expressionType")} for s in client.subscriptions],
            "mqTable": {}, "statusTable": {}}


@dataclass
class Pending:
    header: dict  # the node's ask
    client: object  # actors.proxy.sessions.Client
    asked_at: float  # monotonic s


class Asks:
    """The node's asks of gRPC clients, each waiting for its client's answer (by nonce)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.pending: dict[str, Pending] = {}
        self.asked = self.answered = self.refused = self.dropped = self.expired = 0

    def ask(self, header: dict, message: pb.Message | None, client,
            has_stream: bool) -> tuple[rpc.TelemetryCommand | None, dict | None]:
        """(the command down the client's Telemetry stream, None) or (None, the CLIENT_ANSWER now).
        `message`: a direct consumption's, already made the client's (None: it could not be read)."""
        ask_id, code = header["askId"], header.get("code")
        if code == protocol.GET_CONSUMER_RUNNING_INFO and header.get("jstackEnable") is not True:
            return None, self._answer(header, runningInfo=running_info(client))
        if code == protocol.CONSUME_MESSAGE_DIRECTLY and message is None:
            return None, self.refuse(header, "SYSTEM_ERROR", "the node sent no message the proxy can read")
        if not has_stream:
            return None, self.refuse(header, "SYSTEM_ERROR", f"the gRPC client {client.client_id} has no Telemetry "
                                                              "stream open to take the node's command")
        if len(self.pending) >= MAX_ASKS or ask_id in self.pending:
            return None, self.refuse(header, "SYSTEM_BUSY", f"{len(self.pending)} asks of gRPC clients wait already")
        self.pending[ask_id] = Pending(header, client, self.clock())
        self.asked += 1
        command = rpc.TelemetryCommand()
        if code == protocol.GET_CONSUMER_RUNNING_INFO:
            command.print_thread_stack_trace_command.nonce = ask_id
        else:
            command.verify_message_command.nonce = ask_id
            command.verify_message_command.message.CopyFrom(message)
        return command, None

    def answer(self, client_id: str, command: rpc.TelemetryCommand) -> dict | None:
        """A client's Telemetry answer -> the CLIENT_ANSWER to the node; None for one nobody waits
        for, or sent by another client than the one asked (dropped, counted)."""
        kind = command.WhichOneof("command")
        if kind not in ANSWERS:
            return None
        nonce = getattr(command, kind).nonce
        pending = self.pending.get(nonce)
        if pending is None or pending.client.client_id != client_id:
            self.dropped += 1
            return None
        del self.pending[nonce]
        self.answered += 1
        code, text = command.status.code, command.status.message
        if pending.header["code"] == protocol.GET_CONSUMER_RUNNING_INFO:
            if kind != "thread_stack_trace" or code != Code.OK:
                return self.refuse(pending.header, "SYSTEM_ERROR", _declined(pending.client, "stacks", code, text))
            stacks = command.thread_stack_trace.thread_stack_trace[:MAX_STACKS_CHARS]
            return self._answer(pending.header, runningInfo=running_info(pending.client) | {"jstack": stacks})
        verdict = VERDICTS.get(code)
        if verdict is None:
            why = _declined(pending.client, "verdict on the message", code, text)
            return self.refuse(pending.header, "SYSTEM_ERROR", why)
        spent = int((self.clock() - pending.asked_at) * 1000)
        return self._answer(pending.header, consumeResult={
            "order": False, "autoCommit": True, "consumeResult": verdict, "spentTimeMills": spent,
            "remark": f"from gRPC client{': ' + text if text and text != name_of(Code, code) else ''}"})

    def expire(self) -> int:
        """Drop the asks no answer came for in MAX_WAIT_S (the front answered their admins)."""
        now = self.clock()
        gone = [nonce for nonce, p in self.pending.items() if now - p.asked_at > MAX_WAIT_S]
        for nonce in gone:
            del self.pending[nonce]
        self.expired += len(gone)
        return len(gone)

    def _answer(self, header: dict, **answered) -> dict:
        return {"code": protocol.CLIENT_ANSWER, "askId": header["askId"], "status": "OK", "remark": "", **answered}

    def refuse(self, header: dict, status: str, remark: str) -> dict:
        self.refused += 1
        return {"code": protocol.CLIENT_ANSWER, "askId": header["askId"], "status": status, "remark": remark}

    def statistics(self) -> dict:
        return {"asks": {"waiting": len(self.pending), "asked": self.asked, "answered": self.answered,
                         "refused": self.refused, "dropped": self.dropped, "expired": self.expired}}


def _declined(client, what: str, code: int, text: str) -> str:
    why = name_of(Code, code) + (f": {text}" if text and text != name_of(Code, code) else "")
    return f"the gRPC client {client.client_id} ({client.language or 'unknown language'}) gave no {what}: {why}"
