"""`scripts/mqnode` for consumer groups (node.tools.cli dispatches here): `consume --push` runs a
member of a group, `consume --pop` pops for one, `admin group --group G` shows its members,
locks, lag and what it has in flight per queue (pop), and `admin consumer-status` what each member
says of itself."""

from __future__ import annotations

import argparse
import sys

import orjson

from shm.settings import SettingsError

INVISIBLE_MS = 60_000  # `consume --pop`'s invisible time unless --invisible-ms says


def consume_push(args: argparse.Namespace) -> int:
    """`consume --push`: a member of the group (node.client.push), printing what its listener
    gets; stops after --count messages, --timeout seconds without one, or SIGTERM/SIGINT."""
    import threading
    import time

    from node.client.push import CONSUME_SUCCESS, RECONSUME_LATER, SUCCESS, SUSPEND_CURRENT_QUEUE_A_MOMENT, PushConsumer
    from node.server.signals import StopSignals

    options = {"message_model": "BROADCASTING" if args.broadcast else "CLUSTERING",
               "consume_from_where": "LAST_OFFSET" if args.start == "last" else "FIRST_OFFSET"}
    if args.from_time is not None:  # (a group with no committed offset, as RocketMQ's CONSUME_FROM_TIMESTAMP)
        options |= {"consume_from_where": "TIMESTAMP", "consume_timestamp": args.from_time}
    if args.threads:
        options |= {"consume_thread_min": args.threads, "consume_thread_max": args.threads}
    for name in ("instance_name", "offset_store_dir"):
        if getattr(args, name):
            options[name] = getattr(args, name)
    lock, done, state = threading.Lock(), threading.Event(), {"printed": 0, "last": time.monotonic()}
    answer, later = (SUCCESS, SUSPEND_CURRENT_QUEUE_A_MOMENT) if args.orderly else (CONSUME_SUCCESS, RECONSUME_LATER)

    def listener(messages) -> str:
        lines = "".join(orjson.dumps(m.to_json()).decode() + "\n" for m in messages)
        with lock:
            over = args.count and state["printed"] >= args.count
            if not over:
                sys.stdout.write(lines)
                sys.stdout.flush()  # printed before it counts as consumed
                state["printed"] += len(messages)
                state["last"] = time.monotonic()
                if args.count and state["printed"] >= args.count:
                    done.set()
        if over:  # (what the consumer had buffered besides: neither printed nor committed, once it stops)
            while not consumer.stopping:
                time.sleep(0.02)
            return later
        return answer

    from node.tools.cli import selection, target

    consumer = PushConsumer(group=args.group, **target(args), **options)
    consumer.subscribe(args.topic, *selection(args))
    consumer.register_listener(listener, orderly=args.orderly)
    stops = StopSignals()  # (not done.set() in a handler: node.server.signals)
    consumer.start()
    try:
        while not stops.wait(0.2) and not done.is_set() and time.monotonic() - state["last"] < args.timeout:
            pass
    finally:
        consumer.shutdown()
    return 0


def consume_pop(args: argparse.Namespace) -> int:
    """`consume --pop`: pops of the group (node.client.pop), one JSON line per message with its
    receiptHandle and reconsumeTimes, each acked once printed unless --no-ack; stops after
    --count messages or --timeout seconds without one."""
    import time

    from node.client import PullConsumer, SendError
    from node.tools.cli import selection, target

    printed, last = 0, time.monotonic()
    expression, expression_type = selection(args)
    with PullConsumer(**target(args)) as consumer:
        try:
            while time.monotonic() - last < args.timeout and not (args.count and printed >= args.count):
                room = min(32, args.count - printed) if args.count else 32
                wait = max(1, int(min(2.0, args.timeout - (time.monotonic() - last)) * 1000))
                messages = consumer.pop(args.topic, args.group, max_count=room, invisible_ms=args.invisible_ms or INVISIBLE_MS,
                                        wait_ms=wait, tags=expression, orderly=args.orderly,
                                        expression_type=expression_type)
                for message in messages:
                    sys.stdout.write(orjson.dumps(message.to_json()).decode() + "\n")
                    sys.stdout.flush()  # printed before it is acked
                    if not args.no_ack:
                        consumer.ack(message)
                printed += len(messages)
                if messages:
                    last = time.monotonic()
        except SendError as e:
            print(f"mqnode consume: {e}", file=sys.stderr)
            return 1
    return 0


def group_view(client, group: str, config: dict | None) -> dict:
    """`admin group --group G`: its config (when it has one), its members with their queues (as
    each last said in its heartbeat), the queue locks of orderly members, and the lag per queue."""
    from node import protocol

    shown = dict(config or {})
    members, _ = client.request({"code": protocol.GET_CONSUMER_CONNECTION_LIST, "consumerGroup": group})
    shown["members"] = [{"clientId": m["clientId"], "consumeType": m["consumeType"], "language": m.get("language", ""),
                         "version": m.get("version", ""), "messageModel": m["messageModel"],
                         "subscriptions": m["subscriptions"], "queues": [f"{q['topic']}@{q['queueId']}" for q in m["queues"]]}
                        for m in members.get("connectionSet", [])]
    shown["locks"] = {f"{lk['topic']}@{lk['queueId']}": lk["clientId"] for lk in members.get("locks", [])}
    stats, _ = client.request({"code": protocol.GET_CONSUME_STATS, "consumerGroup": group})
    lag = {}
    for topic, queues in sorted((stats.get("offsetTable") or {}).items()):
        for queue, offset in sorted(queues.items(), key=lambda item: int(item[0])):
            top, _ = client.request({"code": protocol.GET_MAX_OFFSET, "topic": topic, "queueId": int(queue)})
            lag[f"{topic}@{queue}"] = {"consumerOffset": offset, "brokerOffset": top.get("offset"),
                                       "lag": (top.get("offset") or 0) - offset}
    shown["lag"] = lag
    pops, _ = client.request({"code": protocol.GET_POP_STATE, "consumerGroup": group})
    shown["pop"] = {f"{topic}@{queue}": state for topic, queues in (pops.get("topics") or {}).items()
                    for queue, state in queues.items()}  # (in flight per queue; {} when the pop service is down)
    return shown


def consumer_status(client, args: argparse.Namespace) -> tuple[dict, dict]:
    """`admin consumer-status --group G [--client-id ID] [--stacks]` (mqadmin consumerStatus):
    each member's own running info, which the node asks of it (GET_CONSUMER_RUNNING_INFO); a
    member that does not answer shows the node's status and remark in its place. With
    --client-id, that member's failure is the command's."""
    from node import protocol

    if not args.group:
        raise SettingsError("admin consumer-status needs --group (a consumer group)")
    ids = [args.client_id]
    if not args.client_id:
        members, _ = client.request({"code": protocol.GET_CONSUMER_LIST_BY_GROUP, "consumerGroup": args.group})
        ids = members.get("consumerIdList") or []
        if not ids:
            return {"status": "CONSUMER_NOT_ONLINE", "remark": f"the consumer group {args.group} has no member"}, {}
    shown, reply = {}, {"status": "OK"}
    for client_id in ids:
        asked, _ = client.request({"code": protocol.GET_CONSUMER_RUNNING_INFO, "consumerGroup": args.group,
                                   "clientId": client_id, "jstackEnable": args.stacks})
        if asked.get("status") == "OK":
            shown[client_id] = asked["runningInfo"]
        else:
            shown[client_id] = {"status": asked.get("status"), "remark": asked.get("remark", "")}
            reply = asked if args.client_id else reply
    answered = [info["subscriptionSet"] for info in shown.values() if "subscriptionSet" in info]
    return reply, {"group": args.group, "consumers": shown,
                   "sameSubscription": all(s == answered[0] for s in answered)}


def reset_offsets(client, args: argparse.Namespace) -> tuple[dict, dict]:
    """`admin reset-offset`: each queue of the topic, the group's offset set to the first message
    stored at or after --to-timestamp (PullConsumer.offset_from), or to the queue's first or last
    (as mqadmin resetOffsetByTime does, through the queue requests a client has); then the node
    tells the group's members (RESET_CONSUMER_CLIENT_OFFSET), which start their queues of the
    topic again from there: `membersNotified`; and its pop service starts the group's pop state of
    those queues there (RESET_POP_OFFSET, as RocketMQ 5's server-side reset), dropping what was
    in flight: `popQueuesReset`, `popLeasesDropped`."""
    from node import protocol
    from node.client import PullConsumer
    from node.tools.cli_admin import topic_config

    if not (args.group and args.topic) or (args.to_timestamp is None) == (args.to is None):
        raise SettingsError("admin reset-offset needs --group, --topic and one of --to-timestamp MS or --to first|last")
    table, config = topic_config(client, args.topic)
    if config is None:
        return table, {}
    shown = {}
    with PullConsumer(client.inner.endpoint, timeout=client.inner.timeout) as consumer:
        for queue in range(config["readQueueNums"]):
            if args.to_timestamp is not None:
                offset = consumer.offset_from(args.topic, queue, args.to_timestamp)
            elif args.to == "first":
                offset = consumer.min_offset(args.topic, queue)
            else:
                offset = consumer.max_offset(args.topic, queue)
            consumer.commit(args.group, args.topic, queue, offset)
            shown[str(queue)] = offset
    told, _ = client.request({"code": protocol.RESET_CONSUMER_CLIENT_OFFSET, "consumerGroup": args.group,
                              "topic": args.topic, "offsetTable": shown})
    if told.get("status") != "OK":
        return told, {args.topic: shown}
    popped, _ = client.request({"code": protocol.RESET_POP_OFFSET, "consumerGroup": args.group,
                                "topic": args.topic, "offsetTable": shown})
    if popped.get("status") != "OK":
        return popped, {args.topic: shown, "membersNotified": told["notified"]}
    return table, {args.topic: shown, "membersNotified": told["notified"], "popQueuesReset": popped["queues"],
                   "popLeasesDropped": popped["leasesDropped"]}
