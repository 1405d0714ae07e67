"""The Python client, one import for users: the producers (plain and transactional) and the pull consumer.

`Producer` / `AsyncProducer` live in `node.client.producer`, `PullConsumer` / `AsyncPullConsumer` in
`node.client.consumer` (its messages in `node.client.received`); both speak `docs/protocol.md`.

The names load on first use (PEP 562): the node's processes import `node.client.frames`, the
framing both sides share, and each of them paid ~50 ms of CPU for the whole client at every start.
"""

from __future__ import annotations

import typing

__all__ = ["COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW", "AsyncProducer", "AsyncPullConsumer",
           "AsyncTransactionProducer", "Credentials", "LocalTransactionState", "Message", "Producer", "PullConsumer",
           "PullResult", "ReceivedMessage", "SendError", "SendResult", "TransactionProducer", "TransactionSendResult",
           "UniqKeys", "decode_messages"]
_HOMES = {"AsyncPullConsumer": "consumer", "PullConsumer": "consumer", "PullResult": "consumer",
          "Message": "message",
          "AsyncProducer": "producer", "Producer": "producer", "SendError": "producer", "SendResult": "producer",
          "ReceivedMessage": "received", "decode_messages": "received",
          "COMMIT_MESSAGE": "transaction", "ROLLBACK_MESSAGE": "transaction", "UNKNOW": "transaction",
          "AsyncTransactionProducer": "transaction", "LocalTransactionState": "transaction",
          "TransactionProducer": "transaction", "TransactionSendResult": "transaction",
          "UniqKeys": "uniq_keys", "Credentials": "security"}

if typing.TYPE_CHECKING:  # (for readers and type checkers: the same names, imported at once)
    from node.client.consumer import AsyncPullConsumer, PullConsumer, PullResult
    from node.client.message import Message
    from node.client.producer import AsyncProducer, Producer, SendError, SendResult
    from node.client.received import ReceivedMessage, decode_messages
    from node.client.transaction import (COMMIT_MESSAGE, ROLLBACK_MESSAGE, UNKNOW, AsyncTransactionProducer,
                                         LocalTransactionState, TransactionProducer, TransactionSendResult)
    from node.client.uniq_keys import UniqKeys
    from node.security import Credentials


def __getattr__(name: str):
    match _HOMES.get(name):
        case "consumer":
            import node.client.consumer as home
        case "message":
            import node.client.message as home
        case "producer":
            import node.client.producer as home
        case "received":
            import node.client.received as home
        case "transaction":
            import node.client.transaction as home
        case "uniq_keys":
            import node.client.uniq_keys as home
        case "security":
            import node.security as home
        case _:
            raise AttributeError(f"module 'node.client' has no attribute {name!r}")
    value = globals()[name] = getattr(home, name)  # (once: the next use is a plain lookup)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
