"""What the gRPC proxy remembers between calls, without I/O: the clients that spoke to it
(`Clients`, for `admin stats` and their Telemetry streams) and the messages it keeps invisible
for push consumers (`Renewals`, RocketMQ 5's auto_renew). The shell (actors.proxy.shell) feeds
both with the clock's time and acts on what `Renewals.due` says."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from actors.proxy.apis import definition_pb2 as pb
from actors.proxy.core import name_of

CLIENT_EXPIRY_S = 120.0  # a client silent this long is forgotten (clientChannelExpiredTimeout)
MAX_CLIENTS = 100_000  # clients remembered at once; past it the longest silent go first


def wall_ms() -> int:
    """The renewals' clock: the node's deadlines are wall-clock (docs/protocol.md "Pop")."""
    return time.time_ns() // 1_000_000


MAX_RENEWALS = 200_000  # handles renewed at once; past it a receive's messages are not renewed


@dataclass
class Renewal:
    group: str
    account: str | None
    client_id: str
    handle: str  # the latest: what the node takes now
    visible_at_ms: int
    received_ms: int


class Renewals:
    """The handles the proxy keeps invisible for push consumers, by the handle the client got.
    `due` says which to renew now; `renewed` records the node's new handle; `current` maps what a
    client acks or changes to the latest; `forget` ends one (acked, changed by the client, or
    past renewMaxTimeMillis); `forget_client` all of a client's (it said it terminated).
    `in_flight` holds the handles whose renewal is on its way to the node: an ack or change of
    one waits for its answer (the node takes only the latest handle, which that answer names)."""

    def __init__(self, ahead_ms: int, max_ms: int):
        self.ahead_ms, self.max_ms = ahead_ms, max_ms
        self.by_handle: dict[str, Renewal] = {}
        self.in_flight: set[str] = set()  # (the client's handles, as by_handle's keys)
        self.renewed_count = self.expired = self.refused = 0

    def add(self, handle: str, group: str, account: str | None, client_id: str, visible_at_ms: int,
            now_ms: int) -> bool:
        if len(self.by_handle) >= MAX_RENEWALS:
            self.refused += 1
            return False
        self.by_handle[handle] = Renewal(group, account, client_id, handle, visible_at_ms, now_ms)
        return True

    def due(self, now_ms: int, alive=lambda client_id: True) -> list[tuple[str, Renewal]]:
        """(the client's handle, its renewal) for each to renew now; those held renewMaxTimeMillis,
        and those of a client no longer `alive` (gone silent: killed, or lost its network), are let
        go: their time runs out and they come back, as RocketMQ 5's proxy lets them (a dead push
        consumer costs its messages' invisible time, not renewMaxTimeMillis)."""
        out = []
        for original, renewal in list(self.by_handle.items()):
            if renewal.visible_at_ms - now_ms > self.ahead_ms:
                continue
            if now_ms - renewal.received_ms >= self.max_ms or renewal.visible_at_ms <= now_ms or \
                    not alive(renewal.client_id):
                del self.by_handle[original]  # (held long enough, already visible, or nobody to hand it to)
                self.expired += 1
                continue
            out.append((original, renewal))
        return out

    def renewed(self, original: str, handle: str, visible_at_ms: int) -> None:
        renewal = self.by_handle.get(original)
        if renewal is not None:
            renewal.handle, renewal.visible_at_ms = handle, visible_at_ms
            self.renewed_count += 1

    def current(self, handle: str) -> str:
        renewal = self.by_handle.get(handle)
        return handle if renewal is None else renewal.handle

    def forget(self, handle: str) -> None:
        self.by_handle.pop(handle, None)

    def forget_client(self, client_id: str) -> int:
        gone = [h for h, r in self.by_handle.items() if r.client_id == client_id]
        for handle in gone:
            del self.by_handle[handle]
        return len(gone)

    def statistics(self) -> dict:
        return {"renewing": len(self.by_handle), "renewals": self.renewed_count, "renewalsEnded": self.expired,
                "renewalsRefused": self.refused}


@dataclass
class Client:
    """What the proxy knows of one client (by its `x-mq-client-id`)."""

    client_id: str
    client_type: int = pb.CLIENT_TYPE_UNSPECIFIED
    group: str = ""
    language: str = ""
    version: str = ""
    last_seen: float = 0.0
    streams: int = 0  # Telemetry streams open
    topics: set[str] = field(default_factory=set)
    subscriptions: list[dict] = field(default_factory=list)  # a consumer's, as a HEART_BEAT names them (actors.proxy.members)
    first_seen_ms: int = 0  # wall-clock
    account: str | None = None  # the ACL account its heartbeats came under (None: no ACL)


class Clients:
    """The clients that spoke to the proxy lately: for `admin stats`, and forgotten after
    CLIENT_EXPIRY_S of silence or at NotifyClientTermination. Bounded by MAX_CLIENTS."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.by_id: dict[str, Client] = {}
        self.terminated = 0

    def seen(self, client_id: str, metadata: dict[str, str]) -> Client:
        client = self.by_id.get(client_id)
        if client is None:
            if len(self.by_id) >= MAX_CLIENTS:
                self.expire(force=True)
            client = self.by_id[client_id] = Client(client_id, language=metadata.get("x-mq-language", ""),
                                                    version=metadata.get("x-mq-client-version", ""),
                                                    first_seen_ms=wall_ms())
        client.last_seen = self.clock()
        return client

    def heard(self, client: Client, client_type: int, group: str | None) -> None:
        if client_type != pb.CLIENT_TYPE_UNSPECIFIED:
            client.client_type = client_type
        if group:
            client.group = group

    def terminated_by(self, client_id: str) -> Client | None:
        client = self.by_id.pop(client_id, None)
        if client is not None:
            self.terminated += 1
        return client

    def expire(self, *, force: bool = False) -> list[Client]:
        """Forget the silent (with `force`, also the older half): those that went."""
        now = self.clock()
        gone = [cid for cid, c in self.by_id.items() if now - c.last_seen > CLIENT_EXPIRY_S and not c.streams]
        if force and not gone:
            by_age = sorted(self.by_id.values(), key=lambda c: c.last_seen)
            gone = [c.client_id for c in by_age[: len(by_age) // 2 + 1]]
        return [self.by_id.pop(cid) for cid in gone]

    def statistics(self) -> dict:
        kinds: dict[str, int] = {}
        for client in self.by_id.values():
            name = name_of(pb.ClientType, client.client_type)
            kinds[name] = kinds.get(name, 0) + 1
        return {"clients": len(self.by_id), "clientTypes": kinds, "clientsTerminated": self.terminated,
                "telemetryStreams": sum(c.streams for c in self.by_id.values())}
