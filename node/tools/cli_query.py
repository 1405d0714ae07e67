"""`mqnode query`: messages found by key through the index (mqadmin queryMsgByKey), one by its id
(queryMsgById: an offsetMsgId straight from the CommitLog, or a msgId with its topic), or one by
its queue and offset (queryMsgByOffset). With --group and --client-id, the message found by its
id goes to that member's listener now (queryMsgById -g -d: CONSUME_MESSAGE_DIRECTLY), and a
second line says how the listener took it."""

from __future__ import annotations

import argparse
import sys

import orjson

from node.tools import cli_values as values
from shm.settings import SettingsError


def add_parser(commands, add_credentials, default_endpoint: str) -> None:
    query = commands.add_parser("query", help="find messages by key (UNIQ_KEY or one of KEYS) through the index, "
                                              "or one by its id (offsetMsgId, or msgId with --topic) or its queue offset")
    query.add_argument("--endpoint", default=default_endpoint)
    query.add_argument("--namesrv", help="a cluster's name services (host:port;host:port) instead of --endpoint")
    add_credentials(query)
    query.add_argument("--topic", help="the messages' topic (needed with --key and --queue-offset, and with --msg-id "
                                       "in a cluster)")
    which = query.add_mutually_exclusive_group(required=True)
    which.add_argument("--key", help="every message with this key (a KEYS entry or its msgId)")
    which.add_argument("--msg-id", help="the message with this id: an offsetMsgId, read straight from the "
                                        "CommitLog, or (with --topic) a msgId")
    which.add_argument("--queue-offset", type=values.COUNT, metavar="N", help="the message at offset N of --queue-id's queue")
    query.add_argument("--queue-id", type=values.COUNT, help="with --queue-offset: the queue")
    query.add_argument("--broker", help="with --queue-offset in a cluster: the broker group whose queue it is")
    query.add_argument("--begin", type=values.COUNT, default=0, help="store time from (ms)")
    query.add_argument("--end", type=values.COUNT, default=2**62, help="store time to (ms)")
    query.add_argument("--max", type=values.MOST, default=32, help="the most messages to show (default 32)")
    query.add_argument("--group", type=values.group, help="with --msg-id and --client-id: a consumer group; the message goes to that "
                                       "member's listener now (consumeMessageDirectly), nothing committed or handed back")
    query.add_argument("--client-id", help="with --group: the member (admin consumer-status lists them)")
    query.set_defaults(handler=cmd_query)


def cmd_query(args: argparse.Namespace) -> int:
    from node.client import PullConsumer, SendError
    from node.tools.cli import target

    if args.msg_id is None and args.topic is None:
        raise SettingsError("query --key and --queue-offset need --topic")
    if (args.queue_offset is None) != (args.queue_id is None):
        raise SettingsError("query --queue-offset N and --queue-id Q go together")
    if (args.group is None) != (args.client_id is None) or (args.group and (args.msg_id is None or args.namesrv)):
        raise SettingsError("query --group G --client-id C go together, with --msg-id, of one node (--endpoint)")
    with PullConsumer(**target(args)) as consumer:
        try:
            messages = _find(consumer, args)
        except (SendError, ValueError) as e:
            print(f"mqnode query: {e}", file=sys.stderr)
            return 1
    for message in messages:
        sys.stdout.write(orjson.dumps(message.to_json()).decode() + "\n")
    if not messages:
        print(f"mqnode query: no message {_what(args)}", file=sys.stderr)
        return 1
    return consume_directly(args, messages[0]) if args.group else 0


def consume_directly(args: argparse.Namespace, message) -> int:
    """The message to a member's listener (CONSUME_MESSAGE_DIRECTLY): a line with the member's
    `consumeResult`; exit 0 only for CR_SUCCESS."""
    from node import protocol
    from node.client import Producer, SendError

    with Producer(args.endpoint, retries=0) as client:
        try:
            reply, _ = client.request({"code": protocol.CONSUME_MESSAGE_DIRECTLY, "consumerGroup": args.group,
                                       "clientId": args.client_id, "msgId": message.offset_msg_id})
        except SendError as e:
            reply = {"status": e.status, "remark": e.remark}
    if reply.get("status") != "OK":
        print(f"mqnode query: {reply.get('status')}: {reply.get('remark', '')}", file=sys.stderr)
        return 1
    result = reply["consumeResult"]
    sys.stdout.write(orjson.dumps({"group": args.group, "clientId": args.client_id, "consumeResult": result}).decode()
                     + "\n")
    return 0 if result.get("consumeResult") == "CR_SUCCESS" else 1


def _find(consumer, args: argparse.Namespace) -> list:
    if args.msg_id is not None:
        found = consumer.view(args.msg_id, args.topic)
        return [found] if found is not None else []
    if args.queue_offset is not None:
        pulled = consumer.pull(args.topic, args.queue_id, args.queue_offset, max_count=1,
                               **({"broker": args.broker} if args.broker else {}))
        return [m for m in pulled.messages if m.queue_offset == args.queue_offset]
    return consumer.query(args.topic, args.key, begin=args.begin, end=args.end, max_count=args.max)


def _what(args: argparse.Namespace) -> str:
    if args.msg_id is not None and args.topic is None:  # (a client's msgId is 32 hex digits too: read as an offsetMsgId)
        return f"with offsetMsgId {args.msg_id} (the id a send printed as msgId is found with --topic)"
    if args.msg_id is not None:
        return f"with id {args.msg_id}"
    if args.queue_offset is not None:
        return f"at offset {args.queue_offset} of {args.topic}'s queue {args.queue_id}"
    return f"with key {args.key}"
