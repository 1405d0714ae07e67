"""`mqnode admin`: a running node's figures and tables, and the changes an operator makes to
them (RocketMQ's mqadmin requests); a cluster's view goes to node.tools.cli_cluster, replication
to node.tools.cli_ha, groups' offsets to node.tools.cli_groups, transactions to
node.tools.cli_transactions."""

from __future__ import annotations

import argparse
import sys

import orjson

from shm.settings import SettingsError


def cmd_admin(args: argparse.Namespace) -> int:
    from node.client import Producer, SendError

    # a manual clean takes up to 20 passes of 10 files with a pause between files
    timeout = args.timeout = args.timeout if args.timeout is not None else 120.0 if args.what == "clean" else 5.0
    if args.namesrv or args.what == "cluster":
        from node.tools.cli_cluster import admin

        return admin(args)
    with Producer(args.endpoint, timeout=timeout, retries=0) as client:
        try:
            reply, shown = ask_node(client, args)
        except SendError as e:
            print(f"mqnode admin: {e}", file=sys.stderr)
            return 1
    if reply.get("status") not in ("OK", "QUERY_NOT_FOUND"):
        print(f"mqnode admin: {reply.get('status')}: {reply.get('remark', '')}", file=sys.stderr)
        return 1
    sys.stdout.write(orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0


def ask_node(client, args: argparse.Namespace) -> tuple[dict, object]:
    """`admin <what>` of one node: (the reply whose status decides the exit, what is shown)."""
    from node.protocol import (
        DELETE_EXPIRED_COMMITLOG,
        GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
        GET_ALL_TOPIC_CONFIG,
        GET_BROKER_RUNTIME_INFO,
        GET_PRODUCER_CONNECTION_LIST,
    )
    from node.tools.cli_groups import consumer_status, group_view, reset_offsets
    from node.tools.cli_ha import admin_ha

    if args.what == "stats":
        reply, _ = client.request({"code": GET_BROKER_RUNTIME_INFO})
        return reply, {key: reply.get(key) for key in ("runtime", "services", "actors", "supervision", "control")}
    if args.what == "delays":
        reply, _ = client.request({"code": GET_BROKER_RUNTIME_INFO})
        schedule = (reply.get("actors") or {}).get("schedule") or {}
        return reply, {key: schedule.get(key) for key in ("levels", "timers", "sendBacks", "deadLetters", "waiting")}
    if args.what == "transactions":
        from node.tools.cli_transactions import admin_transactions
        return admin_transactions(client, args)
    if args.what in ("ha", "role"):
        return admin_ha(client, args)
    if args.what == "clean":
        reply, _ = client.request({"code": DELETE_EXPIRED_COMMITLOG, "force": args.force})
        return reply, {key: reply.get(key) for key in ("count", "bytes", "stopped", "deleted")}
    if args.what in ("topic", "group") and args.action:
        return _admin_change(client, args)
    if args.what == "group":
        reply, _ = client.request({"code": GET_ALL_SUBSCRIPTIONGROUP_CONFIG})
        table = reply.get("subscriptionGroupTable") or {}
        shown = group_view(client, args.group, table.get(args.group)) if args.group else table
        if args.group and args.group not in table and not any(shown.values()):  # (no config, no state)
            reply = {"status": "SUBSCRIPTION_GROUP_NOT_EXIST",
                     "remark": f"group {args.group} has no config, member, committed offset or pop"}
        return reply, shown
    if args.what == "reset-offset":
        return reset_offsets(client, args)
    if args.what == "consumer-status":  # mqadmin consumerStatus
        return consumer_status(client, args)
    if args.what == "groups":
        reply, _ = client.request({"code": GET_ALL_SUBSCRIPTIONGROUP_CONFIG})
        return reply, reply.get("subscriptionGroupTable")
    if args.what == "topics":
        reply, _ = client.request({"code": GET_ALL_TOPIC_CONFIG})
        return reply, reply.get("topicConfigTable")
    if args.what == "offsets":
        return _admin_offsets(client, args)
    if args.what == "config":
        return broker_config(client, args)
    if args.what == "producers":  # mqadmin producerConnection
        if not args.group:
            raise SettingsError("admin producers needs --group (a producer group)")
        reply, _ = client.request({"code": GET_PRODUCER_CONNECTION_LIST, "producerGroup": args.group})
        return reply, {"group": args.group, "connectionSet": reply.get("connectionSet", [])}
    return topic_view(client, args.topic)


def broker_config(client, args: argparse.Namespace) -> tuple[dict, dict]:
    """`admin config`: every setting of the node as it runs (mqadmin getBrokerConfig); `admin config
    update --set brokerPermission=4`: the one that changes while it runs (updateBrokerConfig)."""
    from node.protocol import GET_BROKER_CONFIG, UPDATE_BROKER_CONFIG

    if args.action not in (None, "update") or bool(args.set) != (args.action == "update"):
        raise SettingsError("admin config shows the settings; admin config update --set KEY=VALUE changes one")
    if args.action == "update":
        reply, _ = client.request({"code": UPDATE_BROKER_CONFIG}, "".join(f"{item}\n" for item in args.set).encode())
        return reply, {k: v for k, v in reply.items() if k not in ("code", "opaque")}
    reply, body = client.request({"code": GET_BROKER_CONFIG})
    lines = (body or b"").decode().splitlines()
    return reply, dict(line.split("=", 1) for line in lines if "=" in line)


def topic_view(client, topic: str | None) -> tuple[dict, dict]:
    """`admin topic --topic T`: its route and each read queue's status (queue_status). A topic the
    node does not have is an error: looking at a topic does not create it, as a route request
    does under autoCreateTopicEnable."""
    from node.protocol import GET_ROUTEINFO_BY_TOPIC

    if not topic:
        raise SettingsError("admin topic needs --topic")
    refused, config = topic_config(client, topic)
    if config is None:
        return refused, {}
    reply, _ = client.request({"code": GET_ROUTEINFO_BY_TOPIC, "topic": topic})
    shown = {k: v for k, v in reply.items() if k not in ("code", "opaque")}
    if reply.get("status") == "OK":
        shown["queues"] = queue_status(client, topic, config["readQueueNums"])
    return reply, shown


def topic_config(client, topic: str) -> tuple[dict, dict | None]:
    """(reply, the topic's config), or (TOPIC_NOT_EXIST's reply, None): an admin view or change of
    a topic asks the table, never a route, which creates the topic under autoCreateTopicEnable."""
    from node.protocol import GET_ALL_TOPIC_CONFIG

    table, _ = client.request({"code": GET_ALL_TOPIC_CONFIG})
    config = (table.get("topicConfigTable") or {}).get(topic)
    if config is None and table.get("status") == "OK":
        return {"status": "TOPIC_NOT_EXIST", "remark": f"topic {topic} does not exist"}, None
    return table, config


def queue_status(client, topic: str, count: int) -> dict:
    """Per queue of `topic` at the node `client` asks: its min and max offsets and the store time of
    its last message, 0 when it has none (mqadmin topicStatus; RocketMQ's TopicOffset)."""
    from node.client.received import decode_messages
    from node.protocol import GET_MAX_OFFSET, GET_MIN_OFFSET, PULL_MESSAGE

    status = {}
    for queue_id in range(count):
        queue = {"topic": topic, "queueId": queue_id}
        low, _ = client.request({"code": GET_MIN_OFFSET, **queue})
        high, _ = client.request({"code": GET_MAX_OFFSET, **queue})
        last = 0
        if high.get("offset", 0) > 0:
            pulled, body = client.request({"code": PULL_MESSAGE, **queue, "queueOffset": high["offset"] - 1,
                                           "maxMsgNums": 1})
            last = decode_messages(body)[-1].store_timestamp if pulled.get("status") == "FOUND" and body else 0
        status[str(queue_id)] = {"minOffset": low.get("offset"), "maxOffset": high.get("offset"),
                                 "lastUpdateTimestamp": last}
    return status


def _admin_offsets(client, args: argparse.Namespace) -> tuple[dict, dict]:
    """`admin offsets --group G [--topic T]`: each queue's committed offset, the queue's end, the lag."""
    from node.protocol import GET_CONSUME_STATS, GET_MAX_OFFSET

    if not args.group:
        raise SettingsError("admin offsets needs --group")
    reply, _ = client.request({"code": GET_CONSUME_STATS, "consumerGroup": args.group})
    shown: dict = {}
    for topic, queues in (reply.get("offsetTable") or {}).items():
        if args.topic and topic != args.topic:
            continue
        for queue, offset in sorted(queues.items(), key=lambda item: int(item[0])):
            top, _ = client.request({"code": GET_MAX_OFFSET, "topic": topic, "queueId": int(queue)})
            shown.setdefault(topic, {})[queue] = {"consumerOffset": offset, "brokerOffset": top.get("offset"),
                                                  "lag": (top.get("offset") or 0) - offset}
    return reply, shown


def _admin_change(client, args: argparse.Namespace) -> tuple[dict, object]:
    """`admin topic|group create|update|delete`: RocketMQ's requests for mqadmin updateTopic,
    deleteTopic, updateSubGroup and deleteSubGroup."""
    from node import protocol

    if args.what == "topic":
        name, key, delete, update, answer = (args.topic, "topic", protocol.DELETE_TOPIC_IN_BROKER,
                                              protocol.UPDATE_AND_CREATE_TOPIC, "topicConfig")
        fields = dict(readQueueNums=args.read_queues or args.queues, writeQueueNums=args.write_queues or args.queues,
                      perm=args.perm)
    else:
        name, key, delete, update, answer = (args.group, "groupName", protocol.DELETE_SUBSCRIPTIONGROUP,
                                              protocol.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, "subscriptionGroupConfig")
        fields = dict(retryQueueNums=args.retry_queues, retryMaxTimes=args.max_retries,
                      whichBrokerWhenConsumeSlowly=args.which_broker_when_slow, consumeEnable=args.consume_enable,
                      consumeBroadcastEnable=args.broadcast, consumeMessageOrderly=args.orderly_group,
                      groupRetryPolicy=args.retry_policy)
    if not name:
        raise SettingsError(f"admin {args.what} {args.action} needs --{args.what}")
    if args.action == "delete":
        reply, _ = client.request({"code": delete, key: name})
        if args.what == "group" and reply.get("code") == 0:
            return _delete_group_topics(client, name)
        return reply, {"deleted": name}
    reply, _ = client.request(_given({"code": update, key: name}, **fields))
    return reply, reply.get(answer)


def _delete_group_topics(client, group: str) -> tuple[dict, dict]:
    """mqadmin deleteSubGroup's second half: the group's `%RETRY%` and `%DLQ%` topics go too (their
    messages with them: a group made again under the name starts without them). (The reply that
    decides the exit: the first refusal but TOPIC_NOT_EXIST, what is shown.)"""
    from node import protocol

    shown: dict = {"deleted": group, "topicsDeleted": []}
    for topic in (f"%RETRY%{group}", f"%DLQ%{group}"):
        reply, _ = client.request({"code": protocol.DELETE_TOPIC_IN_BROKER, "topic": topic})
        if reply.get("code") == 0:
            shown["topicsDeleted"].append(topic)
        elif reply.get("code") != protocol.TOPIC_NOT_EXIST:
            return reply, shown | {"notDeleted": topic}
    return {"code": 0, "status": "OK"}, shown


def _given(header: dict, **fields) -> dict:
    """`header` with the fields the command line gave (left out: the node keeps the value)."""
    return header | {name: value for name, value in fields.items() if value is not None}
