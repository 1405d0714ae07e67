"""The gRPC proxy's half of the ACL: who a call is (RocketMQ 5's `authorization` metadata).

A RocketMQ 5 client signs each call: `authorization: MQv2-HMAC-SHA1 Credential=<accessKey>,
SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1(secretKey, x-mq-date-time)>`. `Verifier`
checks it against aclFile's accounts (re-read when the file changes, as the front does) and
names the account; the proxy then carries the call to the front signed as that account, and the
front's ACL decides what it may do, as for every client (actors.acl). A call without a signature
from an address the file lists as white (globalWhiteRemoteAddresses, or an account's
whiteRemoteAddress) goes as the node's own, unchecked, as RocketMQ lets such addresses through.
Refusals: UNAUTHORIZED (no or a malformed signature, an unknown account, a wrong signature).
"""

from __future__ import annotations

import hmac
import logging
from hashlib import sha1

from actors import guard
from actors.acl import AclError, AclFile
from actors.proxy.apis.definition_pb2 import Code

log = logging.getLogger("mqnode")
SCHEME = "MQv2-HMAC-SHA1"
SIGNED_HEADER = "x-mq-date-time"


class Denied(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def parse(authorization: str) -> tuple[str, str, str]:
    """(access key, signed headers, signature) of an `authorization` value; ValueError if malformed."""
    scheme, _, rest = authorization.strip().partition(" ")
    if scheme != SCHEME:
        raise ValueError(f"the scheme is {scheme!r}, not {SCHEME}")
    fields = {}
    for part in rest.split(","):
        name, equals, value = part.strip().partition("=")
        if not equals:
            raise ValueError(f"{part.strip()!r} is not name=value")
        fields[name] = value
    try:
        return fields["Credential"], fields["SignedHeaders"], fields["Signature"]
    except KeyError as e:
        raise ValueError(f"{e.args[0]} is missing") from None


def signature(secret_key: str, date_time: str) -> str:
    return hmac.new(secret_key.encode(), date_time.encode(), sha1).hexdigest()


class Verifier:
    def __init__(self, settings):
        self.file = AclFile(guard.resolve(settings.aclFile))
        self.config = self.file.config

    def _refresh(self) -> None:
        try:
            config = self.file.changed()
        except AclError as e:
            log.warning("proxy: the ACL file changed but does not parse; the old rules stay: %s", e)
            return
        if config is not None:
            self.config = config

    def secret_of(self, access_key: str) -> str:
        account = self.config.accounts.get(access_key)
        if account is None:  # (gone from the file since the call was verified)
            raise Denied(Code.UNAUTHORIZED, f"no account {access_key!r}")
        return account.secret_key

    def verify(self, metadata: dict[str, str], peer: str = "") -> str | None:
        """The account of a call (None: the node's own, for a white address); Denied otherwise."""
        self._refresh()
        authorization = metadata.get("authorization", "")
        if not authorization or "Credential=," in authorization:
            if peer and self._white(peer):
                return None
            raise Denied(Code.UNAUTHORIZED, "the ACL is on: sign the call (authorization: MQv2-HMAC-SHA1 ...)")
        try:
            access_key, signed, given = parse(authorization)
        except ValueError as e:
            raise Denied(Code.UNAUTHORIZED, f"malformed authorization: {e}") from None
        account = self.config.accounts.get(access_key)
        if account is None:
            raise Denied(Code.UNAUTHORIZED, f"no account {access_key!r}")
        if signed.lower() != SIGNED_HEADER or SIGNED_HEADER not in metadata:
            raise Denied(Code.UNAUTHORIZED, f"the signature must cover {SIGNED_HEADER}, and the call carry it")
        if not hmac.compare_digest(signature(account.secret_key, metadata[SIGNED_HEADER]), given.lower()):
            raise Denied(Code.UNAUTHORIZED, f"the signature of {access_key!r} does not match")
        return access_key

    def _white(self, peer: str) -> bool:
        host = _host(peer)
        patterns = [*self.config.white, *(a.white for a in self.config.accounts.values() if a.white is not None)]
        return any(pattern.match(host) for pattern in patterns)


def _host(peer: str) -> str:
    """The address of grpc's `context.peer()`: "ipv4:1.2.3.4:5678", "ipv6:[::1]:5678"."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rpartition(":")[0].strip("[]")
    return ""
