"""The node's side of security: the ACL's rules and its file (`aclEnable`, `aclFile`), CURVE on
the client socket with its optional allow-list (`curveEnable`, `curveSecretKeyFile`,
`curveClientKeysDir`), and the node's own identity for the requests it makes of itself.

The node's identity: the launcher's readiness probes and its /metrics scrapes go through the
client socket like any client's, so with the ACL or CURVE on they need an account and a key
pair. The launcher makes both afresh at every start (`write_identity`) into the private run
directory (0700; the file 0600); the front reads them and trusts that account as an admin and
that key in the allow-list. Whoever can read the run directory can already read the store.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from pathlib import Path

import orjson
import zmq
import zmq.auth

from node.security import Credentials
from actors.acl import ACL_CONFIG, Account, Acl, AclError, AclFile
from shm.settings import SettingsError

IDENTITY_FILE = "identity.json"
log = logging.getLogger("mqnode")


class SecurityError(SettingsError):
    """A security setting cannot be used: the node does not start."""


def resolve(path_text: str) -> Path:
    """A path setting: absolute, or relative to the working directory of `mqnode start`."""
    return Path(os.path.expanduser(path_text)).resolve()


# -- the node's identity ------------------------------------------------------------------------------


def write_identity(settings) -> None:
    public, secret = zmq.curve_keypair()
    identity = {"accessKey": "mqnode-node-" + secrets.token_hex(4), "secretKey": secrets.token_urlsafe(24),
                "curvePublic": public.decode(), "curveSecret": secret.decode()}
    path = settings.run_dir / IDENTITY_FILE
    fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(orjson.dumps(identity))
    os.replace(path.with_suffix(".tmp"), path)


def _identity(settings) -> dict:
    return orjson.loads((settings.run_dir / IDENTITY_FILE).read_bytes())


def node_credentials(settings) -> Credentials:
    """What the node's own requests carry (none when security is off)."""
    if not (settings.aclEnable or settings.curveEnable or settings.is_slave):  # (a slave may enforce its master's ACL)
        return Credentials()
    identity = _identity(settings)
    server_key = server_keys(settings)[0] if settings.curveEnable else None
    return Credentials(identity["accessKey"], identity["secretKey"], server_key,
                       curve_pair=(identity["curvePublic"].encode(), identity["curveSecret"].encode()))


# -- the ACL -----------------------------------------------------------------------------------------


def check_settings(settings) -> None:
    """At start, before any process: the files security needs, readable and well-formed."""
    if settings.aclEnable:
        try:
            AclFile(resolve(settings.aclFile))
        except AclError as e:
            raise SecurityError(f"aclEnable: {e}") from None
    if settings.curveEnable:
        server_keys(settings)
        allowed_keys(settings)
    if settings.haMasterPublicKeyFile:
        ha_link_keys(settings)
    if settings.grpc_port and settings.grpcTlsCertFile:
        grpc_tls_pair(settings)


def grpc_tls_pair(settings) -> tuple[bytes, bytes]:
    """(private key, certificate chain) of the gRPC proxy's TLS, PEM: SecurityError naming what is wrong."""
    pair = []
    for name in ("grpcTlsKeyFile", "grpcTlsCertFile"):
        path = resolve(getattr(settings, name))
        try:
            data = path.read_bytes()
        except OSError as e:
            raise SecurityError(f"{name}: cannot read {path}: {e.strerror}") from None
        if b"-----BEGIN " not in data:
            raise SecurityError(f"{name}: {path} is not PEM")
        pair.append(data)
    return pair[0], pair[1]


def acl_path(settings):
    """The ACL file in force: `aclFile` with `aclEnable`; on a slave, its master's when it has
    one (the ha-client keeps it, `config/plain_acl.yml`: a slave enforces its master's accounts,
    its own ACL on or not). None: no ACL."""
    if settings.is_slave:
        shipped = settings.root / "config" / ACL_CONFIG
        if shipped.exists():
            return shipped
    return resolve(settings.aclFile) if settings.aclEnable else None


def acl_shipped(settings) -> dict:
    """The ACL file a master ships to its slaves (actors.ha_server), by its name there."""
    path = acl_path(settings)
    return {ACL_CONFIG: path} if path is not None else {}


def open_acl(settings) -> tuple[Acl, AclFile] | None:
    """The ACL and its watched file (`acl_path`); None when there is none."""
    path = acl_path(settings)
    if path is None:
        return None
    watched = AclFile(path)
    identity = _identity(settings)
    return Acl(watched.config, Account(identity["accessKey"], identity["secretKey"], admin=True)), watched


def open_masters_acl(settings) -> tuple[Acl, AclFile] | None:
    """A slave's look for its master's ACL file: `open_acl`, or None (logged) while the file
    received does not parse (a half-saved edit on the master: the next one is looked at)."""
    try:
        return open_acl(settings)
    except AclError as e:
        log.error("the master's ACL file cannot be used yet: %s", e)
        return None


def reload_acl(acl: Acl, watched: AclFile) -> None:
    """Called about once a second: new rules when the file changed and parses."""
    try:
        config = watched.changed()
    except AclError as e:
        acl.reload_errors += 1
        log.error("aclFile changed but cannot be used; the rules in force stay: %s", e)
        return
    if config is not None:
        acl.reload(config)
        log.info("aclFile reloaded: %d accounts", len(config.accounts))


# -- CURVE -------------------------------------------------------------------------------------------


def server_keys(settings) -> tuple[bytes, bytes]:
    """(public, secret) of the node, from `curveSecretKeyFile` (`mqnode keygen` wrote it)."""
    path = resolve(settings.curveSecretKeyFile)
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise SecurityError(f"curveEnable: cannot read the node's key pair {path} (make one with "
                            f"`scripts/mqnode keygen`): {e}") from None
    if not secret:
        raise SecurityError(f"curveEnable: {path} holds no secret key (give the .key_secret file)")
    return public, secret


def allowed_keys(settings) -> set[bytes] | None:
    """The client public keys `curveClientKeysDir` holds (its `*.key` files); None: any key."""
    if not settings.curveClientKeysDir:
        return None
    directory = resolve(settings.curveClientKeysDir)
    if not directory.is_dir():
        raise SecurityError(f"curveClientKeysDir {directory} is not a directory")
    return set(zmq.auth.load_certificates(directory))


def ha_link_keys(settings) -> dict[str, bytes] | None:
    """A slave's CURVE options for its link to a master with curveEnable (haMasterPublicKeyFile):
    the master's public key, and this node's key pair (curveSecretKeyFile, which the master's
    allow-list must hold; without one, a fresh pair, which only a master with no allow-list
    takes). None: a plaintext link."""
    if not settings.haMasterPublicKeyFile:
        return None
    path = resolve(settings.haMasterPublicKeyFile)
    try:
        master_public, _ = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise SecurityError(f"haMasterPublicKeyFile: cannot read the master's public key {path}: {e}") from None
    try:
        public, secret = server_keys(settings)
    except SecurityError:
        if settings.curveEnable:
            raise
        public, secret = zmq.curve_keypair()
    return {"curve_serverkey": master_public, "curve_publickey": public, "curve_secretkey": secret}


def secure_link(sock: zmq.Socket, keys: dict[str, bytes] | None) -> None:
    """A slave's DEALER to its master: CURVE with `ha_link_keys`, before it connects."""
    for option, value in (keys or {}).items():
        setattr(sock, option, value)


def secure_clients(sock: zmq.Socket, settings, context: zmq.Context) -> ClientKeys | None:
    """Make the front's ROUTER a CURVE server (before it binds); with an allow-list, start the ZAP
    handler that enforces it in this process. Returns the allow-list's watcher, or None."""
    if not settings.curveEnable:
        return None
    public, secret = server_keys(settings)
    keys = None
    if settings.curveClientKeysDir:
        keys = ClientKeys(settings, _identity(settings)["curvePublic"].encode())
        keys.start(context)
    sock.curve_server = True
    sock.curve_publickey = public
    sock.curve_secretkey = secret
    return keys


class ClientKeys:
    """The allow-list behind ZAP: the directory's keys (read again when the directory changes) and
    the node's own. pyzmq's authenticator thread asks `callback` at each CURVE handshake."""

    def __init__(self, settings, own_key: bytes):
        self.settings, self.own_key = settings, own_key
        self.directory = resolve(settings.curveClientKeysDir)
        self.lock = threading.Lock()
        self.stamp, self.keys = None, set()
        self.accepted = self.refused = 0
        self.authenticator = None

    def start(self, context: zmq.Context) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        self.authenticator = ThreadAuthenticator(context, log=logging.getLogger("mqnode.zap"))
        self.authenticator.start()
        self.authenticator.configure_curve_callback("*", credentials_provider=self)

    def callback(self, domain: str, key: bytes) -> bool:
        with self.lock:
            stamp = self.directory.stat().st_mtime_ns if self.directory.exists() else None
            if stamp != self.stamp:
                self.stamp = stamp
                self.keys = set(zmq.auth.load_certificates(self.directory)) if stamp is not None else set()
            allowed = key == self.own_key or key in self.keys
        self.accepted += allowed
        self.refused += not allowed
        return allowed

    def statistics(self) -> dict:
        return {"allowedKeys": len(self.keys), "handshakesAccepted": self.accepted, "handshakesRefused": self.refused}

    def stop(self) -> None:
        if self.authenticator is not None:
            self.authenticator.stop()
