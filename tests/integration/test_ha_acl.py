"""The HA link with the ACL on (`aclEnable`): a slave follows only after proving an account that
may replicate, over a fresh challenge; it then enforces its master's accounts itself. Real
`mqnode start` masters and slaves, a raw ZeroMQ link for the refusals, real files."""

from __future__ import annotations

import time

import orjson
import pytest
import zmq
from nodes import NodeProcess, free_port, node_settings

from actors import ha_link
from actors.acl import replication_header
from node import protocol
from node.client import Credentials, Producer, PullConsumer, SendError
from node.security import signature
from shm.control_block import peek
from shm.settings import SettingsError, load

pytestmark = pytest.mark.slow

REPLICA = ("replicaKey", "replica-secret")  # may follow (replication: true), nothing else
ROOTS = ("rootKey1", "root-secret")  # an admin: may follow too
ALICE = ("aliceKey", "alice-secret")  # a plain account: may not follow
ACL_YAML = f"""
accounts:
  - accessKey: {REPLICA[0]}
    secretKey: {REPLICA[1]}
    replication: true
  - accessKey: {ROOTS[0]}
    secretKey: {ROOTS[1]}
    admin: true
  - accessKey: {ALICE[0]}
    secretKey: {ALICE[1]}
    topicPerms: [Orders=PUB|SUB]
"""


def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {predicate}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def master(tmp_path_factory):
    """A SYNC_MASTER with the ACL on, holding a few signed sends."""
    directory = tmp_path_factory.mktemp("ha-acl")
    (directory / "plain_acl.yml").write_text(ACL_YAML)
    settings = node_settings(directory / "master", haListenPort=free_port(), brokerRole="SYNC_MASTER",
                             aclEnable=True, aclFile=str(directory / "plain_acl.yml"), syncFlushTimeout=1500)
    node = NodeProcess(settings, directory / "master.log").start()
    with Producer(settings.listen, credentials=Credentials(*ROOTS)) as producer:
        for i in range(20):
            producer.send("Orders", b"before-%d" % i)
    node.directory = directory
    yield node
    node.stop(strict=False)


GRACE_S = 0.5  # after a refusal: a master that then sent any byte of the log would send it at once


class RawSlave:
    """A slave's end of the zmq link, spoken by hand: what an unauthorised slave would send."""

    def __init__(self, settings):
        self.context = zmq.Context()
        self.sock = self.context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"tcp://127.0.0.1:{settings.ha_port}")
        self.hello = orjson.dumps({"brokerId": 7, "maxOffset": 0, "epochs": [], "endpoint": ""})

    def send(self, data: bytes) -> None:
        self.sock.send(data)

    def received(self, seconds: float = 2.0, *, last: bytes = b"") -> list[bytes]:
        """Everything the master sent within `seconds`, or until GRACE_S after a message of a
        kind in `last` (whatever a master sends right after it comes within that grace)."""
        out, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.sock.poll(50):
                out.append(self.sock.recv())
                if out[-1][:1] and out[-1][:1] in last:
                    deadline = min(deadline, time.monotonic() + GRACE_S)
        return out

    def challenge(self) -> str:
        self.send(ha_link.HELLO + self.hello)
        [answer] = self.received(5.0, last=ha_link.CHALLENGE)
        assert answer[:1] == ha_link.CHALLENGE, answer
        return ha_link.parse_challenge(answer[1:])

    def close(self) -> None:
        """Says goodbye, as a slave's ha-client does at its stop: a session the master welcomed
        ends at once, not haHousekeepingInterval later (until then it counts as a SYNC_MASTER's slave)."""
        self.send(ha_link.BYE)
        self.sock.close(200)
        self.context.term()


def proof(account: tuple[str, str], challenge: str, hello: bytes) -> bytes:
    return ha_link.proof_message(account[0], account[1], challenge, hello)


def refused_with(messages: list[bytes], words: str) -> None:
    """The master refused with a reason naming `words`, and sent no byte of the log."""
    assert not [m for m in messages if m[:1] in (ha_link.DATA, ha_link.WELCOME, ha_link.CONFIG)], messages
    reasons = [m[1:].decode() for m in messages if m[:1] == ha_link.REFUSED]
    assert reasons and words in reasons[0], messages


def test_an_unauthorised_slave_gets_no_byte_of_the_log(master):
    settings = master.settings
    cases = [
        ("no proof: a report instead", lambda link, c: link.send(ha_link.REPORT_KIND + ha_link.REPORT.pack(0)),
         "a message before the hello"),
        ("wrong secret", lambda link, c: link.send(proof((REPLICA[0], "not-the-secret"), c, link.hello)),
         "signature check failed"),
        ("unknown account", lambda link, c: link.send(proof(("nobodyKey", "nobody-secret"), c, link.hello)),
         "no ACL account"),
        ("an account that may not replicate", lambda link, c: link.send(proof(ALICE, c, link.hello)),
         "may not replicate"),
        ("another hello's proof", lambda link, c: link.send(proof(REPLICA, c, b'{"brokerId": 8}')),
         "signature check failed"),
        ("a malformed proof", lambda link, c: link.send(ha_link.PROOF + b"{not json"), "malformed proof"),
    ]
    for name, answer, words in cases:
        link = RawSlave(settings)
        try:
            answer(link, link.challenge())
            refused_with(link.received(last=ha_link.REFUSED), words)
        finally:
            link.close()
    # a hello alone (no proof) gets its challenge and nothing more
    link = RawSlave(settings)
    try:
        link.challenge()
        assert link.received(1.5) == []
    finally:
        link.close()
    assert peek(settings.root, "ha_slaves") == 0


def test_a_captured_proof_is_worth_nothing_on_another_connection(master):
    settings = master.settings
    first = RawSlave(settings)
    try:
        captured = proof(REPLICA, first.challenge(), first.hello)  # a proof the master would take ...
    finally:
        first.close()  # ... on a connection that is gone before it was sent
    replay = RawSlave(settings)
    try:
        replay.challenge()  # a fresh challenge: the captured proof does not sign it
        replay.send(captured)
        refused_with(replay.received(last=ha_link.REFUSED), "signature check failed")
    finally:
        replay.close()
    # while the same account, proving itself now, is welcomed
    honest = RawSlave(settings)
    try:
        honest.send(proof(REPLICA, honest.challenge(), honest.hello))
        kinds = [m[:1] for m in honest.received(1.5)]
        assert kinds[0] == ha_link.WELCOME and ha_link.DATA in kinds
    finally:
        honest.close()


def _slave(master, name: str, **overrides):
    directory = master.directory
    settings = node_settings(directory / name, brokerRole="SLAVE", brokerId=1, haListenPort=free_port(),
                             haMasterAddress=f"127.0.0.1:{master.settings.ha_port}", slaveReadEnable=True,
                             **overrides)
    return NodeProcess(settings, directory / f"{name}.log")


def _admin_ha(node, account=ROOTS) -> dict:
    with Producer(node.settings.listen, credentials=Credentials(*account)) as client:
        reply, _ = client.request({"code": protocol.GET_BROKER_HA_STATUS})
    return reply


def test_a_slave_without_credentials_follows_nothing_and_says_why(master):
    wait_until(lambda: peek(master.settings.root, "ha_slaves") == 0, 30)  # (a slave of another test gone)
    slave = _slave(master, "stranger").start()
    try:
        def refused() -> bool:
            follower = _admin_ha(slave).get("follower") or {}
            return "ACL is on" in follower.get("lastError", "")
        wait_until(refused, 30)
        assert peek(slave.settings.root, "written") == 0
        with Producer(master.settings.listen, credentials=Credentials(*ROOTS)) as producer:
            result = producer.send("Orders", b"unreplicated")
        assert result.status == "SLAVE_NOT_AVAILABLE"  # SYNC_MASTER: no slave acknowledged it
    finally:
        slave.stop(strict=False)


def test_an_authorised_slave_follows_acknowledges_and_enforces_its_masters_accounts(master):
    slave = _slave(master, "replica", haAccessKey=REPLICA[0], haSecretKey=REPLICA[1]).start()
    try:
        with Producer(master.settings.listen, credentials=Credentials(*ROOTS)) as producer:
            result = producer.send("Orders", b"replicated")
        assert result.status == "PUT_OK"  # SYNC_MASTER: the slave has it
        wait_until(lambda: peek(slave.settings.root, "dispatched") == peek(master.settings.root, "written"))
        wait_until(lambda: (slave.settings.root / "config" / "plain_acl.yml").exists())
        time.sleep(1.5)  # the slave's front looks for its master's ACL once a second
        with PullConsumer(slave.settings.listen) as anyone:  # unsigned: refused, as on the master
            with pytest.raises(SendError) as refused:
                anyone.pull("Orders", 0, 0, max_count=1)
            assert refused.value.status == "NO_PERMISSION"
        with PullConsumer(slave.settings.listen, credentials=Credentials(*ALICE)) as alice:
            bodies = {m.body for q in range(8) for m in alice.pull("Orders", q, 0, max_count=64).messages}
        assert bodies >= {b"before-%d" % i for i in range(20)} | {b"replicated"}
        shown = _admin_ha(master)
        assert shown["slavesFollowing"] == 1
    finally:
        slave.stop(strict=False)


def test_the_rocketmq_link_with_the_acl_is_refused_unless_allowed_by_name(tmp_path):
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL_YAML)
    values = {"aclEnable": "true", "aclFile": str(acl), "haProtocol": "rocketmq",
              "storePathRootDir": str(tmp_path / "store")}
    with pytest.raises(SettingsError, match="haAllowUnauthenticated"):
        load(None, values)
    assert load(None, values | {"haAllowUnauthenticated": "true"}).haProtocol == "rocketmq"


def test_the_proof_signs_the_challenge_and_the_hello_with_the_request_scheme():
    hello = b'{"brokerId": 1}'
    message = proof(REPLICA, "c" * 32, hello)
    sent = orjson.loads(message[1:])
    header = replication_header(REPLICA[0], "c" * 32)
    assert message[:1] == ha_link.PROOF and sent["accessKey"] == REPLICA[0]
    assert sent["signature"] == signature(REPLICA[1], header, hello)
    assert sent["signature"] != signature(REPLICA[1], replication_header(REPLICA[0], "d" * 32), hello)
