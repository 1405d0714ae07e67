"""Transactional messages on a real node (docs/protocol.md "Transactions"): a commit is visible
once, a rollback never, an open half is checked and ended by a producer of its group (another
one when its own was killed -9), discarded when none answers; kill -9 of the transaction service
and of the whole node between a half and its outcome, and a slave promoted mid-transaction."""

from __future__ import annotations

import asyncio
import collections
import subprocess
import sys
import textwrap
import threading
import time

import orjson
import psutil
import pytest
from helpers import BORN, STORE_HOST, open_store, put, wait_until
from nodes import ROOT, NodeProcess, free_port, node_settings

from actors.reput import REPUT_TIMEOUT_S
from node import protocol
from node.client import (
    AsyncTransactionProducer,
    COMMIT_MESSAGE,
    Message,
    ROLLBACK_MESSAGE,
    UNKNOW,
    Producer,
    PullConsumer,
    SendError,
    TransactionProducer,
)
from shm.codec import TRANS_CHECK_MAX_TIME_TOPIC, TRANSACTION_COMMIT, TRANSACTION_MASK, decode, decode_msg_id, encode

pytestmark = pytest.mark.slow

FAST_CHECKS = {"transactionTimeOut": 1000, "transactionCheckInterval": 1000, "transactionCheckMax": 3}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    directory = tmp_path_factory.mktemp("transactions")
    process = NodeProcess(node_settings(directory / "store", **FAST_CHECKS), directory / "node.log").start()
    yield process
    process.stop(strict=False)


@pytest.fixture(scope="module")
def patient_node(tmp_path_factory):
    """A node for the tests that stop its writer for seconds: no fast failure (a re-put waiting in
    the send queue is not refused) and a hang timeout past the stop (the writer is not killed).
    Two ingress workers, the harder case for these tests: a service's re-puts and the barriers
    behind them must keep to one of them (with none, the default, the writer takes them in order
    itself)."""
    directory = tmp_path_factory.mktemp("patient")
    settings = node_settings(directory / "store", brokerFastFailureEnable=False, processHangTimeoutMillis=60000,
                             ingressWorkers=2, **FAST_CHECKS)
    process = NodeProcess(settings, directory / "node.log").start()
    yield process
    process.stop(strict=False)


def visible(endpoint: str, topic: str, queues: int = 8) -> list:
    """Every message a consumer can read in `topic`, queue by queue from offset 0."""
    out = []
    with PullConsumer(endpoint) as consumer:
        for queue in range(queues):
            offset = 0
            while True:
                try:
                    result = consumer.pull(topic, queue, offset, max_count=32)
                except SendError as e:
                    assert e.status == "TOPIC_NOT_EXIST", e
                    return out
                if not result.messages:
                    break
                out += result.messages
                offset = result.next_begin_offset
    return out


def producers_of(endpoint: str, group: str) -> list[str]:
    """The clientIDs the node can ask about the group's halves now (GET_PRODUCER_CONNECTION_LIST)."""
    with Producer(endpoint) as client:
        reply, _ = client.request({"code": protocol.GET_PRODUCER_CONNECTION_LIST, "producerGroup": group})
    return [c["clientId"] for c in reply["connectionSet"]]


def state(endpoint: str) -> dict:
    with Producer(endpoint) as client:
        reply, _ = client.request({"code": protocol.GET_TRANSACTION_STATE})
    assert reply["status"] == "OK", reply
    return reply


def end(endpoint: str, sent, group: str, outcome: int, timeout: float = 3.0) -> dict:
    with Producer(endpoint, retries=0, timeout=timeout) as client:
        reply, _ = client.request({"code": protocol.END_TRANSACTION, "producerGroup": group,
                                   "tranStateTableOffset": sent.queue_offset,
                                   "commitLogOffset": decode_msg_id(sent.offset_msg_id)[1],
                                   "commitOrRollback": outcome})
    return reply


def test_a_producer_group_no_node_takes_is_refused_at_once_and_a_failed_start_leaves_nothing_pending():
    """A transactional producer's or requester's group is checked as a consumer group is (it was the
    node's SYSTEM_ERROR at the start's heartbeat), and a start whose heartbeat fails closes its
    producer: its reaper task was destroyed pending with the loop ("Task was destroyed but it is
    pending!" on stderr at the exit)."""
    from node.client import Requester

    for group in ("bad group!", "x" * 300):
        with pytest.raises(ValueError, match="producer group"):
            TransactionProducer("tcp://127.0.0.1:1", group)
        with pytest.raises(ValueError, match="producer group"):
            Requester("tcp://127.0.0.1:1", group)
    script = textwrap.dedent(f"""
        from node.client import Requester, SendError, TransactionProducer
        for make in (TransactionProducer, Requester):
            try:
                make("tcp://127.0.0.1:{free_port()}", "Nobody", timeout=0.5, retries=0)
            except SendError as e:
                print(e.status)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["TIMEOUT", "TIMEOUT"] and "destroyed" not in done.stderr, done.stderr


def test_a_commit_is_visible_once_and_a_rollback_never(node):
    with TransactionProducer(node.endpoint, "PG-basic", execute=lambda message, arg: arg) as producer:
        committed = [producer.send_in_transaction("TxBasic", f"commit-{i}", COMMIT_MESSAGE) for i in range(20)]
        rolled = [producer.send_in_transaction("TxBasic", f"rollback-{i}", ROLLBACK_MESSAGE) for i in range(20)]
    assert {r.end_status for r in committed + rolled} == {"OK"}
    assert {r.local_transaction_state for r in committed} == {COMMIT_MESSAGE}
    seen = visible(node.endpoint, "TxBasic")
    assert sorted(m.body for m in seen) == sorted(f"commit-{i}".encode() for i in range(20))
    assert {m.msg_id for m in seen} == {r.msg_id for r in committed}  # the transaction id is the message's
    raw = [m for m in seen][0]
    assert raw.properties["TRAN_MSG"] == "true" and raw.properties["PGROUP"] == "PG-basic"


def test_a_second_end_changes_nothing(node):
    with TransactionProducer(node.endpoint, "PG-twice", execute=lambda message, arg: arg) as producer:
        sent = producer.send_in_transaction("TxTwice", "once", COMMIT_MESSAGE)
        dropped = producer.send_in_transaction("TxTwice", "never", ROLLBACK_MESSAGE)
    again = end(node.endpoint, sent, "PG-twice", 8)
    assert again["status"] == "OK" and again["outcome"] == "commit"
    flipped = end(node.endpoint, dropped, "PG-twice", 8)  # a commit after the rollback: still rolled back
    assert flipped["status"] == "OK" and flipped["outcome"] == "rollback" and "ended already" in flipped["remark"]
    assert [m.body for m in visible(node.endpoint, "TxTwice")] == [b"once"]
    wrong = end(node.endpoint, sent, "PG-other", 8)
    assert wrong["status"] == "SYSTEM_ERROR" and "producer group" in wrong["remark"]
    nowhere = end(node.endpoint, sent._replace(queue_offset=sent.queue_offset + 10_000), "PG-twice", 8)
    assert nowhere["status"] == "SYSTEM_ERROR" and "no half message" in nowhere["remark"]


def test_the_committed_message_names_its_half(node):
    with TransactionProducer(node.endpoint, "PG-layout", execute=lambda message, arg: COMMIT_MESSAGE) as producer:
        sent = producer.send_in_transaction("TxLayout", "x", tags="TagT", keys=["k1"])
    message = visible(node.endpoint, "TxLayout")[0]
    with Producer(node.endpoint) as client:
        reply, body = client.request({"code": protocol.VIEW_MESSAGE_BY_ID, "offsetMsgId": message.offset_msg_id})
    assert reply["status"] == "OK", reply
    record = decode(body)
    assert record.sys_flag & TRANSACTION_MASK == TRANSACTION_COMMIT
    assert record.prepared_transaction_offset == decode_msg_id(sent.offset_msg_id)[1]
    assert message.tags == "TagT" and message.keys == ["k1"]


def test_unknown_halves_are_checked_and_ended_by_the_answer(node):
    answers = {}

    def check(message):
        return answers[message.body]

    with TransactionProducer(node.endpoint, "PG-check", execute=lambda message, arg: UNKNOW, check=check) as producer:
        for i in range(10):
            answers[f"c{i}".encode()] = COMMIT_MESSAGE
            answers[f"r{i}".encode()] = ROLLBACK_MESSAGE
            producer.send_in_transaction("TxCheck", f"c{i}")
            producer.send_in_transaction("TxCheck", f"r{i}")
        assert visible(node.endpoint, "TxCheck") == []
        wait_until(lambda: producer.checks_answered >= 20, 15, "the checks")
    seen = wait_until(lambda: len(visible(node.endpoint, "TxCheck")) >= 10 and visible(node.endpoint, "TxCheck"), 5,
                      "the commits")
    assert sorted(m.body for m in seen) == sorted(f"c{i}".encode() for i in range(10))
    assert seen[0].topic == "TxCheck"


def test_a_check_names_the_half_as_its_send_was_answered(node):
    """CHECK_TRANSACTION_STATE's header names the half as the producer knows it: `msgId` and
    `transactionId` its UNIQ_KEY, `offsetMsgId` and `tranStateTableOffset` what its send answered."""
    async def scenario():
        checks = []
        async with AsyncTransactionProducer(node.endpoint, "PG-ids", execute=lambda message, arg: UNKNOW) as producer:
            answer = producer._on_request
            producer.producer.on_request = lambda header, body: (checks.append(header), answer(header, body))
            sent = await producer.send_in_transaction("TxIds", "open")
            for _ in range(300):
                if checks:
                    break
                await asyncio.sleep(0.05)
        return sent, checks

    sent, checks = asyncio.run(scenario())
    assert checks, "no check came in 15 s"
    assert checks[0]["msgId"] == checks[0]["transactionId"] == sent.msg_id
    assert checks[0]["offsetMsgId"] == sent.offset_msg_id and checks[0]["tranStateTableOffset"] == sent.queue_offset
    assert checks[0]["commitLogOffset"] == decode_msg_id(sent.offset_msg_id)[1]
    assert end(node.endpoint, sent, "PG-ids", 12)["status"] == "OK"  # (closed: no open half left for the others)


def test_an_exception_in_the_local_transaction_leaves_it_open(node):
    def boom(message, arg):
        raise RuntimeError("the local transaction failed")

    with TransactionProducer(node.endpoint, "PG-boom", execute=boom,
                             check=lambda message: ROLLBACK_MESSAGE) as producer:
        result = producer.send_in_transaction("TxBoom", "b")
        assert result.local_transaction_state is UNKNOW
        wait_until(lambda: producer.checks_answered >= 1, 15, "the check")
    assert visible(node.endpoint, "TxBoom") == []


PRODUCER = textwrap.dedent("""
    import sys, time
    from node.client import TransactionProducer
    def stuck(message, arg):
        print("half", flush=True)
        time.sleep(3600)
    with TransactionProducer(sys.argv[1], "PG-killed", execute=stuck) as producer:
        producer.send_in_transaction("TxKilled", "orphan")
""")


def test_a_half_of_a_killed_producer_is_ended_by_another_of_its_group(node):
    child = subprocess.Popen([sys.executable, "-c", PRODUCER, node.endpoint], cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"half\n"  # stored, its local transaction under way
        with TransactionProducer(node.endpoint, "PG-killed", check=lambda message: COMMIT_MESSAGE) as other:
            def connected() -> int:  # `admin producers` (mqadmin producerConnection): who a check may reach
                shown = subprocess.run([sys.executable, "-m", "node.tools.cli", "admin", "producers", "--group",
                                        "PG-killed", "--endpoint", node.endpoint], cwd=ROOT, capture_output=True,
                                       timeout=60, check=True)
                return len(orjson.loads(shown.stdout)["connectionSet"])
            wait_until(lambda: connected() == 2, 10, "both producers of the group connected")
            child.kill()  # kill -9, mid-transaction
            child.wait(10)
            wait_until(lambda: other.checks_answered >= 1, 20, "the other producer's check")
        seen = wait_until(lambda: visible(node.endpoint, "TxKilled"), 5, "the commit")
        assert [m.body for m in seen] == [b"orphan"]
    finally:
        child.kill()


def test_a_half_nobody_answers_is_discarded_after_transaction_check_max(node):
    discarded = state(node.endpoint)["discarded"]
    with TransactionProducer(node.endpoint, "PG-gone", execute=lambda message, arg: UNKNOW) as producer:
        sent = producer.send_in_transaction("TxGone", "nobody-answers")
    # three checks a second apart reach no producer; then it goes to TRANS_CHECK_MAX_TIME_TOPIC
    kept = wait_until(lambda: [m for m in visible(node.endpoint, TRANS_CHECK_MAX_TIME_TOPIC, 1)
                               if m.msg_id == sent.msg_id], 15, "the discard")
    assert kept[0].body == b"nobody-answers" and kept[0].properties["REAL_TOPIC"] == "TxGone"
    assert visible(node.endpoint, "TxGone") == []
    assert end(node.endpoint, sent, "PG-gone", 8)["outcome"] == "discard"  # too late: nothing changes
    assert visible(node.endpoint, "TxGone") == []
    assert state(node.endpoint)["discarded"] >= discarded + 1


def test_a_kill_of_the_transaction_service_between_half_and_outcome(node):
    with TransactionProducer(node.endpoint, "PG-svc", execute=lambda message, arg: arg) as producer:
        done = producer.send_in_transaction("TxSvc", "before", COMMIT_MESSAGE)
        open_half = producer.send_in_transaction("TxSvc", "open", UNKNOW)
        node.actor_process("transaction").kill()

        def ended() -> bool:
            try:
                return end(node.endpoint, open_half, "PG-svc", 8).get("status") == "OK"
            except SendError:  # (sent to the killed service: no answer)
                return False

        wait_until(ended, 30, "the restarted service")
    assert end(node.endpoint, done, "PG-svc", 8)["outcome"] == "commit"  # known again from the op records
    seen = sorted(m.body for m in visible(node.endpoint, "TxSvc"))
    assert seen == [b"before", b"open"]


def test_a_commit_on_its_way_when_the_service_is_killed_is_not_made_twice(patient_node):
    """The transaction service killed while its commit waits in the write path (the writer
    stopped; no fast failure, so the wait does not refuse it): the half still looks open to its
    successor, whose first look at the queues cannot see that commit yet. It ends nothing before
    a barrier behind that commit has passed and the commit's op record is read, so the
    producer's end again is a repeat, not a second commit. (With ingress workers: the barrier
    and the commit must take the same one.)"""
    node = patient_node
    with TransactionProducer(node.endpoint, "PG-way", execute=lambda message, arg: UNKNOW) as producer:
        sent = producer.send_in_transaction("TxWay", "once")  # (left open)
    writer = node.actor_process("writer")
    service = node.actor_process("transaction")
    answers = []
    writer.suspend()
    try:
        with pytest.raises(SendError):  # its commit waits for the writer, and so its answer
            end(node.endpoint, sent, "PG-way", 8, timeout=1.0)
        service.kill()

        def successor() -> bool:
            try:
                return node.actor_process("transaction").pid != service.pid and bool(state(node.endpoint))
            except (FileNotFoundError, ValueError, psutil.NoSuchProcess, SendError):
                return False

        wait_until(successor, 8, "the restarted transaction service")
        again = threading.Thread(target=lambda: answers.append(end(node.endpoint, sent, "PG-way", 8, timeout=20.0)))
        again.start()
        time.sleep(0.5)  # (the successor has the end; without the barrier it would commit again now)
    finally:
        writer.resume()
    again.join(30)
    assert answers and answers[0]["status"] == "OK", answers
    assert answers[0].get("outcome") == "commit", answers  # a repeat of the first
    assert [m.body for m in visible(node.endpoint, "TxWay")] == [b"once"]


def test_an_end_the_write_path_does_not_answer_in_time_is_not_made_twice(patient_node):
    """The writer stopped longer than a re-put's deadline (REPUT_TIMEOUT_S): the commit waiting
    in its ring is neither stored nor refused. Counted as not stored, its half would be open
    again and the producer's end again a second commit, both stored once the writer goes on. It
    stays decided until a barrier behind it has passed: the end again is a repeat, and the first
    end is answered once the commit is stored."""
    node = patient_node
    with TransactionProducer(node.endpoint, "PG-slow", execute=lambda message, arg: UNKNOW) as producer:
        sent = producer.send_in_transaction("TxSlow", "once")  # (left open)
    writer, answers = node.actor_process("writer"), {}

    def end_in(name: str) -> threading.Thread:
        thread = threading.Thread(target=lambda: answers.setdefault(name, end(node.endpoint, sent, "PG-slow", 8,
                                                                            timeout=40.0)))
        thread.start()
        return thread

    writer.suspend()
    try:
        first = end_in("first")
        time.sleep(REPUT_TIMEOUT_S + 1.5)  # (past the deadline: overdue, a barrier behind it)
        second = end_in("second")
        time.sleep(0.5)
    finally:
        writer.resume()
    first.join(45)
    second.join(45)
    assert answers["first"]["status"] == "OK", answers  # answered once the commit was stored
    assert answers["second"]["status"] == "OK" and answers["second"].get("outcome") == "commit", answers
    assert [m.body for m in visible(node.endpoint, "TxSlow")] == [b"once"]


def test_the_cli_sends_in_transactions_and_shows_them(node):
    def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "node.tools.cli", *args, "--endpoint", node.endpoint], cwd=ROOT,
                              input=stdin, capture_output=True, text=True, timeout=60)

    committed = cli("produce", "--topic", "TxCli", "--transaction", "commit", "--group", "PG-cli", stdin="a\nb\n")
    assert committed.returncode == 0, committed.stderr
    assert [orjson.loads(line)["transaction"] for line in committed.stdout.splitlines()] == ["COMMIT_MESSAGE"] * 2
    rolled = cli("produce", "--topic", "TxCli", "--transaction", "rollback", "--group", "PG-cli", stdin="c\n")
    assert rolled.returncode == 0, rolled.stderr
    checked = cli("produce", "--topic", "TxCli", "--transaction", "unknown", "--group", "PG-cli",
                  "--check-answer", "commit", "--timeout", "20", stdin="d\n")
    lines = [orjson.loads(line) for line in checked.stdout.splitlines()]
    assert checked.returncode == 0 and lines[0]["transaction"] == "UNKNOW"
    assert lines[1] == {"checked": lines[0]["msgId"], "topic": "TxCli", "answer": "COMMIT_MESSAGE"}
    wait_until(lambda: len(visible(node.endpoint, "TxCli")) == 3, 5, "the checked commit")
    assert sorted(m.body for m in visible(node.endpoint, "TxCli")) == [b"a", b"b", b"d"]
    missing = cli("produce", "--topic", "TxCli", "--transaction", "commit", stdin="e\n")
    assert missing.returncode == 2 and "--group" in missing.stderr
    shown = cli("admin", "transactions")
    assert shown.returncode == 0, shown.stderr
    table = orjson.loads(shown.stdout)
    assert table["committed"] >= 3 and table["rolledBack"] >= 1 and {"pending", "checked", "discarded"} <= set(table)


def test_a_batch_of_halves_is_stored_as_halves_and_committed_one_by_one(node):
    halves = {"TRAN_MSG": "true", "PGROUP": "PG-batch"}
    with Producer(node.endpoint, retries=0) as producer:
        sent = producer.send_batch("TxBatch", [f"b{i}" for i in range(10)], queue_id=1, properties=halves)
        assert [r.queue_offset for r in sent] == list(range(sent[0].queue_offset, sent[0].queue_offset + 10))
        assert visible(node.endpoint, "TxBatch") == []
        with pytest.raises(SendError) as refused:
            producer.send_batch("TxBatch", ["x"], properties={"TRAN_MSG": "true"})
        assert refused.value.status == "MESSAGE_ILLEGAL" and "PGROUP" in refused.value.remark
        reply, _ = producer.request({"code": protocol.END_TRANSACTIONS, "producerGroup": "PG-batch", "ends": [
            {"tranStateTableOffset": r.queue_offset, "commitLogOffset": decode_msg_id(r.offset_msg_id)[1],
             "commitOrRollback": 8 if i % 2 == 0 else 12} for i, r in enumerate(sent)]})
    assert reply["status"] == "OK" and [r["status"] for r in reply["results"]] == ["OK"] * 10
    seen = visible(node.endpoint, "TxBatch")
    assert sorted(m.body for m in seen) == sorted(f"b{i}".encode() for i in range(0, 10, 2))
    assert {m.queue_id for m in seen} == {1}


def _ends(results, outcome: int) -> list[dict]:
    return [{"tranStateTableOffset": r.queue_offset, "commitLogOffset": decode_msg_id(r.offset_msg_id)[1],
             "commitOrRollback": outcome} for r in results]


def test_a_one_half_batch_is_one_half_and_its_commit_every_message(node):
    halves = {"TRAN_MSG": "true", "PGROUP": "PG-whole"}
    messages = [Message("TxWhole", f"w{i}".encode(), tags=f"T{i % 2}", keys=[f"k{i}"]) for i in range(20)]
    with Producer(node.endpoint, retries=0) as producer:
        [half] = producer.send_batch("TxWhole", messages, queue_id=2, properties=halves, one_half=True)
        [dropped] = producer.send_batch("TxWhole", ["gone-1", "gone-2"], queue_id=2, properties=halves, one_half=True)
        assert len(half.msg_id.split(",")) == 20 and half.queue_id == 2
        assert visible(node.endpoint, "TxWhole") == []
        listed = [h for h in state(node.endpoint)["halves"] if h["producerGroup"] == "PG-whole"]
        assert sorted(h["messages"] for h in listed) == [2, 20]  # one half a batch
        with pytest.raises(SendError) as refused:  # a one-half batch is a batch of halves
            producer.send_batch("TxWhole", ["x", "y"], properties={"PGROUP": "PG-whole"}, one_half=True)
        assert refused.value.status == "MESSAGE_ILLEGAL" and "TRAN_MSG" in refused.value.remark
        with pytest.raises(SendError) as refused:
            producer.send_batch("TxWhole", [Message("TxWhole", b"later", delay_level=2), "y"], properties=halves,
                                one_half=True)
        assert refused.value.status == "MESSAGE_ILLEGAL"
        reply, _ = producer.request({"code": protocol.END_TRANSACTIONS, "producerGroup": "PG-whole",
                                     "ends": _ends([half], 8) + _ends([dropped], 12)})
        assert reply["status"] == "OK" and [r["status"] for r in reply["results"]] == ["OK", "OK"], reply
        again, _ = producer.request({"code": protocol.END_TRANSACTIONS, "producerGroup": "PG-whole",
                                     "ends": _ends([half], 8)})
        assert again["results"][0]["outcome"] == "commit"
    seen = visible(node.endpoint, "TxWhole")
    assert [m.body for m in seen] == [f"w{i}".encode() for i in range(20)]  # once each, in order, none dropped
    assert [m.msg_id for m in seen] == half.msg_id.split(",")
    assert [(m.queue_id, m.tags, m.keys) for m in seen] == [(2, f"T{i % 2}", [f"k{i}"]) for i in range(20)]
    with Producer(node.endpoint) as client:
        reply, body = client.request({"code": protocol.VIEW_MESSAGE_BY_ID, "offsetMsgId": seen[7].offset_msg_id})
    record = decode(body)
    assert record.sys_flag & TRANSACTION_MASK == TRANSACTION_COMMIT
    assert record.prepared_transaction_offset == decode_msg_id(half.offset_msg_id)[1]
    assert "INNER_NUM" not in record.properties and record.properties["PGROUP"] == "PG-whole"


def test_a_half_sent_with_its_own_inner_num_is_still_one_message(node):
    """INNER_NUM names a one-half batch's message count, which only the write path sets."""
    halves = {"TRAN_MSG": "true", "PGROUP": "PG-inner", "INNER_NUM": "3"}
    with Producer(node.endpoint, retries=0) as producer:
        sent = producer.send("TxInner", "just-one", queue_id=0, properties=halves)
    assert end(node.endpoint, sent, "PG-inner", 8)["status"] == "OK"
    [seen] = wait_until(lambda: visible(node.endpoint, "TxInner", queues=1), 5, "the commit")
    assert seen.body == b"just-one" and "INNER_NUM" not in seen.properties


def test_a_commit_of_more_than_the_write_path_takes_at_once_goes_in_parts(node):
    """40 one-half batches of 0.5 MiB ended in one request: 20 MiB of committed messages, more
    than the re-puts the transaction service has in flight at once and than a writer's ring holds."""
    halves = {"TRAN_MSG": "true", "PGROUP": "PG-large"}
    body = bytes(range(256)) * 16  # 4 KiB
    with Producer(node.endpoint, retries=0, timeout=60) as producer:
        sent = [producer.send_batch("TxLarge", [body] * 128, queue_id=0, properties=halves, one_half=True)[0]
                for _ in range(40)]
        reply, _ = producer.request({"code": protocol.END_TRANSACTIONS, "producerGroup": "PG-large",
                                     "ends": _ends(sent, 8)})
    assert reply["status"] == "OK" and {r["status"] for r in reply["results"]} == {"OK"}, reply
    seen = visible(node.endpoint, "TxLarge", queues=1)
    assert len(seen) == 40 * 128 and all(m.body == body for m in seen)


def test_a_send_without_its_producer_group_is_refused(node):
    with Producer(node.endpoint, retries=0) as producer:
        with pytest.raises(SendError) as refused:
            producer.send("TxBad", "x", properties={"TRAN_MSG": "true"})
    assert refused.value.status == "MESSAGE_ILLEGAL" and "PGROUP" in refused.value.remark


def test_a_kill_of_the_whole_node_between_half_and_outcome(tmp_path):
    settings = node_settings(tmp_path / "store", **FAST_CHECKS)
    node = NodeProcess(settings, tmp_path / "node.log").start()
    try:
        with TransactionProducer(node.endpoint, "PG-crash", execute=lambda message, arg: arg) as producer:
            producer.send_in_transaction("TxCrash", "committed-before", COMMIT_MESSAGE)
            producer.send_in_transaction("TxCrash", "rolled-back-before", ROLLBACK_MESSAGE)
            producer.send_in_transaction("TxCrash", "open", UNKNOW)
        node.kill_all()
        node.start()
        with TransactionProducer(node.endpoint, "PG-crash", check=lambda message: COMMIT_MESSAGE) as checker:
            wait_until(lambda: checker.checks_answered >= 1, 20, "the check after the restart")
            time.sleep(2.5)  # more passes: nothing ended before the kill is asked about again
            assert checker.checks_answered == 1
        seen = wait_until(lambda: len(visible(node.endpoint, "TxCrash")) >= 2 and visible(node.endpoint, "TxCrash"), 5,
                          "the commit")
        assert sorted(m.body for m in seen) == [b"committed-before", b"open"]
        assert state(node.endpoint)["pending"] == 0
    finally:
        node.stop(strict=False)


def test_transactions_through_a_kill_of_the_front_are_each_committed_once(patient_node):
    """The front killed -9 under transactional sends: a commit it had passed on to the writer is
    stored with its answer lost; one it had not is lost whole. Neither may become two messages
    (the first would, were its half opened again once its answer was overdue: the check commits
    it again), nor leave a half stored open: each stored half is committed once, by its end or
    by the check after the restart."""
    node = patient_node
    stored: list[bytes] = []  # bodies whose half the node acknowledged

    async def send_through_the_kill() -> None:
        # (it answers checks too: a half whose end the kill lost is checked once a second from a
        # second after it, and one asked transactionCheckMax times with no answer is discarded,
        # which a loaded machine reached before the checker below was connected)
        async with AsyncTransactionProducer(node.endpoint, "PG-front", execute=lambda message, arg: COMMIT_MESSAGE,
                                            check=lambda message: COMMIT_MESSAGE, retries=0,
                                            timeout=2.0) as producer:
            numbers = iter(range(100_000))
            began = time.monotonic()

            async def sender() -> None:
                for i in numbers:
                    if time.monotonic() - began > 4.0:
                        return
                    try:  # (a send retried would be a second half of the same message: none here)
                        result = await producer.send_in_transaction("TxFront", f"m{i}".encode())
                    except SendError:
                        await asyncio.sleep(0.05)
                        continue
                    stored.append(f"m{i}".encode())
                    assert result.end_status in ("OK", "TIMEOUT", "SYSTEM_BUSY"), result

            async def kill() -> None:
                await asyncio.sleep(0.8)
                node.actor_process("front").kill()

            await asyncio.gather(kill(), *[sender() for _ in range(32)])
            # its connection dropped with the front: it heartbeated the new one (which knew no producer) at once
            deadline = time.monotonic() + 10
            while producer.membership.client_id not in await asyncio.to_thread(producers_of, node.endpoint, "PG-front"):
                assert time.monotonic() < deadline, "the producer never heartbeated the restarted front"
                await asyncio.sleep(0.2)

    asyncio.run(send_through_the_kill())
    with TransactionProducer(node.endpoint, "PG-front", check=lambda message: COMMIT_MESSAGE):
        wait_until(lambda: state(node.endpoint)["pending"] == 0, 40, "every half ended")
    seen = collections.Counter(m.body for m in visible(node.endpoint, "TxFront"))
    assert seen and max(seen.values()) == 1, [body for body, n in seen.items() if n > 1][:5]
    assert set(stored) <= set(seen), sorted(set(stored) - set(seen))[:5]


def _torn_commit(settings, *halves) -> None:
    """What a node killed inside the append of a commit leaves: the committed messages before the
    cut, not the op record. Each (half's send result, count): its first `count` messages stored
    as its commit stores them (sysFlag COMMIT, PREPAREDTRANSACTIONOFFSET the half's offset)."""
    store = open_store(settings)  # (recovery, as the node's next start would run it)
    records = []
    for sent, count in halves:
        phy = decode_msg_id(sent.offset_msg_id)[1]
        half = decode(store.commitlog.read_bytes(phy, int.from_bytes(store.commitlog.read_bytes(phy, 4), "big")))
        inner = protocol.decode_batch_body(half.body) if "INNER_NUM" in half.properties else [(half.body, 0, "")]
        for body, _, _ in inner[:count]:
            records.append(encode(topic=half.properties["REAL_TOPIC"], body=body,
                                  queue_id=int(half.properties["REAL_QID"]), born_timestamp=half.born_timestamp,
                                  born_host=BORN, store_host=STORE_HOST, sys_flag=TRANSACTION_COMMIT,
                                  prepared_transaction_offset=phy))
    put(store, records)
    store.close()  # (not a clean stop: the next start recovers again, and dispatches)


FILL = 70_000  # messages in the torn commit's queue before it: more than TornCommits reads a call


def test_a_commit_a_crash_tore_is_finished_and_nothing_stored_twice(tmp_path):
    """The node killed inside a commit's append: after recovery the halves are open, some of their
    committed messages stored. Ending them again stores only the rest (a half whose messages are
    all there: its op record alone), also after a second restart before the end; a rollback, or a
    check, of such a half finishes its commit instead."""
    settings = node_settings(tmp_path / "store")
    node = NodeProcess(settings, tmp_path / "node.log").start()
    halves = {"TRAN_MSG": "true", "PGROUP": "PG-torn", "CHECK_IMMUNITY_TIME_IN_SECONDS": "3600"}
    try:
        with Producer(node.endpoint, retries=0) as producer:
            done = producer.send("TxTorn", "done-before", queue_id=0, properties=halves)
            assert end(node.endpoint, done, "PG-torn", 8)["status"] == "OK"  # (an op record before the tear)
            [batch] = producer.send_batch("TxTorn", [f"b{i}" for i in range(6)], queue_id=1, properties=halves,
                                          one_half=True)
            single = producer.send("TxTorn", "single", queue_id=1, properties=halves)
            untouched = producer.send("TxTorn", "untouched", queue_id=2, properties=halves)
            later = producer.send("TxTorn", "rolled-back-later", queue_id=2, properties=halves)
            checked = producer.send("TxTorn", "checked", queue_id=3, properties={"TRAN_MSG": "true", "PGROUP": "PG-torn"})
            for _ in range(FILL // 500):  # (more than the service reads a turn: its read goes on over turns)
                producer.send_batch("TxTorn", ["f"] * 500, queue_id=1)
        node.kill_all()
        _torn_commit(settings, (batch, 2), (single, 1), (checked, 1))
        node.start()
        assert state(node.endpoint)["pending"] >= 4
        assert end(node.endpoint, later, "PG-torn", 12)["status"] == "OK"  # (an op record past the tear ...)
        node.kill_all()
        node = NodeProcess(node_settings(tmp_path / "store", transactionTimeOut=1000, transactionCheckInterval=1000),
                           tmp_path / "node.log").start()  # (... which this start must not take for the last before it)
        with Producer(node.endpoint, retries=0) as producer:
            reply, _ = producer.request({"code": protocol.END_TRANSACTIONS, "producerGroup": "PG-torn",
                                         "ends": _ends([batch, untouched], 8) + _ends([single], 12)})
        assert reply["status"] == "OK" and [r["status"] for r in reply["results"]] == ["OK"] * 3, reply
        assert reply["results"][2]["outcome"] == "commit"  # (the rollback of a commit begun: the commit, finished)
        wait_until(lambda: state(node.endpoint)["pending"] == 0, 10, "the check pass finishing the torn commit")
        with PullConsumer(node.endpoint) as consumer:
            bodies = [[m.body for m in consumer.pull("TxTorn", queue, offset, max_count=32).messages]
                      for queue, offset in ((0, 0), (1, FILL), (2, 0), (3, 0))]
        assert bodies == [[b"done-before"], [b"b0", b"b1", b"single", b"b2", b"b3", b"b4", b"b5"], [b"untouched"],
                          [b"checked"]]

        def repaired() -> int:  # (a service's statistics reach the front once a second)
            with Producer(node.endpoint) as client:
                info, _ = client.request({"code": protocol.GET_BROKER_RUNTIME_INFO})
            return info["actors"]["transaction"]["tornCommits"]

        wait_until(lambda: repaired() == 3, 5, "the transaction service's count of torn commits")
    finally:
        node.stop(strict=False)


def test_a_slave_promoted_mid_transaction_goes_on_checking(tmp_path):
    from shm.control_block import peek

    master = node_settings(tmp_path / "master", haListenPort=free_port(), **FAST_CHECKS)
    slave = node_settings(tmp_path / "slave", brokerRole="SLAVE", brokerId=1, haMasterAddress=f"127.0.0.1:{master.ha_port}",
                          haListenPort=free_port(), **FAST_CHECKS)
    m_node, s_node = NodeProcess(master, tmp_path / "m.log").start(), NodeProcess(slave, tmp_path / "s.log").start()
    try:
        with TransactionProducer(master.listen, "PG-ha", execute=lambda message, arg: arg) as producer:
            producer.send_in_transaction("TxHa", "committed", COMMIT_MESSAGE)
            producer.send_in_transaction("TxHa", "open", UNKNOW)
        wait_until(lambda: peek(slave.root, "dispatched") == peek(master.root, "written"), 20, "the slave")
        assert wait_until(lambda: state(slave.listen)["pending"] == 1, 10, "the slave's reading")
        m_node.kill_all()
        done = subprocess.run([sys.executable, "-m", "node.tools.cli", "admin", "role", "--role", "ASYNC_MASTER",
                               "--endpoint", slave.listen], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        with TransactionProducer(slave.listen, "PG-ha", check=lambda message: COMMIT_MESSAGE) as checker:
            wait_until(lambda: checker.checks_answered >= 1, 20, "the promoted slave's check")
        seen = wait_until(lambda: len(visible(slave.listen, "TxHa")) >= 2 and visible(slave.listen, "TxHa"), 5,
                          "the commit on the promoted slave")
        assert sorted(m.body for m in seen) == [b"committed", b"open"]
    finally:
        s_node.stop(strict=False)
        m_node.stop(strict=False)
