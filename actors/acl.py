"""The ACL's core (`aclEnable`): RocketMQ 4.9's plain ACL over mqnode's requests. No socket, no
clock: the front (its shell) asks `check` for each client request before routing it, and calls
`reload` when `aclFile` changed.

`aclFile` is RocketMQ's `plain_acl.yml`:

    globalWhiteRemoteAddresses: [10.10.103.*, 192.168.0.*]   # these need no account at all
    accounts:
      - accessKey: RocketMQ
        secretKey: "12345678"
        whiteRemoteAddress: 192.168.1.*   # from here: no signature, no permission check
        admin: false                      # admin requests (topic and group changes, clean)
        replication: false                # mqnode's: may follow this node as its slave (admin may too)
        defaultTopicPerm: DENY            # for topics not listed (DENY when absent)
        defaultGroupPerm: SUB             # for groups not listed (DENY when absent)
        topicPerms: [topicA=DENY, topicB=PUB|SUB, topicC=SUB]
        groupPerms: [groupA=DENY, groupB=PUB|SUB, groupC=SUB]

A permission is DENY, PUB, SUB or PUB|SUB (anything else reads as DENY, as in RocketMQ). An
address pattern is `*`, an IPv4 address whose parts may each be `*`, a range `a-b` or a list
`{a,b}`, or any address written out exactly. What each request needs (`needed`), as RocketMQ's
PlainAccessValidator: a send PUB on its topic (a `%RETRY%<group>` topic: SUB on the group); a
pull or pop SUB on its topic and, when named, its group; consumer offsets SUB on both; a
send-back, an ack or a change of invisible time SUB on its group; RocketMQ's admin codes (and the manual clean) the account's `admin`. An admin
account that lists no permissions may use every topic and group. The rest needs only a valid
signature. A refusal is NO_PERMISSION with a remark naming what is missing.

The HA link (actors.ha_link) asks `replication_refusal` before a slave follows: its hello,
signed with the same scheme over a fresh challenge of the master's, by an account with `admin`
or `replication` (RocketMQ 4.x's link has no authentication at all).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from node import protocol
from node.security import ACCESS_KEY, signature_matches

DENY, PUB, SUB = 1, 2, 4
PERMS = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB}
PERM_NAMES = {PUB: "PUB", SUB: "SUB"}
RETRY_PREFIX = "%RETRY%"
MIN_KEY_LENGTH = 6  # RocketMQ refuses shorter access and secret keys
ACL_CONFIG = "plain_acl.yml"  # a master with the ACL ships its file to its slaves by this name (actors.ha_link)
ADMIN_CODES = frozenset({protocol.UPDATE_AND_CREATE_TOPIC, protocol.DELETE_TOPIC_IN_BROKER,
                         protocol.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, protocol.DELETE_SUBSCRIPTIONGROUP,
                         protocol.DELETE_EXPIRED_COMMITLOG, protocol.HA_ROLE, protocol.UPDATE_BROKER_CONFIG})
SEND_ONE = frozenset({protocol.SEND_MESSAGE, protocol.SEND_BATCH_MESSAGE, protocol.SEND_REPLY_MESSAGE})
GROUP_ONLY = frozenset({protocol.CONSUMER_SEND_MSG_BACK, protocol.UNREGISTER_CLIENT, protocol.GET_CONSUMER_LIST_BY_GROUP,
                        protocol.LOCK_BATCH_MQ, protocol.UNLOCK_BATCH_MQ, protocol.GET_CONSUMER_CONNECTION_LIST,
                        protocol.ACK_MESSAGE, protocol.BATCH_ACK_MESSAGE, protocol.CHANGE_MESSAGE_INVISIBLETIME,
                        protocol.GET_POP_STATE, protocol.GET_CONSUMER_RUNNING_INFO, protocol.CONSUME_MESSAGE_DIRECTLY})
TOPIC_AND_GROUP = frozenset({protocol.PULL_MESSAGE, protocol.QUERY_CONSUMER_OFFSET, protocol.UPDATE_CONSUMER_OFFSET,
                             protocol.RESET_CONSUMER_CLIENT_OFFSET, protocol.RESET_POP_OFFSET,
                             protocol.POP_MESSAGE, protocol.PEEK_MESSAGE})


class AclError(ValueError):
    """`aclFile` cannot be used: what is wrong with it."""


def parse_perm(text) -> int:
    return PERMS.get(str(text).strip().upper(), DENY)


class AddressPattern:
    """One of RocketMQ's remote address patterns (the module's docstring)."""

    _PART = re.compile(r"\*|\d{1,3}(-\d{1,3})?|\{\d{1,3}(,\d{1,3})*\}")

    def __init__(self, text: str):
        self.text = text = str(text).strip()
        parts = text.split(".")
        self.any = text in ("*", "*.*.*.*")
        self.parts = parts if len(parts) == 4 and all(self._PART.fullmatch(p) for p in parts) else None
        if not self.any and self.parts is None:
            try:
                self.exact = str(ipaddress.ip_address(text))
            except ValueError:
                raise AclError(f"not an address pattern: {text!r}") from None

    def match(self, address: str) -> bool:
        if self.any:
            return True
        if self.parts is None:
            return address == self.exact
        octets = address.split(".")
        return len(octets) == 4 and all(_part_matches(p, o) for p, o in zip(self.parts, octets))


def _part_matches(pattern: str, octet: str) -> bool:
    if pattern == "*":
        return True
    if not octet.isdigit():
        return False
    value = int(octet)
    if pattern.startswith("{"):
        return value in {int(v) for v in pattern[1:-1].split(",")}
    low, _, high = pattern.partition("-")
    return int(low) <= value <= int(high or low)


@dataclass
class Account:
    access_key: str
    secret_key: str
    admin: bool = False
    replication: bool = False  # may follow the node as its slave (the HA link)
    white: AddressPattern | None = None
    default_topic: int = DENY
    default_group: int = DENY
    topics: dict[str, int] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)

    def owns(self, kind: str, name: str) -> int:
        table, default = (self.groups, self.default_group) if kind == "group" else (self.topics, self.default_topic)
        return table.get(name, default)


@dataclass
class AclConfig:
    accounts: dict[str, Account]
    white: list[AddressPattern]

    @property
    def uses_addresses(self) -> bool:
        """Whether any rule looks at the client's address (the shell reads it only then)."""
        return bool(self.white) or any(a.white is not None for a in self.accounts.values())


def parse_config(data) -> AclConfig:
    """plain_acl.yml's content (as YAML parsed it) -> AclConfig; AclError naming the fault."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise AclError("the ACL file must hold a mapping (globalWhiteRemoteAddresses, accounts)")
    white = [AddressPattern(p) for p in _list(data.get("globalWhiteRemoteAddresses"), "globalWhiteRemoteAddresses")]
    accounts = {}
    for index, entry in enumerate(_list(data.get("accounts"), "accounts")):
        account = _account(entry, index)
        if account.access_key in accounts:
            raise AclError(f"accessKey {account.access_key!r} is listed twice")
        accounts[account.access_key] = account
    return AclConfig(accounts, white)


def _list(value, name: str) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise AclError(f"`{name}` must be a list")
    return value


def _account(entry, index: int) -> Account:
    if not isinstance(entry, dict):
        raise AclError(f"accounts[{index}] must be a mapping")
    access, secret = str(entry.get("accessKey") or ""), str(entry.get("secretKey") or "")
    if len(access) < MIN_KEY_LENGTH or len(secret) < MIN_KEY_LENGTH:
        raise AclError(f"accounts[{index}]: accessKey and secretKey need {MIN_KEY_LENGTH} characters or more")
    white = entry.get("whiteRemoteAddress")
    return Account(access, secret, admin=entry.get("admin") is True, replication=entry.get("replication") is True,
                   white=AddressPattern(white) if white not in (None, "") else None,
                   default_topic=parse_perm(entry.get("defaultTopicPerm", "DENY")),
                   default_group=parse_perm(entry.get("defaultGroupPerm", "DENY")),
                   topics=_perms(entry.get("topicPerms"), index, "topicPerms"),
                   groups=_perms(entry.get("groupPerms"), index, "groupPerms"))


def _perms(value, index: int, name: str) -> dict[str, int]:
    out = {}
    for item in _list(value, f"accounts[{index}].{name}"):
        resource, sep, perm = str(item).rpartition("=")
        if not sep or not resource:
            raise AclError(f"accounts[{index}].{name}: {item!r} is not NAME=PERM")
        out[resource.strip()] = parse_perm(perm)
    return out


def needed(header: dict) -> list[tuple[str, str, int]]:
    """(kind, name, permission) a request needs: kind "topic" or "group"."""
    code = header.get("code")
    if code in SEND_ONE:
        return [_send_resource(header.get("topic"))]
    if code == protocol.SEND_MESSAGES:
        messages = header.get("messages")
        topics = {m.get("topic") for m in messages if isinstance(m, dict)} if isinstance(messages, list) else set()
        return [_send_resource(t) for t in sorted(topics, key=str)]
    if code == protocol.HEART_BEAT:
        data = header.get("consumerDataSet")
        return [("group", str(d.get("groupName")), SUB) for d in data if isinstance(d, dict)] if isinstance(data, list) else []
    out = []
    if code in TOPIC_AND_GROUP or code == protocol.QUERY_MESSAGE:
        out.append(_read_resource(header.get("topic")))
    if (code in TOPIC_AND_GROUP or code in GROUP_ONLY) and "consumerGroup" in header:
        out.append(("group", str(header.get("consumerGroup")), SUB))
    return out


def _read_resource(topic) -> tuple[str, str, int]:
    """A group's retry topic is the group (RocketMQ's PlainPermissionManager: isRetryTopic), so
    a member pulls and commits its `%RETRY%<group>` with SUB on the group."""
    topic = str(topic)
    if topic.startswith(RETRY_PREFIX):
        return ("group", topic[len(RETRY_PREFIX):], SUB)
    return ("topic", topic, SUB)


def _send_resource(topic) -> tuple[str, str, int]:
    topic = str(topic)
    if topic.startswith(RETRY_PREFIX):
        return ("group", topic[len(RETRY_PREFIX):], SUB)
    return ("topic", topic, PUB)


class Acl:
    """`check` per request; `statistics()` for `admin stats` and /metrics."""

    def __init__(self, config: AclConfig, internal: Account | None = None):
        self.internal = internal  # the node's own account (its launcher's probes and scrapes)
        self.config = config
        self.checked = self.refused = self.reloads = self.reload_errors = 0
        self.last_refusal = ""

    def reload(self, config: AclConfig) -> None:
        self.config = config
        self.reloads += 1

    @property
    def uses_addresses(self) -> bool:
        return self.config.uses_addresses

    def check(self, header: dict, body: bytes, address: str | None) -> str | None:
        """None when the request may go on, else NO_PERMISSION's remark (counted)."""
        self.checked += 1
        remark = self._refusal(header, body, address)
        if remark is not None:
            self.refused += 1
            self.last_refusal = remark
        return remark

    def _refusal(self, header: dict, body: bytes, address: str | None) -> str | None:
        config = self.config
        if address is not None and any(p.match(address) for p in config.white):
            return None
        access_key = header.get(ACCESS_KEY)
        if not isinstance(access_key, str) or not access_key:
            return "no accessKey: this node's ACL is on (sign requests: docs/protocol.md \"Signing\")"
        account = config.accounts.get(access_key)
        if account is None and self.internal is not None and access_key == self.internal.access_key:
            account = self.internal
        if account is None:
            return f"no ACL account for accessKey={access_key}"
        if address is not None and account.white is not None and account.white.match(address):
            return None
        if not signature_matches(account.secret_key, header, body):
            return f"signature check failed for accessKey={access_key}"
        return self._permission(account, header)

    def replication_refusal(self, proof: dict, challenge: str, hello: bytes) -> str | None:
        """None when `proof` (the slave's {accessKey, signature}) signs `hello` over `challenge`
        for an account that may replicate (`admin` or `replication`); else why not (counted).
        No address is trusted here: a white-listed address still signs."""
        self.checked += 1
        remark = self._replication_refusal(proof, challenge, hello)
        if remark is not None:
            self.refused += 1
            self.last_refusal = remark
        return remark

    def _replication_refusal(self, proof: dict, challenge: str, hello: bytes) -> str | None:
        access_key = proof.get(ACCESS_KEY)
        if not isinstance(access_key, str) or not access_key:
            return "no accessKey: this master's ACL is on (set the slave's haAccessKey and haSecretKey)"
        account = self.config.accounts.get(access_key)
        if account is None:
            return f"no ACL account for accessKey={access_key}"
        header = replication_header(access_key, challenge) | {"signature": proof.get("signature")}
        if not signature_matches(account.secret_key, header, hello):
            return f"signature check failed for accessKey={access_key}"
        if not (account.admin or account.replication):
            return f"accessKey={access_key} may not replicate: it needs admin: true or replication: true"
        return None

    @staticmethod
    def _permission(account: Account, header: dict) -> str | None:
        code = header.get("code")
        if code in ADMIN_CODES and not account.admin:
            return f"request code {code} needs admin, and accessKey={account.access_key} is not"
        if account.admin and not account.topics and not account.groups:
            return None
        for kind, name, perm in needed(header):
            owned = account.owns(kind, name)
            if owned & DENY or owned & perm != perm:
                return f"no {PERM_NAMES[perm]} permission on {kind} {name} for accessKey={account.access_key}"
        return None

    def statistics(self) -> dict:
        return {"accounts": len(self.config.accounts), "whiteAddresses": len(self.config.white),
                "checked": self.checked, "refused": self.refused, "lastRefusal": self.last_refusal,
                "reloads": self.reloads, "reloadErrors": self.reload_errors}


def replication_header(access_key: str, challenge: str) -> dict:
    """What a slave's proof signs besides its hello (the body): the master's fresh challenge, so a
    captured proof is worth nothing on another connection."""
    return {"code": "HA_HELLO", ACCESS_KEY: access_key, "challenge": challenge}


class AclFile:
    """`aclFile` on disk: parsed at start (AclError stops the node from starting), looked at again
    by `changed()`; a changed file that does not parse keeps the rules in force (counted), so a
    half-saved edit neither opens the node nor locks everyone out."""

    def __init__(self, path):
        self.path = path
        self.stamp = self._stamp()
        self.config = self._load()

    def _stamp(self):
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return None
        return (stat.st_mtime_ns, stat.st_size, stat.st_ino)

    def _load(self) -> AclConfig:
        import yaml

        try:
            text = self.path.read_text()
        except OSError as e:
            raise AclError(f"cannot read the ACL file {self.path}: {e}") from None
        try:
            return parse_config(yaml.safe_load(text))
        except yaml.YAMLError as e:
            raise AclError(f"the ACL file {self.path} is not YAML: {e}") from None

    def changed(self) -> AclConfig | None:
        """The new rules when the file changed and parses; None otherwise. AclError: changed,
        but broken (the caller keeps the old rules)."""
        stamp = self._stamp()
        if stamp == self.stamp:
            return None
        self.stamp = stamp
        self.config = self._load()
        return self.config
