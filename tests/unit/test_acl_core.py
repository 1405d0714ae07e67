"""The ACL's core (actors.acl) and the request signature (node.security): RocketMQ 4.9's
plain ACL rules, checked without a node."""

from __future__ import annotations

import base64
import hashlib
import hmac

import orjson
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from actors import ha_link
from node import protocol
from node.security import Credentials, canonical, signature_matches
from actors.acl import DENY, PUB, SUB, Acl, AclError, AclFile, AddressPattern, parse_config, parse_perm

ACL_YAML = """
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.{1,2}
accounts:
  - accessKey: RocketMQ
    secretKey: "12345678"
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      - groupA=DENY
      - groupB=PUB|SUB
      - groupC=SUB
  - accessKey: rocketmq2
    secretKey: "87654321"
    whiteRemoteAddress: 192.168.1.*
    admin: true
"""

INT64 = st.integers(-(2**63), 2**63 - 1)  # what a JSON header can carry
ALICE = Credentials("RocketMQ", "12345678")
ADMIN = Credentials("rocketmq2", "87654321")


@pytest.fixture
def acl():
    return Acl(parse_config(yaml.safe_load(ACL_YAML)))


def signed(credentials: Credentials, header: dict, body: bytes = b"") -> dict:
    return credentials.sign(dict(header, opaque=7), body)


def test_the_signature_is_hmac_sha1_over_the_values_in_name_order_then_the_body():
    header = {"topic": "T", "code": 10, "queueId": 3, "oneway": False, "properties": {"b": "2", "a": "1"},
              "accessKey": "RocketMQ", "none": None}
    content = b"RocketMQ" + b"10" + b"false" + b'{"a":"1","b":"2"}' + b"3" + b"T" + b"BODY"
    assert canonical(header, b"BODY") == content
    expected = base64.b64encode(hmac.new(b"12345678", content, hashlib.sha1).digest()).decode()
    assert ALICE.sign(dict(header), b"BODY")["signature"] == expected


@given(st.dictionaries(st.text(min_size=1).filter(lambda k: k != "signature"),
                       st.one_of(st.text(), INT64, st.booleans(), st.lists(INT64),
                                 st.dictionaries(st.text(), st.text())), max_size=8),
       st.binary(max_size=64))
def test_a_signed_header_verifies_after_a_json_round_trip_and_any_change_breaks_it(header, body):
    import orjson

    sent = orjson.loads(orjson.dumps(ALICE.sign(dict(header), body)))  # as the node parses it
    assert signature_matches("12345678", sent, body)
    assert not signature_matches("12345679", sent, body)
    assert not signature_matches("12345678", sent, body + b"x")
    assert not signature_matches("12345678", dict(sent, extra="x"), body)


def test_sends_need_pub_on_the_topic_and_retry_topics_sub_on_the_group(acl):
    send = {"code": protocol.SEND_MESSAGE, "topic": "topicB", "queueId": 0}
    assert acl.check(signed(ALICE, send, b"b"), b"b", None) is None
    assert "no PUB permission on topic topicC" in acl.check(signed(ALICE, dict(send, topic="topicC")), b"", None)
    assert "topic topicA" in acl.check(signed(ALICE, dict(send, topic="topicA")), b"", None)
    assert "topic other" in acl.check(signed(ALICE, dict(send, topic="other")), b"", None)  # default DENY
    assert acl.check(signed(ALICE, dict(send, topic="%RETRY%groupC")), b"", None) is None  # group SUB
    assert "group groupA" in acl.check(signed(ALICE, dict(send, topic="%RETRY%groupA")), b"", None)
    many = {"code": protocol.SEND_MESSAGES, "messages": [{"topic": "topicB"}, {"topic": "topicC"}]}
    assert "topic topicC" in acl.check(signed(ALICE, many), b"", None)
    assert acl.refused == 5 and acl.checked == 7


def test_pulls_and_offsets_need_sub_on_topic_and_group(acl):
    pull = {"code": protocol.PULL_MESSAGE, "topic": "topicC", "queueId": 0, "queueOffset": 0}
    assert acl.check(signed(ALICE, pull), b"", None) is None
    assert acl.check(signed(ALICE, dict(pull, consumerGroup="groupC")), b"", None) is None
    assert acl.check(signed(ALICE, dict(pull, consumerGroup="anyGroup")), b"", None) is None  # default SUB
    assert "group groupA" in acl.check(signed(ALICE, dict(pull, consumerGroup="groupA")), b"", None)
    assert "no SUB permission on topic topicA" in acl.check(signed(ALICE, dict(pull, topic="topicA")), b"", None)
    commit = {"code": protocol.UPDATE_CONSUMER_OFFSET, "topic": "topicB", "consumerGroup": "groupA",
              "queueId": 0, "commitOffset": 1}
    assert "group groupA" in acl.check(signed(ALICE, commit), b"", None)
    back = {"code": protocol.CONSUMER_SEND_MSG_BACK, "consumerGroup": "groupA", "offset": 0}
    assert "group groupA" in acl.check(signed(ALICE, back), b"", None)
    assert acl.check(signed(ALICE, dict(back, consumerGroup="groupB")), b"", None) is None
    retry = dict(pull, topic="%RETRY%groupC", consumerGroup="groupC")  # (a retry topic is its group)
    assert acl.check(signed(ALICE, retry), b"", None) is None
    assert "group groupA" in acl.check(signed(ALICE, dict(retry, topic="%RETRY%groupA")), b"", None)
    status = {"code": protocol.GET_CONSUMER_RUNNING_INFO, "consumerGroup": "groupA", "clientId": "1.2.3.4@x"}
    assert "group groupA" in acl.check(signed(ALICE, status), b"", None)  # (a member's stacks: SUB on its group)
    assert acl.check(signed(ALICE, dict(status, consumerGroup="groupC")), b"", None) is None
    direct = dict(status, code=protocol.CONSUME_MESSAGE_DIRECTLY, msgId="7F000001000027120000000000000000")
    assert "group groupA" in acl.check(signed(ALICE, direct), b"", None)
    answer = {"code": protocol.CLIENT_ANSWER, "askId": "ask-1", "status": "OK", "runningInfo": {}}
    assert acl.check(signed(ALICE, answer), b"", None) is None  # signature only: the front matches the connection


def test_admin_requests_need_an_admin_and_an_admin_without_lists_may_use_everything(acl):
    create = {"code": protocol.UPDATE_AND_CREATE_TOPIC, "topic": "New"}
    assert "needs admin" in acl.check(signed(ALICE, create), b"", None)
    assert acl.check(signed(ADMIN, create), b"", None) is None
    assert acl.check(signed(ADMIN, {"code": protocol.SEND_MESSAGE, "topic": "topicA"}), b"", None) is None
    assert acl.check(signed(ALICE, {"code": protocol.GET_ALL_TOPIC_CONFIG}), b"", None) is None  # signature only
    drain = b"brokerPermission=4\n"  # (UPDATE_BROKER_CONFIG's body is signed with its header)
    assert "needs admin" in acl.check(signed(ALICE, {"code": protocol.UPDATE_BROKER_CONFIG}, drain), drain, None)
    assert acl.check(signed(ADMIN, {"code": protocol.UPDATE_BROKER_CONFIG}, drain), drain, None) is None
    assert acl.check(signed(ALICE, {"code": protocol.GET_BROKER_CONFIG}), b"", None) is None


def test_unsigned_unknown_and_forged_requests_are_refused(acl):
    send = {"code": protocol.SEND_MESSAGE, "topic": "topicB", "opaque": 1}
    assert "no accessKey" in acl.check(dict(send), b"", None)
    assert "no ACL account for accessKey=nobody1" in acl.check(Credentials("nobody1", "12345678").sign(dict(send)),
                                                                b"", None)
    forged = signed(ALICE, send, b"body")
    assert "signature check failed" in acl.check(forged, b"another body", None)
    assert "signature check failed" in acl.check(dict(forged, topic="topicC"), b"body", None)


def test_white_listed_addresses_skip_every_check(acl):
    send = {"code": protocol.SEND_MESSAGE, "topic": "topicA", "opaque": 1}
    assert acl.check(dict(send), b"", "10.10.103.77") is None  # global: no account needed
    assert acl.check(dict(send), b"", "192.168.0.2") is None
    assert acl.check(dict(send), b"", "192.168.0.3") is not None
    admin_unsigned = dict(send, accessKey="rocketmq2")
    assert acl.check(admin_unsigned, b"", "192.168.1.9") is None  # the account's own white address
    assert "signature" in acl.check(admin_unsigned, b"", "192.168.2.9")


@pytest.mark.parametrize("pattern, address, matches", [
    ("*", "1.2.3.4", True), ("1.2.3.4", "1.2.3.4", True), ("1.2.3.4", "1.2.3.5", False),
    ("1.2.*.*", "1.2.200.7", True), ("1.2.3-10.*", "1.2.10.1", True), ("1.2.3-10.*", "1.2.11.1", False),
    ("1.2.3.{4,5}", "1.2.3.5", True), ("1.2.3.{4,5}", "1.2.3.6", False), ("::1", "::1", True),
    ("1.2.3.*", "::1", False),
])
def test_address_patterns(pattern, address, matches):
    assert AddressPattern(pattern).match(address) is matches


def test_permissions_and_broken_files_are_named():
    assert (parse_perm("PUB|SUB"), parse_perm("sub"), parse_perm("PUB"), parse_perm("nonsense")) == (PUB | SUB, SUB, PUB, DENY)
    for broken, says in [("accounts: 3", "must be a list"), ("[1, 2]", "mapping"),
                         ("accounts: [{accessKey: abc, secretKey: abcdefgh}]", "6 characters"),
                         ("accounts: [{accessKey: abcdefg, secretKey: abcdefgh, topicPerms: [noequals]}]", "NAME=PERM"),
                         ("globalWhiteRemoteAddresses: [not-an-address]", "address pattern")]:
        with pytest.raises(AclError, match=says):
            parse_config(yaml.safe_load(broken))


def test_the_file_is_reloaded_when_it_changes_and_a_broken_edit_keeps_the_rules(tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YAML)
    watched = AclFile(path)
    assert watched.changed() is None and set(watched.config.accounts) == {"RocketMQ", "rocketmq2"}
    path.write_text(ACL_YAML.replace("rocketmq2", "rocketmq3") + "\n")
    assert set(watched.changed().accounts) == {"RocketMQ", "rocketmq3"}
    path.write_text("accounts: [")
    with pytest.raises(AclError, match="not YAML"):
        watched.changed()
    assert watched.changed() is None  # the broken file is not read again until it changes


def test_only_an_account_that_may_replicate_and_signs_this_challenge_may_follow():
    """The HA link's check (actors.ha_link): the proof signs the hello and the master's challenge."""
    acl = Acl(parse_config(yaml.safe_load("""
accounts:
  - {accessKey: replica, secretKey: replica-secret, replication: true}
  - {accessKey: rootKey, secretKey: root-secret, admin: true}
  - {accessKey: plainKey, secretKey: plain-secret, defaultTopicPerm: PUB|SUB}
""")))
    hello, challenge = b'{"brokerId": 1, "maxOffset": 0}', "ab" * 16

    def refusal(access: str, secret: str, signed_challenge: str = challenge, signed_hello: bytes = hello):
        proof = orjson.loads(ha_link.proof_message(access, secret, signed_challenge, signed_hello)[1:])
        return acl.replication_refusal(proof, challenge, hello)

    assert refusal("replica", "replica-secret") is None
    assert refusal("rootKey", "root-secret") is None  # admin may too
    assert "may not replicate" in refusal("plainKey", "plain-secret")
    assert "signature check failed" in refusal("replica", "wrong-secret")
    assert "signature check failed" in refusal("replica", "replica-secret", signed_challenge="cd" * 16)  # replayed
    assert "signature check failed" in refusal("replica", "replica-secret", signed_hello=b'{"brokerId": 2}')
    assert "no ACL account" in refusal("nobody", "nobody-secret")
    assert "no accessKey" in acl.replication_refusal({}, challenge, hello)
    assert acl.statistics()["refused"] == 6 and acl.statistics()["checked"] == 8
