"""The Python client, one import for users: the producer and the pull consumer.

`Producer` / `AsyncProducer` live in `node.producer`, `PullConsumer` / `AsyncPullConsumer` in
`node.consumer` (its messages in `node.received`); both speak `docs/protocol.md`.
"""

from node.consumer import (
           AsyncPullConsumer,
           PullConsumer,
           PullResult,
)
from node.producer import (
           AsyncProducer,
           Message,
           Producer,
           SendError,
           SendResult,
           UniqKeys,
)
from node.received import ReceivedMessage, decode_messages

__all__ = ["AsyncProducer", "AsyncPullConsumer", "Message", "Producer", "PullConsumer", "PullResult",
           "ReceivedMessage", "SendError", "SendResult", "UniqKeys", "decode_messages"]
