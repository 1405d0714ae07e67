"""The ends the transaction service (actors.transaction) has decided and not yet answered: an
`End` per half, waiting for its re-put and then for the write path's answer; an `Ends` per
END_TRANSACTION(S) request, answered once each of its ends has its result."""

from __future__ import annotations

import orjson

from actors.reput import Stored, half_target
from actors.transaction_core import COMMIT, Half
from node import protocol


def reply(client: bytes, arrival: int, opaque, status: str, remark: str, **fields) -> tuple:
    return client, -arrival, orjson.dumps(protocol.reply_header(opaque, status, remark, **fields))


OK_RESULT = {"status": "OK"}  # (one dict for every plain OK: a Spark commit has a million; only serialised)


class End:
    """One end decided here, waiting for its re-put (the committed half's record is read then,
    `half`, unless the end had to read it to find it: `stored`) and then for its answer."""

    __slots__ = ("offset", "outcome", "phy", "half", "stored", "batch", "i", "records", "asked")

    def __init__(self, offset: int, outcome: str, phy: int, half: Half | None, stored: Stored | None, batch: Ends,
                 i: int):
        self.offset, self.outcome, self.phy, self.half, self.stored, self.batch, self.i = \
            offset, outcome, phy, half, stored, batch, i
        self.records = 0  # a commit's re-put records (a one-half batch's: its messages)
        self.asked = outcome  # (a rollback of a half a torn commit had begun to commit: a commit)

    def target(self) -> tuple[str, int] | None:
        """The half's real topic and queue (None: not a half a commit could deliver)."""
        return (self.half.topic, self.half.queue_id) if self.half is not None else half_target(self.stored)

    def size(self) -> int:
        """About the bytes its re-put carries (the half's record; a rollback's: none)."""
        if self.outcome != COMMIT:
            return 0
        return self.half.size if self.half is not None else len(self.stored.body)


class Ends:
    """The answer to one END_TRANSACTION (`single`) or END_TRANSACTIONS: a result per end, the
    reply once every one has its result (none for a oneway request)."""

    __slots__ = ("client", "arrival", "opaque", "oneway", "results", "left", "single")

    def __init__(self, client: bytes, arrival: int, opaque, oneway: bool, count: int, *, single: bool):
        self.client, self.arrival, self.opaque, self.oneway, self.single = client, arrival, opaque, oneway, single
        self.results: list[dict | None] = [None] * count
        self.left = count

    def set(self, i: int, out: list, status: str, remark: str, **fields) -> None:
        if remark or fields:
            self.results[i] = {"status": status, "remark": remark, **fields}
        else:
            self.results[i] = OK_RESULT if status == "OK" else {"status": status}
        self.left -= 1
        if self.left or self.oneway:
            return
        if self.single:
            result = self.results[0]
            out.append(reply(self.client, self.arrival, self.opaque, result["status"], result.get("remark", ""),
                              **{k: v for k, v in result.items() if k not in ("status", "remark")}))
        else:
            out.append(reply(self.client, self.arrival, self.opaque, "OK", "", results=self.results))
