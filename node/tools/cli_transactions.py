"""`mqnode produce --transaction` and `mqnode admin transactions` (docs/operations.md "Transactions")."""

from __future__ import annotations

import argparse
import sys
import threading

import orjson

ANSWERS = {"commit": "COMMIT_MESSAGE", "rollback": "ROLLBACK_MESSAGE", "unknown": "UNKNOW"}


def produce_in_transaction(args: argparse.Namespace, lines, message_of) -> int:
    """Each line a half, then ended with `--transaction`'s outcome; with `unknown` they stay open
    and, with `--check-answer`, the node's checks of them are answered while the command stays
    connected (`--timeout` seconds, or until every open one was answered). A JSON line a message,
    and one per check answered; exit 1 if any send or end failed."""
    from node.client import LocalTransactionState, SendError, TransactionProducer

    if not args.group:
        from shm.settings import SettingsError
        raise SettingsError("produce --transaction needs --group (the producer group the node asks about open halves)")
    state = LocalTransactionState(ANSWERS[args.transaction])
    answer = LocalTransactionState(ANSWERS[args.check_answer]) if args.check_answer else None
    out, lock, answered = sys.stdout, threading.Lock(), threading.Event()
    open_ids: set[str] = set()

    def check(message) -> LocalTransactionState:
        shown = answer or LocalTransactionState.UNKNOW
        with lock:
            out.write(orjson.dumps({"checked": message.msg_id, "topic": message.topic, "answer": shown.value}).decode()
                      + "\n")
            out.flush()
            if answer is not None:
                open_ids.discard(message.msg_id)
                if not open_ids:
                    answered.set()
        return shown

    failed = 0
    with TransactionProducer(args.endpoint, args.group, execute=lambda message, arg: state, check=check,
                             timeout=min(args.timeout, 10.0)) as producer:
        for body in lines:
            try:
                result = producer.send_in_transaction(args.topic, body, **message_of(body))
            except SendError as e:
                failed += 1
                shown = {"status": e.status, "remark": e.remark}
            else:
                failed += result.end_status != "OK"
                shown = {"status": result.status, "msgId": result.msg_id, "offsetMsgId": result.offset_msg_id,
                         "queueId": result.queue_id, "queueOffset": result.queue_offset, "topic": result.topic,
                         "transaction": result.local_transaction_state.value, "endStatus": result.end_status}
                if state is LocalTransactionState.UNKNOW:
                    with lock:
                        open_ids.add(result.msg_id)
            with lock:
                out.write(orjson.dumps(shown).decode() + "\n")
                out.flush()
        if open_ids and answer is not None:  # (without an answer they stay open for another producer)
            answered.wait(args.timeout)
    return 1 if failed else 0


def admin_transactions(client, args: argparse.Namespace) -> tuple[dict, dict]:
    """The transaction service's state: halves pending (and how many were checked), committed,
    rolled back, discarded, and the first open ones."""
    from node.protocol import GET_TRANSACTION_STATE

    reply, _ = client.request({"code": GET_TRANSACTION_STATE, "limit": 100})
    keys = ("pending", "checked", "committed", "rolledBack", "discarded", "ending", "checksSent", "repeatedEnds",
            "oldestPendingMillis", "halves")
    shown = {key: reply.get(key) for key in keys}
    if args.group:
        shown["halves"] = [h for h in shown["halves"] or [] if h.get("producerGroup") == args.group]
    return reply, shown
