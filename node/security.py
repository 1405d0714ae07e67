"""What a client needs to reach a node that has security on, shared by the clients and the node:
the request signature of the ACL (RocketMQ's `AclUtils`, over mqnode's JSON header) and the keys
of ZeroMQ CURVE.

Signing (docs/protocol.md "Signing"): the header carries `accessKey` and `signature`.
`signature` = base64(HMAC-SHA1(secretKey, content)), where content is, for each header field in
ascending code-point order of its name, `signature` left out and null values skipped, the
field's value rendered as text, all concatenated, and then the body frame's bytes. A string
renders as itself (UTF-8), true/false as `true`/`false`, an integer in decimal, and anything
else (a float, an array, an object) as compact JSON with object keys sorted and UTF-8 left
unescaped: orjson's `OPT_SORT_KEYS` output. As in RocketMQ, the names are not part of the
content, only the order they give.

Credentials come from the caller or from the environment: `MQNODE_ACCESS_KEY`,
`MQNODE_SECRET_KEY` (the ACL) and `MQNODE_SERVER_KEY` (the node's CURVE public key, Z85 text or
a key file `mqnode keygen` wrote), `MQNODE_CLIENT_KEY` (this client's key pair's secret file,
for a node with an allow-list; without it each connection makes a fresh key pair).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path

import orjson
import zmq
import zmq.auth

SIGNATURE = "signature"
ACCESS_KEY = "accessKey"
_SORTED = orjson.OPT_SORT_KEYS


def canonical(header: dict, body: bytes = b"") -> bytes:
    """The bytes a request's signature covers (the module's docstring)."""
    return _fields(header) + body


def _fields(header: dict) -> bytes:
    parts = []
    for name in sorted(header):
        value = header[name]
        if name == SIGNATURE or value is None:
            continue
        kind = type(value)
        if kind is str:
            parts.append(value.encode())
        elif kind is bool:
            parts.append(b"true" if value else b"false")
        elif kind is int:
            parts.append(str(value).encode())
        else:
            parts.append(orjson.dumps(value, option=_SORTED))
    return b"".join(parts)


def signature(secret_key: str, header: dict, body: bytes = b"") -> str:
    mac = hmac.new(secret_key.encode(), _fields(header), hashlib.sha1)
    mac.update(body)  # (not joined to the fields: a batch's body is not copied)
    return base64.b64encode(mac.digest()).decode()


def signature_matches(secret_key: str, header: dict, body: bytes) -> bool:
    given = header.get(SIGNATURE)
    return isinstance(given, str) and hmac.compare_digest(given, signature(secret_key, header, body))


def read_public_key(text_or_path: str) -> bytes:
    """A CURVE public key from Z85 text (40 characters) or from a key file `mqnode keygen` wrote
    (ZeroMQ's certificate format); ValueError when it is neither."""
    if len(text_or_path) == 40 and not Path(text_or_path).exists():
        return text_or_path.encode()
    try:
        public, _ = zmq.auth.load_certificate(text_or_path)
    except (OSError, ValueError) as e:
        raise ValueError(f"not a CURVE public key (40 Z85 characters) nor a key file: {text_or_path!r} ({e})") from None
    return public


@dataclass(frozen=True)
class Credentials:
    """A client's ACL account and what it needs for CURVE; empty: neither."""

    access_key: str | None = None
    secret_key: str | None = None
    server_key: bytes | None = None  # the node's CURVE public key (Z85)
    client_key_file: str | None = None  # this client's secret key file (for an allow-list)
    curve_pair: tuple[bytes, bytes] | None = None  # or the key pair itself (public, secret), Z85

    @classmethod
    def from_env(cls) -> Credentials:
        env = os.environ.get
        server = env("MQNODE_SERVER_KEY")
        return cls(env("MQNODE_ACCESS_KEY") or None, env("MQNODE_SECRET_KEY") or None,
                   read_public_key(server) if server else None, env("MQNODE_CLIENT_KEY") or None)

    @classmethod
    def of(cls, access_key: str | None = None, secret_key: str | None = None,
           server_key: str | bytes | None = None, client_key_file: str | None = None) -> Credentials:
        """The given values, each missing one from the environment."""
        base = cls.from_env()
        if isinstance(server_key, str):
            server_key = read_public_key(server_key)
        return cls(access_key or base.access_key, secret_key or base.secret_key, server_key or base.server_key,
                   client_key_file or base.client_key_file)

    @property
    def signs(self) -> bool:
        return bool(self.access_key and self.secret_key)

    def sign(self, header: dict, body: bytes = b"") -> dict:
        """`header` with `accessKey` and `signature` (in place; returned for chaining)."""
        header[ACCESS_KEY] = self.access_key
        header.pop(SIGNATURE, None)
        header[SIGNATURE] = signature(self.secret_key, header, body)
        return header

    def secure(self, sock: zmq.Socket) -> None:
        """CURVE on a client socket before it connects, when the node's key is known."""
        if self.server_key is None:
            return
        if self.curve_pair is not None:
            public, secret = self.curve_pair
        elif self.client_key_file:
            public, secret = zmq.auth.load_certificate(self.client_key_file)
            if secret is None:
                raise ValueError(f"{self.client_key_file} holds no secret key (use the .key_secret file)")
        else:
            public, secret = zmq.curve_keypair()
        sock.curve_serverkey = self.server_key
        sock.curve_publickey = public
        sock.curve_secretkey = secret
