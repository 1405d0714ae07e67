"""The edge's checks of one field: types, ranges and names, each a `*_problem` returning why the
value is refused (a remark for the client) or None. The checks of whole requests, built from
these, are actors.edge's and actors.edge_clients'.
"""

from __future__ import annotations

import ipaddress
import re

from actors.topics import TOPIC_MAX_LENGTH
from node.protocol import GROUP_MAX_LENGTH, NAME, SUSPEND_MS_MAX  # (one definition: the clients check them too)

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
QUEUE_ID_MAX = 2**31 - 1
MAX_PULL_COUNT = 1024
MAX_PROPERTIES_CHARS = 32767
HEX = re.compile(r"[0-9a-fA-F]+")


def is_int(value) -> bool:
    """A JSON integer: not a bool, not a float (10.0 is refused), not a string."""
    return type(value) is int


def int_problem(header: dict, name: str, low: int, high: int, *, required: bool = False) -> str | None:
    value = header.get(name)
    if value is None and not required and name not in header:
        return None
    if not is_int(value) or not low <= value <= high:
        return f"`{name}` must be an integer from {low} to {high}, not {shown(value)}"
    return None


def bool_problem(header: dict, name: str) -> str | None:
    if name in header and type(header[name]) is not bool:
        return f"`{name}` must be true or false, not {shown(header[name])}"
    return None


def read_topic_problem(topic) -> str | None:
    """Why `topic` cannot name a queue to read (a system topic can), or None."""
    return name_problem(topic, "topic", TOPIC_MAX_LENGTH)


def group_problem(group) -> str | None:
    return name_problem(group, "consumerGroup", GROUP_MAX_LENGTH)


def name_problem(value, field: str, max_length: int) -> str | None:
    """A topic or group name: `[%|a-zA-Z0-9_-]+`, 1 to `max_length` characters."""
    if not isinstance(value, str) or not value:
        return f"`{field}` must be a name, not {shown(value)}"
    if len(value) > max_length:
        return f"`{field}` is {len(value)} characters; at most {max_length} are allowed"
    if not NAME.fullmatch(value):
        return f"`{field}` {shown(value)} may only contain characters from [%|a-zA-Z0-9_-]"
    return None


def born_host_problem(value) -> str | None:
    """`bornHost` is optional (stored as 127.0.0.1:0 when absent); present, it is "ip:port" or
    "[ipv6]:port" with a port 0..65535."""
    if value is None:
        return None
    if not isinstance(value, str):
        return f"`bornHost` must be \"ip:port\", not {shown(value)}"
    host, separator, port = value.rpartition(":")
    try:
        ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
        port_ok = separator and port.isdigit() and 0 <= int(port) <= 65535
    except ValueError:
        port_ok = False
    if not port_ok:
        return f"`bornHost` must be \"ip:port\" (or \"[ipv6]:port\") with a port 0..65535, not {value!r}"
    return None


def properties_problem(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        if len(value) > MAX_PROPERTIES_CHARS:
            return f"the properties string of {len(value)} characters exceeds {MAX_PROPERTIES_CHARS}"
        return None
    if isinstance(value, dict):
        for name, text in value.items():
            if not isinstance(text, str):
                return f"property {name!r} must be a string, not {shown(text)}"
            if "\x01" in name or "\x02" in name or "\x02" in text:
                return f"property {name!r}: names hold no \\x01 or \\x02, values no \\x02 (the separators)"
        return None
    return f"`properties` must be an object of strings or a RocketMQ properties string, not {shown(value)}"


def queue_problem(header: dict) -> str | None:
    return read_topic_problem(header.get("topic")) or int_problem(header, "queueId", 0, QUEUE_ID_MAX, required=True)


def filter_problem(header: dict, kind_name: str, expression_name: str) -> str | None:
    """A pull's or pop's filter: an expression type TAG or SQL92 (absent: TAG) and a string;
    whether it parses, and whether SQL92 is on, the service that reads says."""
    kind, expression = header.get(kind_name), header.get(expression_name)
    if kind is not None and kind not in ("", "TAG", "SQL92"):
        return f"`{kind_name}` {shown(kind)} is not one (TAG or SQL92)"
    if expression is not None and not isinstance(expression, str):
        return f"`{expression_name}` must be a string, not {shown(expression)}"
    return None


def offset_msg_id_problem(value, name: str) -> str | None:
    if not isinstance(value, str) or len(value) not in (32, 56) or not HEX.fullmatch(value):
        return f"`{name}` must be 32 (IPv4 store host) or 56 (IPv6) hex characters, not {shown(value)}"
    return None


def client_id_problem(header: dict) -> str | None:
    value = header.get("clientID")
    if not isinstance(value, str) or not 1 <= len(value) <= 255:
        return f"`clientID` must be a string of 1 to 255 characters, not {shown(value)}"
    return None


def queue_list_problem(value, field: str, limit: int) -> str | None:
    if not isinstance(value, list) or len(value) > limit:
        return f"`{field}` must be a list of at most {limit} {{topic, queueId}}, not {shown(value)}"
    for item in value:
        problem = (f"each of `{field}` must be {{topic, queueId}}, not {shown(item)}" if not isinstance(item, dict)
                   else read_topic_problem(item.get("topic")) or int_problem(item, "queueId", 0, QUEUE_ID_MAX,
                                                                             required=True))
        if problem:
            return problem
    return None


def shown(value) -> str:
    """A client's value in a remark: short, whatever its size."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
