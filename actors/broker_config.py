"""The node's settings as requests see them, and its permission: GET_BROKER_CONFIG (26) and
UPDATE_BROKER_CONFIG (25), RocketMQ's getBrokerConfig / updateBrokerConfig (mqadmin), both with
RocketMQ's body, Java properties text (`key=value` lines).

`brokerPermission` (RocketMQ's PermName bits: 4 read, 2 write) refuses what RocketMQ 4.9's
processors refuse: pulls and pops when it is not readable ("the broker[<brokerName>] pulling
message is forbidden"), and sends to order topics when it is not writable. Other sends are
served: the registrations carry the permission in place of each topic's, so the name services'
routes steer producers to other groups, and a producer whose route is older than the change is
not failed while it learns. A node's own route (GET_ROUTEINFO_BY_TOPIC) carries it the same way.

Only brokerPermission changes while a node runs (draining a group before maintenance, as
`mqadmin updateBrokerConfig -k brokerPermission -v 4` does). It lives in the control block, so a
restarted front keeps it, until the node stops: the next start takes the setting again.

Sans-I/O: the front's router asks it; the control block is given.
"""

from __future__ import annotations

import dataclasses

import orjson

from node import protocol
from shm.settings import FIELDS
from shm.settings_rules import BROKER_PERMISSIONS

PERM_READ, PERM_WRITE = 4, 2
RUNTIME = ("brokerPermission",)  # what UPDATE_BROKER_CONFIG may change
MAX_LINES = 64
SECRETS = ("haSecretKey",)  # settings GET_BROKER_CONFIG never shows (files' paths it does)


class Refused(ValueError):
    """UPDATE_BROKER_CONFIG's INVALID_PARAMETER, with the remark."""


class BrokerConfig:
    def __init__(self, settings, control=None):
        self.settings = settings
        self.control = control  # None (unit tests): kept here instead
        self.held = settings.brokerPermission
        self.updates = 0

    @property
    def permission(self) -> int:
        return self.held if self.control is None else self.control.get("broker_permission")

    @permission.setter
    def permission(self, value: int) -> None:
        if self.control is None:
            self.held = value
        else:
            self.control.set("broker_permission", value)

    def read_refusal(self, code: int) -> str | None:
        if self.permission & PERM_READ:
            return None
        verb = "pulling" if code == protocol.PULL_MESSAGE else "popping"
        return f"the broker[{self.settings.brokerName}] {verb} message is forbidden (brokerPermission {self.permission})"

    def send_refusal(self, config) -> str | None:
        """For a send to `config`'s topic (actors.topics.TopicConfig)."""
        if not config.order or self.permission & PERM_WRITE:  # (order first: a send's path reads no slot)
            return None
        return f"the broker[{self.settings.brokerName}] sending message is forbidden (brokerPermission {self.permission})"

    def route_perm(self, topic_perm: int) -> int:
        """A topic's perm as routes give it: its own while the node may read and write, else the
        node's (RocketMQ's registerBrokerAll)."""
        node = self.permission
        return topic_perm if node & PERM_READ and node & PERM_WRITE else node

    def answer(self, request: protocol.Request) -> list[bytes]:
        if request.code == protocol.GET_BROKER_CONFIG:
            return [orjson.dumps(protocol.reply_header(request.opaque, "OK", brokerPermission=self.permission)),
                    self.properties().encode()]
        try:
            changes = parse_properties(request.body)
        except Refused as e:
            return protocol.error_reply(request.opaque, "INVALID_PARAMETER", str(e))
        self.permission = changes["brokerPermission"]
        self.updates += 1
        return [orjson.dumps(protocol.reply_header(request.opaque, "OK", brokerPermission=self.permission))]

    def properties(self) -> str:
        values = dataclasses.asdict(self.settings) | {"brokerPermission": self.permission}
        values |= {name: "******" for name in SECRETS if values.get(name)}  # (GET_BROKER_CONFIG needs no admin)
        return "".join(f"{name}={_text(value)}\n" for name, value in sorted(values.items()))

    def statistics(self) -> dict:
        return {"brokerPermission": self.permission, "updates": self.updates}


def parse_properties(body: bytes | None) -> dict[str, int]:
    """UPDATE_BROKER_CONFIG's body: `key=value` (or `key:value`) lines, `#` and `!` comments.
    Raises Refused for a body that names no change, or one that cannot be made while the node
    runs."""
    try:
        text = bytes(body or b"").decode()
    except UnicodeDecodeError:
        raise Refused("the body must be UTF-8 properties text (key=value lines)") from None
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and line[0] not in "#!"]
    if not lines or len(lines) > MAX_LINES:
        raise Refused(f"the body must hold 1 to {MAX_LINES} key=value lines")
    changes = {}
    for line in lines:
        cut = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if cut < 0:
            raise Refused(f"{line[:40]!r} is not key=value")
        key, value = line[:cut].strip(), line[cut + 1:].strip()
        if key not in FIELDS:  # (a misspelt name: restarting would not help)
            raise Refused(f"{key[:40]} is no setting of the node (conf/broker.toml lists them; only "
                          f"{', '.join(RUNTIME)} changes while it runs)")
        if key not in RUNTIME:
            raise Refused(f"{key[:40]} does not change while the node runs (only {', '.join(RUNTIME)} does): "
                          f"set it in the node's settings and restart it")
        if not value.lstrip("-").isdigit() or int(value) not in BROKER_PERMISSIONS:
            raise Refused(f"brokerPermission must be one of {', '.join(map(str, BROKER_PERMISSIONS))}, not {value[:20]!r}")
        changes[key] = int(value)
    return changes


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
