"""Access control and encryption end to end, with real `mqnode start` processes: RocketMQ's plain
ACL (signed requests, topic and group permissions, admin rights, reloads of the file) and ZeroMQ
CURVE (a plaintext or unknown client never gets a connection), through the Python client and the
`scripts/mqnode` commands."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request

import orjson
import pytest
import zmq
from nodes import ROOT, NodeProcess, free_port, node_settings

from node import protocol
from node.client import Credentials, Producer, PullConsumer, SendError

pytestmark = pytest.mark.slow

ALICE = ("aliceKey", "alice-secret")  # may send to Orders, read Orders as group billing
ROOTS = ("rootKey1", "root-secret")  # an admin
ACL_YAML = f"""
accounts:
  - accessKey: {ALICE[0]}
    secretKey: {ALICE[1]}
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [Orders=PUB|SUB, Audit=SUB, Secret=DENY]
    groupPerms: [billing=SUB]
  - accessKey: {ROOTS[0]}
    secretKey: {ROOTS[1]}
    admin: true
"""


def run_cli(*args: str, env: dict | None = None, stdin: str = "") -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MQNODE_")}
    return subprocess.run([sys.executable, "-m", "node.tools.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          input=stdin, env=clean | (env or {}), timeout=60)


def credentials(account: tuple[str, str]) -> Credentials:
    return Credentials(*account)


@pytest.fixture(scope="module")
def acl_node(tmp_path_factory):
    directory = tmp_path_factory.mktemp("acl")
    (directory / "plain_acl.yml").write_text(ACL_YAML)
    settings = node_settings(directory / "store", runDir=str(directory / "run"), aclEnable=True,
                             aclFile=str(directory / "plain_acl.yml"), metricsPort=free_port())
    node = NodeProcess(settings, directory / "node.log").start()
    node.acl_file = directory / "plain_acl.yml"
    yield node
    node.stop(strict=False)


def max_offset(node, topic: str, queue: int = 0) -> int:
    with Producer(node.endpoint, credentials=credentials(ROOTS)) as client:
        reply, _ = client.request({"code": protocol.GET_MAX_OFFSET, "topic": topic, "queueId": queue})
    return reply["offset"]


def test_signed_requests_with_permission_go_and_the_rest_are_refused_naming_what_is_missing(acl_node):
    stored_before = [max_offset(acl_node, "Audit"), max_offset(acl_node, "Secret")]  # (other tests' sends: any order)
    with Producer(acl_node.endpoint, credentials=credentials(ALICE)) as alice:
        sent = alice.send("Orders", b"order-1", queue_id=0)
        assert sent.status == "PUT_OK"
        with pytest.raises(SendError, match="no PUB permission on topic Audit") as refused:
            alice.send("Audit", b"forged", queue_id=0)
        assert refused.value.status == "NO_PERMISSION"
        with pytest.raises(SendError, match="NO_PERMISSION.*topic Secret"):
            alice.send_batch("Secret", [b"a", b"b"], queue_id=0)
    with Producer(acl_node.endpoint, credentials=Credentials()) as anonymous:
        with pytest.raises(SendError, match="no accessKey"):
            anonymous.send("Orders", b"unsigned", queue_id=0)
    with Producer(acl_node.endpoint, credentials=Credentials(ALICE[0], "not-her-secret")) as forger:
        with pytest.raises(SendError, match="signature check failed"):
            forger.send("Orders", b"forged", queue_id=0)
    assert [max_offset(acl_node, "Audit"), max_offset(acl_node, "Secret")] == stored_before  # nothing stored
    with PullConsumer(acl_node.endpoint, credentials=credentials(ALICE)) as consumer:
        result = consumer.pull("Orders", 0, sent.queue_offset, max_count=1, group="billing", suspend_ms=3000)
        assert [m.body for m in result.messages] == [b"order-1"]
        with pytest.raises(SendError, match="no SUB permission on group payroll"):
            consumer.pull("Orders", 0, 0, group="payroll")
        with pytest.raises(SendError, match="group payroll"):
            consumer.send_back(result.messages[0], "payroll")


def test_admin_commands_need_an_admin_account_given_by_flags_or_environment(acl_node):
    refused = run_cli("admin", "topic", "create", "--topic", "NewTopic", "--queues", "2", "--endpoint",
                      acl_node.endpoint, "--access-key", ALICE[0], "--secret-key", ALICE[1])
    assert refused.returncode != 0 and "NO_PERMISSION" in refused.stdout + refused.stderr
    assert "needs admin" in refused.stdout + refused.stderr
    done = run_cli("admin", "topic", "create", "--topic", "NewTopic", "--queues", "2", "--endpoint", acl_node.endpoint,
                   env={"MQNODE_ACCESS_KEY": ROOTS[0], "MQNODE_SECRET_KEY": ROOTS[1]})
    assert done.returncode == 0, done.stderr
    produced = run_cli("produce", "--topic", "Orders", "--queue", "1", "--endpoint", acl_node.endpoint,
                       "--access-key", ALICE[0], "--secret-key", ALICE[1], stdin="from the cli\n")
    assert produced.returncode == 0 and orjson.loads(produced.stdout.splitlines()[0])["status"] == "PUT_OK"
    unsigned = run_cli("produce", "--topic", "Orders", "--queue", "1", "--endpoint", acl_node.endpoint, stdin="x\n")
    assert unsigned.returncode != 0 and "NO_PERMISSION" in unsigned.stdout + unsigned.stderr
    stats = run_cli("admin", "stats", "--endpoint", acl_node.endpoint, "--access-key", ROOTS[0], "--secret-key", ROOTS[1])
    acl = orjson.loads(stats.stdout)["actors"]["front"]["acl"]
    assert acl["refused"] >= 2 and acl["accounts"] == 2
    # the node's own scrapes pass its ACL (actors.guard) and count the refusals
    scraped = urllib.request.urlopen(f"http://127.0.0.1:{acl_node.settings.metricsPort}/metrics", timeout=30).read()
    refused = [line for line in scraped.decode().splitlines() if line.startswith("mqnode_acl_refused_total ")]
    assert refused and float(refused[0].split()[1]) >= 2


def test_with_the_acl_a_member_signs_its_answers_and_asking_about_a_group_needs_sub_on_it(acl_node):
    """GET_CONSUMER_RUNNING_INFO and CONSUME_MESSAGE_DIRECTLY under the ACL: the member's
    CLIENT_ANSWER is signed like any request; the asker needs SUB on the group."""
    from node.client.push import CONSUME_SUCCESS, PushConsumer

    with Producer(acl_node.endpoint, credentials=credentials(ALICE)) as alice:
        sent = alice.send("Orders", b"for billing", queue_id=0)
    seen = []
    member = PushConsumer(acl_node.endpoint, "billing", credentials=credentials(ALICE), instance_name="signed")
    member.subscribe("Orders")
    member.register_listener(lambda messages: seen.extend(messages) or CONSUME_SUCCESS)
    member.start()
    try:
        client_id = member.inner.client_id
        status = run_cli("admin", "consumer-status", "--group", "billing", "--endpoint", acl_node.endpoint,
                         "--access-key", ALICE[0], "--secret-key", ALICE[1])
        assert status.returncode == 0, status.stderr
        assert "Orders@0" in orjson.loads(status.stdout)["consumers"][client_id]["mqTable"]
        direct = run_cli("query", "--msg-id", sent.offset_msg_id, "--group", "billing", "--client-id", client_id,
                         "--endpoint", acl_node.endpoint, "--access-key", ALICE[0], "--secret-key", ALICE[1])
        assert direct.returncode == 0, direct.stderr
        assert orjson.loads(direct.stdout.splitlines()[1])["consumeResult"]["consumeResult"] == "CR_SUCCESS"
        assert seen[-1].body == b"for billing"
        with Producer(acl_node.endpoint, credentials=credentials(ALICE)) as alice:
            reply, _ = alice.request({"code": protocol.GET_CONSUMER_RUNNING_INFO, "consumerGroup": "payroll",
                                      "clientId": client_id})
        assert reply["status"] == "NO_PERMISSION" and "payroll" in reply["remark"]
    finally:
        member.shutdown()


def sent_once_reloaded(producer, topic: str, failure: str) -> None:
    """A send that succeeds once the front has re-read the ACL file (it looks once a second)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            assert producer.send(topic, b"after the reload", queue_id=0).status == "PUT_OK"
            return
        except SendError:
            assert time.monotonic() < deadline, failure
            time.sleep(0.2)


def test_the_acl_file_is_reloaded_when_it_changes_and_a_broken_edit_keeps_the_rules(acl_node):
    bob = ("bobKey12", "bob-secret")
    with Producer(acl_node.endpoint, credentials=credentials(bob), retries=0) as client:
        with pytest.raises(SendError, match="no ACL account for accessKey=bobKey12"):
            client.send("Orders", b"x", queue_id=0)
        acl_node.acl_file.write_text(ACL_YAML + f"  - accessKey: {bob[0]}\n    secretKey: {bob[1]}\n"
                                                "    defaultTopicPerm: PUB\n")
        sent_once_reloaded(client, "Orders", "the changed ACL file was not picked up")
        acl_node.acl_file.write_text("accounts: [ {accessKey: ")  # a half-saved edit
        time.sleep(2.5)
        assert client.send("Orders", b"still bob", queue_id=0).status == "PUT_OK"
    with Producer(acl_node.endpoint, credentials=credentials(ROOTS)) as root:
        info, _ = root.request({"code": protocol.GET_BROKER_RUNTIME_INFO})
    assert info["actors"]["front"]["acl"]["reloadErrors"] >= 1
    # each reload and each refused edit is a line of the node's log, on its stderr (node.server.logs)
    lines = acl_node.log.read_text().splitlines()
    front_pid = info["actors"]["front"]["pid"]
    assert any(re.fullmatch(rf"\S+ INFO front\[{front_pid}\] aclFile reloaded: 3 accounts", line) for line in lines)
    assert any(f"ERROR front[{front_pid}] aclFile changed but cannot be used" in line for line in lines)
    # a white-listed address needs no account (the front reads each request's peer address then)
    acl_node.acl_file.write_text("globalWhiteRemoteAddresses: [127.0.0.*]\n" + ACL_YAML)
    with Producer(acl_node.endpoint, credentials=Credentials(), retries=0) as anonymous:
        sent_once_reloaded(anonymous, "Secret", "the white list was not picked up")
        acl_node.acl_file.write_text(ACL_YAML)  # the rules as they were, in force before the next test
        deadline = time.monotonic() + 10
        while anonymous.request({"code": protocol.GET_MAX_OFFSET, "topic": "Secret", "queueId": 0})[0]["status"] == "OK":
            assert time.monotonic() < deadline, "the white list stayed"
            time.sleep(0.2)


# -- CURVE ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def curve_node(tmp_path_factory):
    directory = tmp_path_factory.mktemp("curve")
    made = run_cli("keygen", "--dir", str(directory / "keys"), "--name", "node")
    assert made.returncode == 0, made.stderr
    client = run_cli("keygen", "--dir", str(directory / "clients"), "--name", "app")
    assert client.returncode == 0, client.stderr
    (directory / "clients" / "app.key_secret").rename(directory / "app.key_secret")  # the node keeps public keys only
    (directory / "acl.yml").write_text(ACL_YAML)
    settings = node_settings(directory / "store", runDir=str(directory / "run"), curveEnable=True,
                             curveSecretKeyFile=str(directory / "keys" / "node.key_secret"),
                             curveClientKeysDir=str(directory / "clients"), aclEnable=True,
                             aclFile=str(directory / "acl.yml"))
    node = NodeProcess(settings, directory / "node.log").start()  # its own probes pass both
    node.server_key = str(directory / "keys" / "node.key")
    node.client_key = str(directory / "app.key_secret")
    node.directory = directory
    yield node
    node.stop(strict=False)


def test_an_allowed_curve_client_is_served_and_plaintext_or_unknown_ones_never_connect(curve_node):
    allowed = Credentials.of(*ALICE, server_key=curve_node.server_key, client_key_file=curve_node.client_key)
    with Producer(curve_node.endpoint, credentials=allowed) as producer:
        assert producer.send("Orders", b"sealed", queue_id=0).status == "PUT_OK"
    with PullConsumer(curve_node.endpoint, credentials=allowed) as consumer:
        assert [m.body for m in consumer.pull("Orders", 0, 0, group="billing", suspend_ms=3000).messages] == [b"sealed"]
    for stranger in (Credentials(*ALICE),  # plaintext
                     Credentials.of(*ALICE, server_key=curve_node.server_key),  # a key not in the allow-list
                     Credentials.of(*ALICE, server_key=zmq.curve_keypair()[0], client_key_file=curve_node.client_key)):
        with Producer(curve_node.endpoint, credentials=stranger, timeout=1.0, retries=0) as producer:
            with pytest.raises(SendError, match="TIMEOUT|no connection to the node is up"):
                producer.send("Orders", b"never", queue_id=0)
    # the same through the command line: the node's public key file and the client's key pair
    produced = run_cli("produce", "--topic", "Orders", "--queue", "0", "--endpoint", curve_node.endpoint,
                       "--server-key", curve_node.server_key, "--client-key", curve_node.client_key,
                       "--access-key", ALICE[0], "--secret-key", ALICE[1], stdin="via cli\n")
    assert produced.returncode == 0, produced.stdout + produced.stderr
    with Producer(curve_node.endpoint, credentials=Credentials.of(*ROOTS, server_key=curve_node.server_key,
                                                                  client_key_file=curve_node.client_key)) as root:
        info, _ = root.request({"code": protocol.GET_BROKER_RUNTIME_INFO})
    curve = info["actors"]["front"]["curve"]
    assert curve["handshakesRefused"] >= 1 and curve["handshakesAccepted"] >= 2


def test_keygen_refuses_to_overwrite_a_key_pair(curve_node):
    again = run_cli("keygen", "--dir", str(curve_node.directory / "keys"), "--name", "node")
    assert again.returncode != 0 and "exists" in again.stderr
