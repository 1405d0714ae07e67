"""actors.proxy.members: gRPC consumers as the node's group members, and the node's asks of them
turned into RocketMQ 5's Telemetry commands and back, with a mock clock."""

from __future__ import annotations

from actors.proxy import members
from actors.proxy.apis import definition_pb2 as pb
from actors.proxy.apis import service_pb2 as rpc
from actors.proxy.sessions import Client
from node import protocol

Code = pb.Code


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def push_client(client_id: str = "c1") -> Client:
    client = Client(client_id, client_type=pb.PUSH_CONSUMER, group="g", language="JAVA", version="5.0.7")
    settings = pb.Settings(client_type=pb.PUSH_CONSUMER)
    for topic, kind, expression in (("T", pb.TAG, "a || b"), ("S", pb.SQL, "x > 1"), ("bad topic!", pb.TAG, "*")):
        entry = settings.subscription.subscriptions.add()
        entry.topic.name, entry.expression.type, entry.expression.expression = topic, kind, expression
    client.subscriptions = members.subscriptions_of(settings)
    return client


def ask(code: int, ask_id: str = "a1", **fields) -> dict:
    return {"code": code, "askId": ask_id, "consumerGroup": "g", "clientId": "c1", **fields}


def telemetry(kind: str, nonce: str, code: int = Code.OK) -> rpc.TelemetryCommand:
    """A client's Telemetry command of `kind` (thread_stack_trace, verify_message_result, ...)."""
    command = rpc.TelemetryCommand(status=pb.Status(code=code))
    getattr(command, kind).nonce = nonce
    return command


def test_a_consumer_heartbeats_as_a_member_under_its_own_id_and_others_do_not():
    client = push_client()
    beat = members.heartbeat(client)
    assert beat["clientID"] == "c1" and (beat["language"], beat["version"]) == ("JAVA", "5.0.7")
    (data,) = beat["consumerDataSet"]
    assert (data["groupName"], data["consumeType"], data["messageModel"]) == ("g", "CONSUME_PASSIVELY", "CLUSTERING")
    assert data["subscriptionDataSet"] == [{"topic": "T", "subString": "a || b", "expressionType": "TAG"},
                                           {"topic": "S", "subString": "x > 1", "expressionType": "SQL92"}]
    assert members.unregister(client) == {"code": protocol.UNREGISTER_CLIENT, "clientID": "c1", "consumerGroup": "g"}
    simple = Client("c2", client_type=pb.SIMPLE_CONSUMER, group="g")
    assert members.heartbeat(simple)["consumerDataSet"][0]["consumeType"] == "CONSUME_ACTIVELY"
    for other in (Client("p", client_type=pb.PRODUCER), Client("n", client_type=pb.PUSH_CONSUMER)):  # (no group)
        assert members.heartbeat(other) is None and members.unregister(other) is None


def test_running_info_without_stacks_is_answered_by_the_proxy_at_once():
    asks = members.Asks(Clock())
    command, answer = asks.ask(ask(protocol.GET_CONSUMER_RUNNING_INFO, jstackEnable=False), None, push_client(), True)
    assert command is None and answer["status"] == "OK" and answer["askId"] == "a1"
    info = answer["runningInfo"]
    assert info["properties"]["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY" and info["properties"]["PROP_CLIENT_LANGUAGE"] == "JAVA"
    assert [s["topic"] for s in info["subscriptionSet"]] == ["T", "S"] and "jstack" not in info
    assert not asks.pending


def test_stacks_go_down_the_stream_by_nonce_and_only_the_asked_clients_answer_counts_once():
    clock, client = Clock(), push_client()
    asks = members.Asks(clock)
    command, answer = asks.ask(ask(protocol.GET_CONSUMER_RUNNING_INFO, jstackEnable=True), None, client, True)
    assert answer is None and command.print_thread_stack_trace_command.nonce == "a1"
    reply = telemetry("thread_stack_trace", "a1")
    reply.thread_stack_trace.thread_stack_trace = "main at Foo.java:12"
    assert asks.answer("someone-else", reply) is None  # (a forger who guessed the nonce)
    answered = asks.answer("c1", reply)
    assert answered["status"] == "OK" and answered["runningInfo"]["jstack"] == "main at Foo.java:12"
    assert asks.answer("c1", reply) is None and asks.statistics()["asks"]["dropped"] == 2
    asks.ask(ask(protocol.GET_CONSUMER_RUNNING_INFO, "a2", jstackEnable=True), None, client, True)
    refused = asks.answer("c1", telemetry("thread_stack_trace", "a2", Code.NOT_IMPLEMENTED))
    assert refused["status"] == "SYSTEM_ERROR" and "gave no stacks: NOT_IMPLEMENTED" in refused["remark"]


def test_a_verify_carries_the_message_and_the_clients_code_is_rocketmqs_verdict():
    clock, client = Clock(), push_client()
    asks = members.Asks(clock)
    message = pb.Message(body=b"payload")
    message.topic.name = "T"
    verdicts = {}
    for n, code in enumerate((Code.OK, Code.FAILED_TO_CONSUME_MESSAGE, Code.MESSAGE_CORRUPTED)):
        command, _ = asks.ask(ask(protocol.CONSUME_MESSAGE_DIRECTLY, f"v{n}", msgId="M"), message, client, True)
        assert command.verify_message_command.nonce == f"v{n}" and command.verify_message_command.message.body == b"payload"
        clock.now += 0.25
        answered = asks.answer("c1", telemetry("verify_message_result", f"v{n}", code))["consumeResult"]
        verdicts[code] = answered["consumeResult"]
        assert answered["spentTimeMills"] == 250
    assert verdicts == {Code.OK: "CR_SUCCESS", Code.FAILED_TO_CONSUME_MESSAGE: "CR_LATER",
                        Code.MESSAGE_CORRUPTED: "CR_RETURN_NULL"}
    # the Node.js client's way of declining: its VerifyMessageCommand back, NOT_IMPLEMENTED
    asks.ask(ask(protocol.CONSUME_MESSAGE_DIRECTLY, "v9", msgId="M"), message, client, True)
    refused = asks.answer("c1", telemetry("verify_message_command", "v9", Code.NOT_IMPLEMENTED))
    assert refused["status"] == "SYSTEM_ERROR" and "no verdict on the message: NOT_IMPLEMENTED" in refused["remark"]


def test_no_stream_no_message_too_many_and_unanswered_asks_are_bounded():
    clock, client = Clock(), push_client()
    asks = members.Asks(clock)
    _, no_stream = asks.ask(ask(protocol.GET_CONSUMER_RUNNING_INFO, jstackEnable=True), None, client, False)
    assert no_stream["status"] == "SYSTEM_ERROR" and "no Telemetry stream" in no_stream["remark"]
    _, unread = asks.ask(ask(protocol.CONSUME_MESSAGE_DIRECTLY, msgId="M"), None, client, True)
    assert unread["status"] == "SYSTEM_ERROR"
    for n in range(members.MAX_ASKS):
        command, _ = asks.ask(ask(protocol.GET_CONSUMER_RUNNING_INFO, f"k{n}", jstackEnable=True), None, client, True)
        assert command is not None
    _, busy = asks.ask(ask(protocol.GET_CONSUMER_RUNNING_INFO, "over", jstackEnable=True), None, client, True)
    assert busy["status"] == "SYSTEM_BUSY"
    clock.now += members.MAX_WAIT_S - 1
    assert asks.expire() == 0
    clock.now += 2
    assert asks.expire() == members.MAX_ASKS and not asks.pending
    assert asks.answer("c1", rpc.TelemetryCommand(settings=pb.Settings())) is None  # (not an answer)
