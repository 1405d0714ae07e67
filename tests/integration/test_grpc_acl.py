"""The gRPC proxy with the ACL on and TLS on its port: the official Python and Node.js clients
sign their calls (RocketMQ 5's MQv2-HMAC-SHA1), plain calls without a signature or with a wrong
one are UNAUTHORIZED, and each account does what its permissions allow and nothing else. A module
of its own, so that its node runs only while these run (tests/integration/test_grpc.py has the
rest)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import grpc
import pytest
from nodes import free_port, grpc_endpoint, nodejs, official, running_node
from test_grpc import Code, needs_nodejs, no_errors
from test_security import ACL_YAML, ALICE  # (Alice may send to Orders and read it as group billing)

from actors.proxy.apis import definition_pb2 as pb
from actors.proxy.apis import service_pb2 as rpc
from actors.proxy.apis import service_pb2_grpc
from node import protocol
from node.client import Producer


@pytest.fixture(scope="module")
def acl_node(tmp_path_factory):
    """A node with the ACL on and TLS on its gRPC port (a self-signed certificate for 127.0.0.1)."""
    directory = tmp_path_factory.mktemp("grpc-acl")
    (directory / "plain_acl.yml").write_text(ACL_YAML)
    cert, key = directory / "grpc.crt", directory / "grpc.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    yield from running_node(directory, grpcServerPort=free_port(), aclEnable=True, aclFile=str(directory / "plain_acl.yml"),
                            grpcTlsCertFile=str(cert), grpcTlsKeyFile=str(key))


def test_with_the_acl_a_signed_client_does_what_its_account_may_and_nothing_else(acl_node):
    alice = {"ak": ALICE[0], "sk": ALICE[1]}
    sent = official(acl_node, "produce", "--topic", "Orders", "--count", "3", **alice)
    assert len(sent) == 3 and not [s for s in sent if "error" in s], sent
    got = official(acl_node, "simple", "--topic", "Orders", "--group", "billing", "--want", "3", **alice)
    assert sorted(m["body"] for m in got) == ["m0", "m1", "m2"]
    assert official(acl_node, "simple", "--topic", "Orders", "--group", "billing", "--want", "1", "--seconds", "3",
                    **alice) == []  # (acked: the acks went through the ACL too)
    refused = official(acl_node, "produce", "--topic", "Audit", "--count", "1", **alice)
    assert "Forbidden" in refused[0]["error"] or "FORBIDDEN" in refused[0]["error"], refused
    for wrong in ({"ak": ALICE[0], "sk": "guessed"}, {"ak": "nobody", "sk": "x"}, {}):
        denied = official(acl_node, "produce", "--topic", "Orders", "--count", "1", **wrong)
        assert "error" in denied[0], (wrong, denied)
    official(acl_node, "produce", "--topic", "Orders", "--count", "2", "--prefix", "push", **alice)
    pushed = official(acl_node, "push", "--topic", "Orders", "--group", "billing", "--seconds", "20",
                      "--successes", "2", **alice)
    assert sorted(m["body"] for m in pushed) == ["push0", "push1"]


def test_with_the_acl_unsigned_and_badly_signed_calls_are_unauthorized_and_plaintext_gets_nowhere(acl_node):
    from actors.proxy import auth

    topic = rpc.QueryRouteRequest(topic=pb.Resource(name="Orders"))
    signed = auth.signature(ALICE[1], "20261127T120000Z")
    with grpc.insecure_channel(grpc_endpoint(acl_node)) as plain:
        with pytest.raises(grpc.RpcError) as refused:
            service_pb2_grpc.MessagingServiceStub(plain).QueryRoute(topic, timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    roots = grpc.ssl_channel_credentials(Path(acl_node.settings.grpcTlsCertFile).read_bytes())
    with grpc.secure_channel(grpc_endpoint(acl_node), roots) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        for metadata in ((), (("authorization", "MQv2-HMAC-SHA1 Credential=aliceKey"),),
                         (("authorization", f"MQv2-HMAC-SHA1 Credential=aliceKey, SignedHeaders=x-mq-date-time, "
                                            f"Signature={signed}"), ("x-mq-date-time", "20261127T120001Z"))):
            assert stub.QueryRoute(topic, metadata=metadata, timeout=10).status.code == Code.UNAUTHORIZED, metadata
        good = (("authorization", f"MQv2-HMAC-SHA1 Credential=aliceKey, SignedHeaders=x-mq-date-time, "
                                  f"Signature={signed}"), ("x-mq-date-time", "20261127T120000Z"))
        assert stub.QueryRoute(topic, metadata=good, timeout=10).status.code == Code.OK
        # a pull and its offsets go to the node as the account: its group's permission applies
        for group, code in (("billing", {Code.OK, Code.MESSAGE_NOT_FOUND}), ("other", {Code.FORBIDDEN})):
            pulled = list(stub.PullMessage(rpc.PullMessageRequest(
                group=pb.Resource(name=group), message_queue=pb.MessageQueue(topic=pb.Resource(name="Orders"), id=0),
                batch_size=8), metadata=good, timeout=10))
            assert pulled[0].status.code in code, (group, pulled)
            committed = stub.UpdateOffset(rpc.UpdateOffsetRequest(
                group=pb.Resource(name=group), message_queue=pb.MessageQueue(topic=pb.Resource(name="Orders"), id=0),
                offset=0), metadata=good, timeout=10)
            assert committed.status.code in code, (group, committed)
        # a consumer is a member as its account: of a group the account may read, not of another
        member = (*good, ("x-mq-client-id", "acl-member"))
        for group in ("billing", "other"):
            beat = stub.Heartbeat(rpc.HeartbeatRequest(group=pb.Resource(name=group), client_type=pb.SIMPLE_CONSUMER),
                                  metadata=member, timeout=10)
            assert beat.status.code == Code.OK  # (the client's heartbeat is the proxy's to take)
    from node.security import Credentials

    with Producer(acl_node.endpoint, credentials=Credentials(*ALICE)) as alice:
        listed, _ = alice.request({"code": protocol.GET_CONSUMER_CONNECTION_LIST, "consumerGroup": "billing"})
        assert [m["clientId"] for m in listed["connectionSet"]] == ["acl-member"]
        deadline = time.monotonic() + 5
        while True:  # (statistics come to the front once a second)
            proxy = alice.request({"code": protocol.GET_BROKER_RUNTIME_INFO})[0]["actors"]["proxy"]
            if proxy["membersRefused"] >= 1 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert proxy["membersRefused"] == 1  # (FORBIDDEN: no SUB on the group "other")


@needs_nodejs
def test_nodejs_with_the_acl_over_tls_a_signed_client_does_what_its_account_may_and_nothing_else(acl_node):
    alice = {"ak": ALICE[0], "sk": ALICE[1]}
    no_errors(nodejs(acl_node, "produce", "--topic", "Orders", "--count", "3", **alice))
    got = nodejs(acl_node, "simple", "--topic", "Orders", "--group", "billing", "--want", "3", **alice)
    assert sorted(m["body"] for m in got) == ["m0", "m1", "m2"]
    assert nodejs(acl_node, "simple", "--topic", "Orders", "--group", "billing", "--want", "1", "--seconds", "2",
                  **alice) == []  # (acked: the acks went through the ACL too)
    refused = nodejs(acl_node, "produce", "--topic", "Audit", "--count", "1", **alice)
    assert "Forbidden" in refused[0]["error"], refused
    for wrong in ({"ak": ALICE[0], "sk": "guessed"}, {"ak": "nobody", "sk": "x"}):
        denied = nodejs(acl_node, "produce", "--topic", "Orders", "--count", "1", **wrong)
        assert "Unauthorized" in denied[0]["error"], (wrong, denied)
