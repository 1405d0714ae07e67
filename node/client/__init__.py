"""The Python client, one import for users: the producers (plain, transactional, and the requester
of request-reply) and the pull, push and pop consumers (`from node.client import Producer, PushConsumer, PopConsumer`).

`Producer` / `AsyncProducer` live in `node.client.producer`, `PullConsumer` / `AsyncPullConsumer` in
`node.client.consumer` (its messages in `node.client.received`), `PushConsumer` in `node.client.push`,
`PopConsumer` in `node.client.pop_consumer`; all speak `docs/protocol.md`.

The names load on first use (PEP 562): a module that needs one part of the client (the node's gRPC
proxy, a client of the front) does not pay ~50 ms of CPU for all of it at every start. The framing
both sides share is `node.frames`.
"""

from __future__ import annotations

import typing

_NAMES = {  # the module each name lives in -> its names
    "node.client.aio": ("ForkedClient",),
    "node.client.consumer": ("AsyncPullConsumer", "PullConsumer", "PullResult"),
    "node.client.message": ("Message",),
    "node.client.producer": ("AsyncProducer", "Producer", "SendError", "SendResult"),
    "node.client.received": ("ReceivedMessage", "decode_messages"),
    "node.client.replies": ("AsyncRequester", "Requester", "RequestTimeout"),
    "node.client.transaction": ("COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW", "AsyncTransactionProducer",
                                "LocalTransactionState", "TransactionProducer", "TransactionSendResult"),
    "node.client.push": ("AsyncPushConsumer", "PushConsumer", "PushOptions", "SUCCESS",
                         "SUSPEND_CURRENT_QUEUE_A_MOMENT", "CLUSTERING", "BROADCASTING"),
    "node.client.pop_consumer": ("PopConsumer", "PopOptions", "CONSUME_SUCCESS", "RECONSUME_LATER"),
    "node.client.uniq_keys": ("UniqKeys",),
    "node.security": ("Credentials",),
}
_HOMES = {name: home for home, names in _NAMES.items() for name in names}
__all__ = sorted(_HOMES)

if typing.TYPE_CHECKING:  # (for readers and type checkers: the same names, imported at once)
    from node.client.aio import ForkedClient
    from node.client.consumer import AsyncPullConsumer, PullConsumer, PullResult
    from node.client.message import Message
    from node.client.pop_consumer import CONSUME_SUCCESS, RECONSUME_LATER, PopConsumer, PopOptions
    from node.client.producer import AsyncProducer, Producer, SendError, SendResult
    from node.client.push import (BROADCASTING, CLUSTERING, SUCCESS, SUSPEND_CURRENT_QUEUE_A_MOMENT,
                                  AsyncPushConsumer, PushConsumer, PushOptions)
    from node.client.received import ReceivedMessage, decode_messages
    from node.client.replies import AsyncRequester, Requester, RequestTimeout
    from node.client.transaction import (COMMIT_MESSAGE, ROLLBACK_MESSAGE, UNKNOW, AsyncTransactionProducer,
                                         LocalTransactionState, TransactionProducer, TransactionSendResult)
    from node.client.uniq_keys import UniqKeys
    from node.security import Credentials


def __getattr__(name: str):
    match _HOMES.get(name):  # (plain imports, so the layout's checks read what the package loads)
        case "node.client.aio":
            import node.client.aio as home
        case "node.client.consumer":
            import node.client.consumer as home
        case "node.client.message":
            import node.client.message as home
        case "node.client.producer":
            import node.client.producer as home
        case "node.client.received":
            import node.client.received as home
        case "node.client.replies":
            import node.client.replies as home
        case "node.client.transaction":
            import node.client.transaction as home
        case "node.client.push":
            import node.client.push as home
        case "node.client.pop_consumer":
            import node.client.pop_consumer as home
        case "node.client.uniq_keys":
            import node.client.uniq_keys as home
        case "node.security":
            import node.security as home
        case _:
            raise AttributeError(f"module 'node.client' has no attribute {name!r}")
    value = globals()[name] = getattr(home, name)  # (once: the next use is a plain lookup)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
