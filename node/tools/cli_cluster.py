"""`mqnode cluster up|down|status` and the cluster's admin views: `admin cluster`, and with
--namesrv, `admin topic` (each group's queues) and `admin topics` of the whole cluster, and every
other `admin` command (`role` excepted) on every group's master, as mqadmin's `-c Cluster` does."""

from __future__ import annotations

import argparse
import sys

import orjson

from node import protocol


def add_parser(commands) -> None:
    cluster = commands.add_parser("cluster", help="a cluster of nodes on Ray: up (start every part and serve), down, "
                                                  "status (every group, its master and slaves, offsets, lag, health)")
    cluster.add_argument("action", choices=["up", "down", "status"])
    cluster.add_argument("--conf", required=True, help="the cluster's toml (docs/operations.md \"A cluster\")")
    cluster.add_argument("--ray-address", help="up: join this Ray cluster instead of starting an embedded Ray")
    cluster.set_defaults(handler=cmd_cluster)


def cmd_cluster(args: argparse.Namespace) -> int:
    from node.server import cluster

    conf = cluster.load(args.conf)
    if args.action == "up":
        from node.server import logs
        from node.server.ray_worker import defer

        defer()  # (as `start`)
        _, out = logs.own_stdout("cluster")  # (Ray's driver prints its raylets' news on stdout)
        return cluster.run_up(conf, args.ray_address, out=out)
    if args.action == "down":
        return cluster.run_down(conf)
    try:
        status = cluster_status(conf.namesrv_addr)
    except TimeoutError as e:
        print(f"mqnode cluster status: no name service of {conf.namesrv_addr} answered ({e})", file=sys.stderr)
        return 1
    print(orjson.dumps(status, option=orjson.OPT_INDENT_2).decode())
    return 0


class Names:
    """Blocking requests to a cluster's name services (the first that answers)."""

    def __init__(self, namesrv: str, timeout: float = 5.0):
        from node.security import Credentials
        from node.server.asker import NodeAsker

        self.askers = [NodeAsker(e, Credentials(), timeout_ms=int(timeout * 1000))
                       for e in protocol.namesrv_endpoints(namesrv)]
        if not self.askers:
            raise SystemExit(f"--namesrv {namesrv!r} names no name service")

    def ask(self, header: dict) -> dict:
        error = None
        for asker in self.askers:
            try:
                return asker.ask(header)
            except TimeoutError as e:
                error = e
        raise error

    def close(self) -> None:
        for asker in self.askers:
            asker.close()


def cluster_status(namesrv: str) -> dict:
    """Every group: its addresses by brokerId, and per address the role, written offset, lag
    (bytes behind its master), what the name service last heard and whether the node answers."""
    import time

    from node.client import Producer, SendError

    names = Names(namesrv)
    try:
        info = names.ask({"code": protocol.GET_BROKER_CLUSTER_INFO})
    finally:
        names.close()
    live, now = info.get("brokerLiveTable", {}), int(time.time() * 1000)
    groups = {}
    for name, group in info.get("brokerAddrTable", {}).items():
        members, master_offset = {}, None
        for broker_id, address in sorted(group["brokerAddrs"].items(), key=lambda kv: int(kv[0])):
            seen = live.get(address, {})
            member = {"address": address, "role": seen.get("role"), "registeredMsAgo": now - seen.get("lastUpdateTimestamp", now)}
            try:
                with Producer(protocol.broker_endpoint(address), timeout=2.0, retries=0) as client:
                    reply, _ = client.request({"code": protocol.GET_BROKER_HA_STATUS})
                member |= {"health": _health(reply), "role": reply.get("role", member["role"]),
                           "writtenOffset": reply.get("written"), "epoch": reply.get("epoch")}
                if "follower" in reply and reply.get("role") == "SLAVE":  # (a promoted one's follows nothing now)
                    member["follows"] = reply["follower"].get("master")
            except SendError as e:
                member["health"] = f"no answer ({e.status})"
            if broker_id == "0":
                master_offset = member.get("writtenOffset")
            members[broker_id] = member
        for broker_id, member in members.items():
            if broker_id != "0" and master_offset is not None and member.get("writtenOffset") is not None:
                member["lagBytes"] = max(0, master_offset - member["writtenOffset"])
        groups[name] = {"cluster": group["cluster"], "brokers": members}
    return {"clusters": info.get("clusterAddrTable", {}), "groups": groups}


def _health(reply: dict) -> str:
    """"ok", or what is wrong: the node's status, or a slave's link to its master down (a slave
    that follows nothing is not a copy, whatever its offsets say)."""
    if reply.get("status") != "OK":
        return reply.get("status")
    follower = reply.get("follower")  # (a promoted slave's stays in its answer, following nothing)
    if reply.get("role") == "SLAVE" and follower is not None and not follower.get("connected"):
        why = follower.get("diverged") or follower.get("lastError") or "no link yet"
        return f"not following {follower.get('master')}: {why}"
    return "ok"


def admin_cluster(args: argparse.Namespace):
    """`admin cluster --namesrv`: cluster_status."""
    return None, cluster_status(args.namesrv)


def topics_of_cluster(args: argparse.Namespace):
    """`admin topics --namesrv`: every topic the name service knows, with each group's queues."""
    names = Names(args.namesrv, args.timeout or 5.0)
    try:
        listed = names.ask({"code": protocol.GET_ALL_TOPIC_LIST_FROM_NAMESERVER})
        out = {}
        for topic in listed.get("topicList", []):
            route = names.ask({"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": topic})
            out[topic] = {q["brokerName"]: {k: q[k] for k in ("readQueueNums", "writeQueueNums", "perm")}
                          for q in route.get("queueDatas", [])}
    finally:
        names.close()
    return listed, out


def topic_of_cluster(args: argparse.Namespace):
    """`admin topic --namesrv --topic T`: the name services' route of T and, per group, each read
    queue's status as the node that serves its reads gives it (its master, else a slave)."""
    from node.client import Producer, SendError
    from node.client.routes import TopicRoute
    from node.tools.cli_admin import queue_status
    from shm.settings import SettingsError

    if not args.topic:
        raise SettingsError("admin topic needs --topic")
    names = Names(args.namesrv, args.timeout or 5.0)
    try:
        reply = names.ask({"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": args.topic})
    finally:
        names.close()
    if reply.get("status") != "OK":
        return reply, {}
    route, shown = TopicRoute(args.topic, reply), {}
    for queues in sorted(reply.get("queueDatas", []), key=lambda q: q["brokerName"]):
        name, endpoint = queues["brokerName"], route.reader(queues["brokerName"])
        shown[name] = {k: queues[k] for k in ("readQueueNums", "writeQueueNums", "perm")}
        shown[name]["brokerAddrs"] = {str(i): address for i, address in route.addresses.get(name, {}).items()}
        try:
            if endpoint is None:
                raise SendError("SERVICE_NOT_AVAILABLE", "the group has no address")
            with Producer(endpoint, timeout=args.timeout or 5.0, retries=0) as client:
                shown[name]["queues"] = queue_status(client, args.topic, queues["readQueueNums"])
        except SendError as e:
            shown[name]["queues"] = {"status": e.status, "remark": str(e)}
    return reply, shown


def masters(namesrv: str, timeout: float = 5.0) -> dict[str, str | None]:
    """brokerName -> its master's address (None: the group has none now), as the name services know them."""
    names = Names(namesrv, timeout)
    try:
        info = names.ask({"code": protocol.GET_BROKER_CLUSTER_INFO})
    finally:
        names.close()
    return {name: group["brokerAddrs"].get("0") for name, group in sorted(info.get("brokerAddrTable", {}).items())}


def update_topic_everywhere(args: argparse.Namespace, header: dict):
    """`admin topic create|update --namesrv`: UPDATE_AND_CREATE_TOPIC on every group's master
    (RocketMQ's `updateTopic -c Cluster`); each registers the topic within a second."""
    def change(client):
        reply, _ = client.request(header)
        return reply, {"status": reply.get("status"), **({"remark": reply["remark"]} if "remark" in reply else {})}
    return on_every_master(args, change)


# what a master answers for a name it never had: a delete or view across the cluster is done when
# the groups that have it did it
ABSENT = frozenset({"TOPIC_NOT_EXIST", "SUBSCRIPTION_GROUP_NOT_EXIST"})


def on_every_master(args: argparse.Namespace, ask) -> tuple[dict, dict]:
    """`ask(client)` -> (reply, shown) on every group's master (RocketMQ's mqadmin `-c Cluster`):
    (OK when each master answered OK, or said it has no such topic or group while another did
    it; SYSTEM_ERROR otherwise, {brokerName: what it showed, or its status and remark})."""
    from node.client import Producer, SendError

    results, statuses = {}, []
    for name, master in masters(args.namesrv, args.timeout or 5.0).items():
        try:
            if master is None:
                raise SendError("SERVICE_NOT_AVAILABLE", "the group has no master")
            with Producer(protocol.broker_endpoint(master), timeout=args.timeout or 5.0, retries=0) as client:
                reply, shown = ask(client)
            status = reply.get("status")
            results[name] = shown if status in ("OK", "QUERY_NOT_FOUND") else {"status": status, "remark": reply.get("remark", "")}
        except SendError as e:
            status, results[name] = e.status, {"status": e.status, "remark": e.remark}
        statuses.append("OK" if status == "QUERY_NOT_FOUND" else status)
    if not results:
        print("mqnode admin: the name service knows no broker group", file=sys.stderr)
    done = "OK" in statuses and all(status == "OK" or status in ABSENT for status in statuses)
    return {"status": "OK" if done else "SYSTEM_ERROR"}, results


def admin(args: argparse.Namespace) -> int:
    try:
        return _admin(args)
    except TimeoutError as e:
        print(f"mqnode admin: no name service of {args.namesrv} answered ({e})", file=sys.stderr)
        return 1


def _admin(args: argparse.Namespace) -> int:
    """`admin cluster`, `admin topics`, `admin topic` through the name services; any other `admin`
    command on every group's master (`role` excepted: it promotes one node)."""
    from node.tools.cli_admin import _given, ask_node
    from shm.settings import SettingsError

    if not args.namesrv:
        raise SettingsError("admin cluster needs --namesrv")
    if args.what == "cluster":
        reply, shown = admin_cluster(args)
    elif args.what == "topics":
        reply, shown = topics_of_cluster(args)
    elif args.what == "topic" and not args.action:
        reply, shown = topic_of_cluster(args)
    elif args.what == "topic" and args.action in ("create", "update"):
        if not args.topic:
            raise SettingsError(f"admin topic {args.action} needs --topic")
        reply, shown = update_topic_everywhere(args, _given(
            {"code": protocol.UPDATE_AND_CREATE_TOPIC, "topic": args.topic}, readQueueNums=args.read_queues or args.queues,
            writeQueueNums=args.write_queues or args.queues, perm=args.perm))
    elif args.what == "role":
        raise SettingsError("admin role promotes one node: --endpoint, not --namesrv")
    else:
        reply, shown = on_every_master(args, lambda client: ask_node(client, args))
    sys.stdout.write(orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0 if reply is None or reply.get("status") == "OK" else 1
