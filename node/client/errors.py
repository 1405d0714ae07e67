"""The clients' errors (SendError re-exported by node.client.producer, where callers have always found it)."""

from __future__ import annotations


class BadEndpoint(ValueError):
    """A client given an endpoint no node can listen at."""


class SendError(Exception):
    """A send that failed for good: `status` is the node's status (or TIMEOUT)."""

    def __init__(self, status: str, remark: str = ""):
        super().__init__(f"{status}: {remark}" if remark else status)
        self.status = status
        self.remark = remark
