"""The node's side of consumer groups (RocketMQ's ConsumerManager and RebalanceLockManager): who
is in each group, what they subscribe, and which queues orderly consumers hold locked. No socket,
no clock: the front (its shell) passes `now` (monotonic ms) and sends NOTIFY_CONSUMER_IDS_CHANGED
to the members of the groups a call says changed.

Members are clients that sent HEART_BEAT with the group in `consumerDataSet`; each is known by
its `clientID` and reached through the routing id of the DEALER it last spoke from. A member whose
connection closes (the process ended, killed or not: the kernel closes its sockets) is dropped
then (`disconnected`, as RocketMQ's broker drops a member when its channel closes), so its
queues move at once; a member silent for `clientChannelExpiredTimeout` ms (a machine cut off, a
process hung) is dropped then (`expire`). Nothing here is persisted: a
restarted front learns its groups again from the members' next heartbeats (mqnode's at once, as
their connection comes back; RocketMQ's every 30 s), as a restarted RocketMQ broker does; until
then a member sees an empty list and keeps its queues.

Locks (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ): per group, a queue (topic, queueId) is held by one
client; a lock its holder does not renew within `rebalanceLockMaxLiveTime` ms expires, and a
lock asked for by another client is granted only then.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from actors.connections import ByConnection
from node import protocol

MAX_GROUPS_PER_CLIENT = 64  # (bounds what one heartbeat can make the node hold)
MAX_MEMBERS = 10_000  # members over all groups: a heartbeat beyond it is refused


@dataclass
class Member:
    client_id: str
    routing_id: bytes
    last_seen: int  # monotonic ms
    message_model: str = "CLUSTERING"
    consume_type: str = "CONSUME_PASSIVELY"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    subscriptions: dict[str, str] = field(default_factory=dict)  # topic -> expression
    queues: list[tuple[str, int]] = field(default_factory=list)  # what it says it consumes (mqnode)
    language: str = ""  # (as its heartbeat says: a gRPC client's, through the proxy)
    version: str = ""
    connection: int = -1  # the connection it last heartbeated on (the front's fd of it; -1: unknown)

    def to_json(self) -> dict:
        return {"clientId": self.client_id, "language": self.language, "version": self.version,
                "lastUpdateTimestamp": self.last_seen, "messageModel": self.message_model,
                "consumeType": self.consume_type, "consumeFromWhere": self.consume_from_where,
                "subscriptions": dict(sorted(self.subscriptions.items())),
                "queues": [{"topic": t, "queueId": q} for t, q in self.queues]}


class ConsumerGroups:
    def __init__(self, channel_expired_ms: int, lock_max_live_ms: int):
        self.channel_expired_ms = channel_expired_ms
        self.lock_max_live_ms = lock_max_live_ms
        self.groups: dict[str, dict[str, Member]] = {}  # group -> clientID -> Member
        self.on_connection = ByConnection()  # its members by the connection they heartbeated on
        self.locks: dict[str, dict[tuple[str, int], tuple[str, int]]] = {}  # group -> queue -> (client, at)
        self.expired = self.disconnected_count = self.notifications = 0

    # -- membership ---------------------------------------------------------------------------------

    def heartbeat(self, client_id: str, routing_id: bytes, consumers: list[dict], now: int,
                  language: str = "", version: str = "", connection: int = -1) -> set[str]:
        """A HEART_BEAT's consumer data (already checked at the edge) -> the groups whose members
        or subscriptions changed (their members are to be notified)."""
        changed = set()
        for data in consumers[:MAX_GROUPS_PER_CLIENT]:
            group = data["groupName"]
            members = self.groups.setdefault(group, {})
            old = members.get(client_id)
            subscriptions = {s["topic"]: s.get("subString", "*") for s in data.get("subscriptionDataSet") or []}
            member = Member(client_id, routing_id, now, data.get("messageModel", "CLUSTERING"),
                            data.get("consumeType", "CONSUME_PASSIVELY"),
                            data.get("consumeFromWhere", "CONSUME_FROM_LAST_OFFSET"), subscriptions,
                            [(q["topic"], q["queueId"]) for q in data.get("queues") or []], language, version,
                            connection)
            if old is None or old.subscriptions != subscriptions:
                changed.add(group)
            self.on_connection.put((group, client_id), connection, old.connection if old is not None else None)
            members[client_id] = member
        return changed

    def unregister(self, client_id: str, group: str) -> set[str]:
        members = self.groups.get(group)
        member = members.pop(client_id, None) if members else None
        if member is None:
            return set()
        self.on_connection.drop((group, client_id), member.connection)
        self._release_locks(group, client_id)
        if not members:
            del self.groups[group]
        return {group}

    def expire(self, now: int) -> set[str]:
        """Drop members silent for longer than `channel_expired_ms`; the groups that lost one."""
        changed = set()
        for group, members in list(self.groups.items()):
            for client_id, member in list(members.items()):
                if now - member.last_seen > self.channel_expired_ms:
                    self.expired += 1
                    changed |= self.unregister(client_id, group)
        return changed

    def disconnected(self, connection: int) -> set[str]:
        """The connection (its fd) closed: its members leave; the groups that lost one. (By an
        index: a storm of closing connections under thousands of members scanned them all each.)"""
        changed = set()
        for group, client_id in self.on_connection.take(connection):
            self.disconnected_count += 1
            changed |= self.unregister(client_id, group)
        return changed


    def member_count(self) -> int:
        return sum(len(m) for m in self.groups.values())

    def client_ids(self, group: str) -> list[str]:
        return sorted(self.groups.get(group, {}))

    def members(self, group: str) -> list[Member]:
        return [self.groups[group][c] for c in self.client_ids(group)]

    def member(self, group: str, client_id: str) -> Member | None:
        return self.groups.get(group, {}).get(client_id)

    def routing_ids(self, groups: set[str]) -> list[tuple[str, bytes]]:
        """(group, routing id) of every member of `groups`: where NOTIFY_CONSUMER_IDS_CHANGED goes
        (once per connection: the gRPC proxy's carries all of its clients)."""
        out = list(dict.fromkeys((g, m.routing_id) for g in sorted(groups) for m in self.members(g)))
        self.notifications += len(out)
        return out

    def subscribers(self, topic: str) -> set[str]:
        """Groups with a member that subscribes `topic` (to notify when its queues change)."""
        return {g for g, members in self.groups.items() if any(topic in m.subscriptions for m in members.values())}

    # -- locks --------------------------------------------------------------------------------------

    def lock(self, group: str, client_id: str, queues: list[tuple[str, int]], now: int) -> list[tuple[str, int]]:
        """Lock (or renew) what is free, expired or already this client's; the queues it holds."""
        table = self.locks.setdefault(group, {})
        held = []
        for queue in queues:
            owner = table.get(queue)
            if owner is None or owner[0] == client_id or now - owner[1] > self.lock_max_live_ms:
                table[queue] = (client_id, now)
                held.append(queue)
        return held

    def unlock(self, group: str, client_id: str, queues: list[tuple[str, int]]) -> None:
        table = self.locks.get(group, {})
        for queue in queues:
            if table.get(queue, ("",))[0] == client_id:
                del table[queue]

    def _release_locks(self, group: str, client_id: str) -> None:
        table = self.locks.get(group, {})
        for queue in [q for q, (owner, _) in table.items() if owner == client_id]:
            del table[queue]

    def held_locks(self, group: str, now: int) -> dict[tuple[str, int], str]:
        return {q: owner for q, (owner, at) in sorted(self.locks.get(group, {}).items())
                if now - at <= self.lock_max_live_ms}

    def statistics(self) -> dict:
        return {"groups": len(self.groups), "members": self.member_count(), "expired": self.expired,
                "disconnected": self.disconnected_count, "notifications": self.notifications,
                "locks": sum(len(t) for t in self.locks.values())}


def notice(group: str) -> bytes:
    """NOTIFY_CONSUMER_IDS_CHANGED's frame: no opaque, no reply wanted."""
    return orjson.dumps({"code": protocol.NOTIFY_CONSUMER_IDS_CHANGED, "consumerGroup": group})


def answer(groups: ConsumerGroups, header: dict, routing_id: bytes, now: int,
           connection: int = -1) -> tuple[dict, set[str]]:
    """A consumer-group request (its fields checked at the edge) -> (reply header, groups whose
    members are to be notified). `connection`: the one it came on (a heartbeat's members are
    dropped when it closes)."""
    code, opaque = header["code"], header.get("opaque")
    if code == protocol.HEART_BEAT:
        consumers = header.get("consumerDataSet") or []
        if groups.member_count() >= MAX_MEMBERS and not any(
                header["clientID"] in groups.groups.get(c["groupName"], {}) for c in consumers):
            return protocol.reply_header(opaque, "SYSTEM_BUSY", f"the node holds {MAX_MEMBERS} members already"), set()
        changed = groups.heartbeat(header["clientID"], routing_id, consumers, now, header.get("language", ""),
                                   header.get("version", ""), connection)
        return protocol.reply_header(opaque, "OK", clientChannelExpiredTimeout=groups.channel_expired_ms), changed
    group = header.get("consumerGroup")
    if code == protocol.UNREGISTER_CLIENT:  # (a producer's names its producerGroup only: the front's)
        return protocol.reply_header(opaque, "OK"), groups.unregister(header["clientID"], group) if group else set()
    if code == protocol.GET_CONSUMER_LIST_BY_GROUP:
        return protocol.reply_header(opaque, "OK", consumerIdList=groups.client_ids(group)), set()
    queues = [(q["topic"], q["queueId"]) for q in header.get("mqSet") or []]
    if code == protocol.LOCK_BATCH_MQ:
        held = groups.lock(group, header["clientID"], queues, now)
        return protocol.reply_header(opaque, "OK", lockOKMQSet=[{"topic": t, "queueId": q} for t, q in held],
                                     lockMaxLiveTime=groups.lock_max_live_ms), set()
    if code == protocol.UNLOCK_BATCH_MQ:
        groups.unlock(group, header["clientID"], queues)
        return protocol.reply_header(opaque, "OK"), set()
    members = groups.members(group)  # GET_CONSUMER_CONNECTION_LIST
    if not members:
        return protocol.reply_header(opaque, "CONSUMER_NOT_ONLINE", f"the consumer group {group} has no member"), set()
    locks = [{"topic": t, "queueId": q, "clientId": owner} for (t, q), owner in groups.held_locks(group, now).items()]
    return protocol.reply_header(opaque, "OK", connectionSet=[m.to_json() for m in members], locks=locks), set()
