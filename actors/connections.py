"""The front's clients by connection: which (group, clientID) each client connection carries, by the
connection's fd (ZeroMQ's SRCFD of their heartbeats), so that what a closed connection carried
leaves its groups without a scan of every member (actors.consumers, actors.producers). No socket.
"""

from __future__ import annotations

Key = tuple[str, str]  # (group, clientID)


class ByConnection:
    def __init__(self):
        self.table: dict[int, set[Key]] = {}  # fd -> what heartbeated on it last

    def put(self, key: Key, connection: int, before: int | None = None) -> None:
        """`key` heartbeated on `connection` (-1: unknown, not kept), `before` on the one it had."""
        if before is not None and before != connection:
            self.drop(key, before)
        if connection >= 0:
            self.table.setdefault(connection, set()).add(key)

    def drop(self, key: Key, connection: int) -> None:
        held = self.table.get(connection)
        if held is not None:
            held.discard(key)
            if not held:
                del self.table[connection]

    def take(self, connection: int) -> list[Key]:
        """What `connection` carried (it closed), forgotten here."""
        return sorted(self.table.pop(connection, ()))
