"""The Python client, one import for users: the producers (plain and transactional) and the pull consumer.

`Producer` / `AsyncProducer` live in `node.client.producer`, `PullConsumer` / `AsyncPullConsumer` in
`node.client.consumer` (its messages in `node.client.received`); both speak `docs/protocol.md`.
"""

from node.client.consumer import (
           AsyncPullConsumer,
           PullConsumer,
           PullResult,
)
from node.client.message import Message
from node.client.producer import (
           AsyncProducer,
           Producer,
           SendError,
           SendResult,
)
from node.client.received import ReceivedMessage, decode_messages
from node.client.transaction import (
           COMMIT_MESSAGE,
           ROLLBACK_MESSAGE,
           UNKNOW,
           AsyncTransactionProducer,
           LocalTransactionState,
           TransactionProducer,
           TransactionSendResult,
)
from node.client.uniq_keys import UniqKeys
from node.security import Credentials

__all__ = ["COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW", "AsyncProducer", "AsyncPullConsumer",
           "AsyncTransactionProducer", "Credentials", "LocalTransactionState", "Message", "Producer", "PullConsumer",
           "PullResult", "ReceivedMessage", "SendError", "SendResult", "TransactionProducer", "TransactionSendResult",
           "UniqKeys", "decode_messages"]
