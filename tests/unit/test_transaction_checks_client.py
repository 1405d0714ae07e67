"""The transactional producer's answers to the node's checks, with the node's side played by a
plain function: a worker goes on to the next check while the end of the last is on its way, so a
pass over many halves is answered at the rate the node stores ends, not one round trip per
CHECK_WORKERS halves (a pass not answered before the next one is asked about again)."""

from __future__ import annotations

import asyncio

from node import protocol
from node.client import COMMIT_MESSAGE
from node.client.transaction import CHECK_ENDS_IN_FLIGHT, CHECK_WORKERS, AsyncTransactionProducer
from shm.codec import PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC, TRANS_HALF_TOPIC, encode, encode_host, properties_string

HOST = encode_host("127.0.0.1", 10911)
CHECKS = 4 * CHECK_WORKERS


def _check(offset: int) -> tuple[dict, bytes]:
    """A CHECK_TRANSACTION_STATE as the front forwards it: the header and the half's record."""
    record = encode(topic=TRANS_HALF_TOPIC, body=b"half", queue_id=0, born_timestamp=1, born_host=HOST,
                    store_host=HOST, queue_offset=offset, physical_offset=offset * 100,
                    properties=properties_string({PROPERTY_REAL_TOPIC: "T", PROPERTY_REAL_QID: "0"}))
    header = {"code": protocol.CHECK_TRANSACTION_STATE, "producerGroup": "PG", "tranStateTableOffset": offset,
              "commitLogOffset": offset * 100, "msgId": f"id{offset}", "transactionId": f"id{offset}"}
    return header, record


def test_checks_are_answered_while_the_ends_before_them_wait_for_the_node():
    async def scenario() -> None:
        ends: list[dict] = []
        node_answers = asyncio.Event()

        async def request(header: dict, timeout=None):  # the node: stores nothing until told to
            batch = header.get("ends") or [header]
            ends.extend(batch)
            await node_answers.wait()
            if header["code"] == protocol.END_TRANSACTIONS:
                return {"status": "OK", "results": [{"status": "OK"}] * len(batch)}, None
            return {"status": "OK"}, None

        producer = AsyncTransactionProducer("tcp://127.0.0.1:1", "PG", check=lambda message: COMMIT_MESSAGE)
        producer.producer.request = request
        producer.membership.task = asyncio.get_running_loop().create_future()  # (started: no node to greet)
        for offset in range(CHECKS):
            producer._on_request(*_check(offset))
        for _ in range(100):  # (the loop's turns: the workers answer what they can without the node)
            await asyncio.sleep(0)
        assert len(ends) == CHECKS <= CHECK_ENDS_IN_FLIGHT  # every answer on its way, none stored yet
        assert {e["tranStateTableOffset"] for e in ends} == set(range(CHECKS))
        assert all(e["commitOrRollback"] == 8 and e["fromTransactionCheck"] for e in ends)
        assert producer.checks_answered == 0
        node_answers.set()
        for _ in range(100):
            if producer.checks_answered == CHECKS:
                break
            await asyncio.sleep(0.01)
        assert producer.checks_answered == CHECKS
        producer.membership.task = None
        await producer.close()

    asyncio.run(scenario())
