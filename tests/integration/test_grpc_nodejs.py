"""The gRPC proxy driven by Apache RocketMQ's official Node.js client (rocketmq-client-nodejs,
tests/nodejs/client.js): another language's client on another gRPC implementation (grpc-js, not
grpcio's C core), held to the answers the official Python client gets in test_grpc.py: sends of
every message type, simple and push consumption, redelivery, the dead-letter queue,
transactions with their checks, recalls, SQL92 filters, the ACL over TLS; and what one client
sends the other, or mqnode's own ZeroMQ client, reads the same."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from nodes import ROOT, NodeProcess, free_port, node_settings, nodejs, nodejs_missing, official

from node import protocol
from node.client import Producer, PullConsumer

pytestmark = [pytest.mark.slow]
if "no Node.js" in nodejs_missing():
    pytestmark.append(pytest.mark.skip(reason=nodejs_missing()))


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    missing = nodejs_missing()
    assert not missing, missing  # (node is here: its client's packages must be too)
    directory = tmp_path_factory.mktemp("grpc-nodejs")
    # retries back off from level 3 of these delay levels (1 s); a push consumer's messages are invisible
    # 3 s; its receives long-poll 3 s (its shutdown waits out the one in flight)
    settings = node_settings(directory / "store", runDir=str(directory / "run"), grpcServerPort=free_port(),
                             messageDelayLevel="1s 1s 1s 1s 1s 1s", defaultInvisibleTimeMills=3000,
                             grpcClientConsumerMaxLongPollingTimeoutMillis=3000,
                             renewAheadTimeMillis=1500, renewSliceTimeMillis=3000, transactionTimeOut=1000,
                             transactionCheckInterval=1000, enablePropertyFilter=True)
    process = NodeProcess(settings, directory / "node.log").start()
    yield process
    process.stop(strict=False)


def admin_group(node, group: str, **fields) -> None:
    with Producer(node.endpoint) as client:
        reply, _ = client.request({"code": protocol.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, "groupName": group, **fields})
        assert reply["status"] == "OK", reply


def no_errors(lines: list[dict]) -> list[dict]:
    assert not [line for line in lines if "error" in line], lines
    return lines


def test_sends_and_receives_round_trip_and_read_the_same_in_every_client(node):
    sent = no_errors(nodejs(node, "produce", "--topic", "N5Round", "--count", "20", "--tag", "TagA", "--keys", "k1"))
    sent += no_errors(nodejs(node, "produce", "--topic", "N5Round", "--count", "20", "--async", "--prefix", "a"))
    assert len(sent) == 40 and len({s["id"] for s in sent}) == 40
    got = nodejs(node, "simple", "--topic", "N5Round", "--group", "N5RoundG", "--want", "40", "--seconds", "30")
    assert sorted(g["id"] for g in got) == sorted(s["id"] for s in sent)
    first = next(g for g in got if g["body"] == "m0")
    assert first["tag"] == "TagA" and first["keys"] == ["k1"] and first["properties"] == {"index": "0"}
    assert {g["attempt"] for g in got} == {1} and {g["topic"] for g in got} == {"N5Round"}
    assert nodejs(node, "simple", "--topic", "N5Round", "--group", "N5RoundG", "--want", "1", "--seconds", "3") == []
    # the Python client and the ZeroMQ pull read what Node.js sent as it sent it
    python = official(node, "simple", "--topic", "N5Round", "--group", "N5RoundPy", "--want", "40", "--seconds", "30")
    assert sorted(g["id"] for g in python) == sorted(g["id"] for g in got)
    assert next(g for g in python if g["body"] == "m0") == first
    with PullConsumer(node.endpoint) as consumer:
        pulled = [m for q in range(8) for m in consumer.pull("N5Round", q, 0, max_count=64).messages]
    message = next(m for m in pulled if m.body == b"m0")
    assert (message.msg_id, message.tags, message.keys, message.properties["index"]) == (first["id"], "TagA", ["k1"], "0")


def test_what_python_and_zeromq_send_nodejs_reads_the_same(node):
    official(node, "produce", "--topic", "N5Cross", "--count", "1", "--tag", "T1", "--keys", "key1", "--prefix", "py")
    with Producer(node.endpoint) as producer:
        result = producer.send("N5Cross", b"from zmq", tags="T2", keys=["a", "b"], properties={"p": "v"})
    got = nodejs(node, "simple", "--topic", "N5Cross", "--group", "N5CrossG", "--want", "2", "--seconds", "20")
    by_body = {g["body"]: g for g in got}
    assert by_body["py0"]["tag"] == "T1" and by_body["py0"]["keys"] == ["key1"]
    assert by_body["py0"]["properties"] == {"index": "0"}
    zmq = by_body["from zmq"]
    assert (zmq["id"], zmq["tag"], zmq["keys"], zmq["properties"]) == (result.msg_id, "T2", ["a", "b"], {"p": "v"})


def test_unacked_messages_come_back_with_the_next_attempt_and_a_change_holds_them_longer(node):
    no_errors(nodejs(node, "produce", "--topic", "N5Back", "--count", "5"))
    began = time.monotonic()
    first = nodejs(node, "simple", "--topic", "N5Back", "--group", "N5BackG", "--want", "5", "--invisible", "2",
                   "--mode", "none")
    assert len(first) == 5 and {m["attempt"] for m in first} == {1}
    again = nodejs(node, "simple", "--topic", "N5Back", "--group", "N5BackG", "--want", "5", "--seconds", "20",
                   "--invisible", "2", "--mode", "change:30")
    assert sorted(m["body"] for m in again) == sorted(m["body"] for m in first)
    assert {m["attempt"] for m in again} == {2} and all(m["changed"] for m in again)
    assert time.monotonic() - began >= 2
    time.sleep(2.5)  # past the 2 s they were taken for: the change holds them 30 s
    assert nodejs(node, "simple", "--topic", "N5Back", "--group", "N5BackG", "--want", "1", "--seconds", "3") == []


def test_fifo_messages_of_a_group_keep_one_queue_and_a_fifo_group_consumes_them_in_order(node):
    # the Node.js client backs off only exponentially (with the default, CUSTOMIZED, its FIFO consumer
    # dead-letters a message at its first failure): the group says EXPONENTIAL, through the CLI
    policy = {"type": "EXPONENTIAL", "exponentialRetryPolicy": {"initial": 200, "max": 1000, "multiplier": 2}}
    made = subprocess.run([sys.executable, "-m", "node.tools.cli", "admin", "group", "create", "--endpoint", node.endpoint,
                           "--group", "N5FifoG", "--fifo", "true", "--max-retries", "3",
                           "--retry-policy", json.dumps(policy)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0 and json.loads(made.stdout)["groupRetryPolicy"] == policy, made.stderr
    for group in ("g1", "g2"):
        sent = nodejs(node, "produce", "--topic", "N5Fifo", "--count", "10", "--message-group", group, "--prefix", group)
        assert [s["offset"] for s in sent] == list(range(10)), sent  # one queue, in order
    got = nodejs(node, "push", "--topic", "N5Fifo", "--group", "N5FifoG", "--seconds", "60", "--fail-first", "1",
                 "--successes", "20")
    for group in ("g1", "g2"):
        mine = [m for m in got if m["group"] == group]
        assert [m["body"] for m in mine if m["result"] == "SUCCESS"] == [f"{group}{i}" for i in range(10)], mine
        # each failed once and came back before the next was handed out
        assert [m["body"] for m in mine] == [f"{group}{i}" for i in range(10) for _ in (1, 2)]


def test_a_delivery_timestamp_holds_a_message_and_a_recall_takes_one_back(node):
    sent_at = time.time()
    sent = no_errors(nodejs(node, "produce", "--topic", "N5Delay", "--count", "3", "--delay-ms", "3000", "--recall", "1"))
    ids, recalled = [s["id"] for s in sent if "id" in s], [s["recalled"] for s in sent if "recalled" in s]
    assert len(ids) == 3 and recalled == ids[:1]
    got = nodejs(node, "simple", "--topic", "N5Delay", "--group", "N5DelayG", "--want", "2", "--seconds", "20")
    assert sorted(m["id"] for m in got) == sorted(ids[1:]) and time.time() - sent_at >= 2.0
    assert nodejs(node, "simple", "--topic", "N5Delay", "--group", "N5DelayG", "--want", "1", "--seconds", "3") == []


def test_the_push_consumer_retries_and_the_node_dead_letters_past_retry_max_times(node):
    admin_group(node, "N5PushG", retryMaxTimes=1)
    no_errors(nodejs(node, "produce", "--topic", "N5Push", "--count", "3", "--prefix", "p"))
    got = nodejs(node, "push", "--topic", "N5Push", "--group", "N5PushG", "--seconds", "8", "--fail-first", "9")
    assert sorted((m["body"], m["attempt"]) for m in got) == [(f"p{i}", a) for i in range(3) for a in (1, 2)]
    with PullConsumer(node.endpoint) as consumer:
        deadline, dead = time.monotonic() + 10, []
        while len(dead) < 3 and time.monotonic() < deadline:
            dead = consumer.pull("%DLQ%N5PushG", 0, 0, max_count=10).messages
            time.sleep(0.2)
    assert sorted(m.body for m in dead) == [b"p0", b"p1", b"p2"]


def test_transactions_commit_roll_back_and_answer_the_nodes_checks(node):
    sent = no_errors(nodejs(node, "transaction", "--topic", "N5Tx", "--count", "3", "--end", "commit", "--prefix", "c"))
    sent += no_errors(nodejs(node, "transaction", "--topic", "N5Tx", "--count", "2", "--end", "rollback", "--prefix", "r"))
    assert len(sent) == 5 and all(s["transaction"] for s in sent)
    lines = nodejs(node, "transaction", "--topic", "N5Tx", "--count", "2", "--end", "none", "--prefix", "u",
                   "--check-answer", "commit", "--seconds", "8")
    checked = [line["checked"] for line in lines if "checked" in line]
    assert sorted(set(checked)) == sorted(line["id"] for line in lines if "transaction" in line), lines
    got = nodejs(node, "simple", "--topic", "N5Tx", "--group", "N5TxG", "--want", "5", "--seconds", "20")
    assert sorted(g["body"] for g in got) == ["c0", "c1", "c2", "u0", "u1"]
    assert nodejs(node, "simple", "--topic", "N5Tx", "--group", "N5TxG", "--want", "1", "--seconds", "3") == []


def test_a_sql92_filter_selects_and_a_tag_filter_selects(node):
    no_errors(nodejs(node, "produce", "--topic", "N5Sql", "--count", "10", "--tag", "TagA"))
    no_errors(nodejs(node, "produce", "--topic", "N5Sql", "--count", "2", "--tag", "TagB", "--prefix", "b"))
    got = nodejs(node, "simple", "--topic", "N5Sql", "--group", "N5SqlG", "--want", "3", "--seconds", "30",
                 "--filter", "index >= 7 AND TAGS = 'TagA'", "--sql")
    assert sorted(int(g["properties"]["index"]) for g in got) == [7, 8, 9], got
    tagged = nodejs(node, "simple", "--topic", "N5Sql", "--group", "N5TagG", "--want", "2", "--seconds", "30",
                    "--filter", "TagB")
    assert sorted(g["body"] for g in tagged) == ["b0", "b1"]


# -- the ACL, over TLS ---------------------------------------------------------------------------------

ALICE = ("aliceKey", "alice-secret")  # may send to Orders, and read it as group billing
ACL_YAML = f"""
accounts:
  - accessKey: {ALICE[0]}
    secretKey: {ALICE[1]}
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [Orders=PUB|SUB, Audit=SUB]
    groupPerms: [billing=SUB]
"""


@pytest.fixture(scope="module")
def acl_node(tmp_path_factory):
    """A node with the ACL on and TLS on its gRPC port (a self-signed certificate for 127.0.0.1)."""
    directory = tmp_path_factory.mktemp("grpc-nodejs-acl")
    (directory / "plain_acl.yml").write_text(ACL_YAML)
    cert, key = directory / "grpc.crt", directory / "grpc.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    settings = node_settings(directory / "store", runDir=str(directory / "run"), grpcServerPort=free_port(), aclEnable=True,
                             aclFile=str(directory / "plain_acl.yml"), grpcTlsCertFile=str(cert), grpcTlsKeyFile=str(key))
    process = NodeProcess(settings, directory / "node.log").start()
    yield process
    process.stop(strict=False)


def test_with_the_acl_over_tls_a_signed_client_does_what_its_account_may_and_nothing_else(acl_node):
    alice = {"ak": ALICE[0], "sk": ALICE[1]}
    no_errors(nodejs(acl_node, "produce", "--topic", "Orders", "--count", "3", **alice))
    got = nodejs(acl_node, "simple", "--topic", "Orders", "--group", "billing", "--want", "3", **alice)
    assert sorted(m["body"] for m in got) == ["m0", "m1", "m2"]
    assert nodejs(acl_node, "simple", "--topic", "Orders", "--group", "billing", "--want", "1", "--seconds", "3",
                  **alice) == []  # (acked: the acks went through the ACL too)
    refused = nodejs(acl_node, "produce", "--topic", "Audit", "--count", "1", **alice)
    assert "Forbidden" in refused[0]["error"], refused
    for wrong in ({"ak": ALICE[0], "sk": "guessed"}, {"ak": "nobody", "sk": "x"}):
        denied = nodejs(acl_node, "produce", "--topic", "Orders", "--count", "1", **wrong)
        assert "Unauthorized" in denied[0]["error"], (wrong, denied)
