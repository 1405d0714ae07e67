"""The node's side of producer groups (RocketMQ's ProducerManager): which connections belong to
each group, so a transaction's check reaches a producer that can answer it. No socket, no clock:
the front (its shell) passes `now` (monotonic ms) and sends the checks.

A producer is known by its `clientID` and reached through the routing id of the DEALER it last
sent HEART_BEAT from with the group in `producerDataSet`. One whose connection closes is dropped
then (`disconnected`, as RocketMQ's channel close), one silent for `clientChannelExpiredTimeout`
ms (`expire`: a machine cut off), one a check finds unreachable (`gone`). Nothing is persisted: producers heartbeat at start
and every 30 s, as RocketMQ's do.
"""

from __future__ import annotations

from actors.connections import ByConnection

MAX_PRODUCERS = 10_000  # over all groups: a heartbeat beyond it adds no producer


class ProducerGroups:
    def __init__(self, channel_expired_ms: int):
        self.channel_expired_ms = channel_expired_ms
        # group -> clientID -> (routing id, last seen, the connection it heartbeated on)
        self.groups: dict[str, dict[str, tuple[bytes, int, int]]] = {}
        self.on_connection = ByConnection()  # its producers by the connection they heartbeated on
        self.turn = 0  # where the next check starts among a group's producers
        self.expired = self.unreachable = self.disconnected_count = 0

    def heartbeat(self, client_id: str, routing_id: bytes, groups: list[dict], now: int, connection: int = -1) -> None:
        for data in groups:
            members = self.groups.setdefault(data["groupName"], {})
            if client_id in members or self.count() < MAX_PRODUCERS:
                old = members.get(client_id)
                self.on_connection.put((data["groupName"], client_id), connection, old[2] if old is not None else None)
                members[client_id] = (routing_id, now, connection)

    def unregister(self, client_id: str, group: str) -> None:
        members = self.groups.get(group)
        if members is not None:
            gone = members.pop(client_id, None)
            if gone is not None:
                self.on_connection.drop((group, client_id), gone[2])
            if not members:
                del self.groups[group]


    def expire(self, now: int) -> None:
        for group, members in list(self.groups.items()):
            for client_id, (_, seen, _) in list(members.items()):
                if now - seen > self.channel_expired_ms:
                    self.expired += 1
                    self.unregister(client_id, group)

    def disconnected(self, connection: int) -> None:
        """The connection (its fd) closed: the producers that heartbeated on it leave."""
        for group, client_id in self.on_connection.take(connection):
            self.disconnected_count += 1
            self.unregister(client_id, group)

    def connections(self, group: str, now: int) -> list[dict]:
        """GET_PRODUCER_CONNECTION_LIST (mqadmin producerConnection): each producer of the group,
        with how long ago it last heartbeated (ms)."""
        members = self.groups.get(group, {})
        return [{"clientId": client_id, "lastHeartbeatMillisAgo": max(0, now - seen)}
                for client_id, (_, seen, _) in sorted(members.items())]

    def routes(self, group: str) -> list[tuple[str, bytes]]:
        """(clientID, routing id) of the group's producers, in turn: each check starts at the next
        one, so the checks of a group spread over its producers."""
        members = list(self.groups.get(group, {}).items())
        if not members:
            return []
        self.turn += 1
        at = self.turn % len(members)
        return [(c, r) for c, (r, _, _) in members[at:] + members[:at]]

    def find(self, client_id: str) -> bytes | None:
        """The routing id a producer `client_id` last sent HEART_BEAT from, in any of its groups
        (RocketMQ's findChannel: where a request's reply goes), or None."""
        for members in self.groups.values():
            member = members.get(client_id)
            if member is not None:
                return member[0]
        return None

    def forget(self, client_id: str) -> None:
        """Its connection is gone (a reply could not be pushed to it): out of every group."""
        self.unreachable += 1
        for group in [g for g, members in self.groups.items() if client_id in members]:
            self.unregister(client_id, group)

    def gone(self, client_id: str, group: str) -> None:
        """Its connection is gone (a check could not be sent to it)."""
        self.unreachable += 1
        self.unregister(client_id, group)

    def count(self) -> int:
        return sum(len(m) for m in self.groups.values())

    def statistics(self) -> dict:
        return {"groups": len(self.groups), "producers": self.count(), "expired": self.expired,
                "disconnected": self.disconnected_count, "unreachable": self.unreachable}

    def table(self) -> dict[str, list[str]]:
        return {group: sorted(members) for group, members in sorted(self.groups.items())}
