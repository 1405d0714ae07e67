"""All-or-nothing writes: `option("transactional", "true")` on `df.write` and `df.writeStream`
(docs/operations.md "Spark"). Built on the node's transactional messages (docs/protocol.md
"Transactions").

Each task sends its rows as halves (invisible) of the write's producer group and reports them in
its commit message; nothing is visible until the driver's commit ends them all with commit. Rows
go as one-half batches (SEND_BATCH_MESSAGE `oneHalf`: up to BATCH rows stored as one half, which
one end commits whole): a million rows are ~2,000 halves and ends, not a million. A
task that fails rolls back what it sent; a job that aborts rolls back what its tasks reported; a
commit or an abort then rolls back every half of the group still open (what attempts Spark killed
sent: END_TRANSACTIONS `openOfGroup`; an abort sweeps again once Spark has destroyed the killed
attempts' workers, KILLED_ATTEMPTS_SETTLE_S later). What nobody ends (a driver killed) is checked
by the node, finds no producer of the group, and is discarded after `transactionCheckMax` checks.
Halves carry CHECK_IMMUNITY_TIME_IN_SECONDS (`transactionTimeoutSeconds`, 3600 by default) so a
long job is not checked while it runs.

A stream commits each micro-batch once, even when Spark replays it after a restart from its
checkpoint: the sink keeps its commits in a topic of its own on the node (`%SPARK%<group>`, one
queue): before ending a batch's halves the driver stores its intent (the batch id and the halves,
in parts of at most INTENT_PART_HALVES), and after them a `done` marker. A batch whose `done` is
there is not committed again (its replay's halves are rolled back); one whose intent is whole but
has no `done` is finished from the intent (ends are idempotent) before its replay's halves are
rolled back.

Where the guarantee ends: a driver that dies inside a batch write's commit leaves it partly
visible (the intent makes this exact only for streams); halves older than their immunity plus
`transactionCheckMax` x `transactionCheckInterval` are discarded, so a stream replayed later than
that loses that batch (its commit then fails, naming the discards).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import hashlib
import uuid
import zlib

import orjson

from node import protocol
from node.client import AsyncProducer, Message, SendError
from node.client.consumer import PullConsumer
from node.pipeline.ranges import PipelineError, credentials_option, timeout_option
from shm.codec import PROPERTY_CHECK_IMMUNITY, PROPERTY_PRODUCER_GROUP, PROPERTY_TRANSACTION, decode_msg_id

BATCH = 512  # rows a half holds at most (a one-half batch: one end commits them all) ...
HALF_BYTES = 1 << 20  # ... and bytes of bodies, past the first row
BATCHES_IN_FLIGHT = 8  # batches of halves a task has in flight at once
ENDS_IN_FLIGHT = 16  # END_TRANSACTIONS requests (of MAX_ENDS_PER_REQUEST) a commit has in flight
INTENT_PART_HALVES = 100_000  # halves one intent message names (~0.3 MiB compressed at most)
COMMIT, ROLLBACK = 8, 12
# An abort sweeps the group's open halves a second time this long after the first: Spark destroys a
# killed task's Python worker only after spark.python.task.killTimeout (2 s by default), and until
# then the attempt goes on sending halves. Seen on a loaded machine: 1,568 halves of a killed task
# stored after the first sweep, left for the node's checks to discard.
KILLED_ATTEMPTS_SETTLE_S = 3.0


def enabled(options: dict) -> bool:
    value = _get(options, "transactional")
    if value is None:
        return False
    if str(value).lower() not in ("true", "false"):
        raise PipelineError(f"option `transactional` must be true or false, not {value!r}")
    return str(value).lower() == "true"


def producer_group(options: dict, *, streaming: bool) -> str:
    """The write's producer group: `producerGroup`, else for a stream one named by its
    checkpoint (the same across restarts, as it must be), else for a batch write a fresh one."""
    given = _get(options, "producergroup")
    if given:
        return str(given)
    checkpoint = _get(options, "checkpointlocation")
    if streaming:
        if not checkpoint:
            raise PipelineError("a transactional stream needs option `producerGroup` or `checkpointLocation` "
                                "(its commits are kept under that name)")
        return "spark-" + hashlib.sha1(str(checkpoint).encode()).hexdigest()[:20]
    return "spark-" + uuid.uuid4().hex[:20]


def _get(options: dict, key: str):
    return {str(k).lower(): v for k, v in options.items()}.get(key)


# -- the tasks --------------------------------------------------------------------------------------

def send_halves(options: dict, group: str, messages) -> bytes:
    """A task's rows as halves of `group`, in batches of halves per topic and queue (mqnode's:
    TRAN_MSG in the batch's header): (queue offset, CommitLog offset) of each, packed (`pack`).
    A failure rolls back what was sent, then raises."""
    endpoint = _get(options, "endpoint")
    timeout = timeout_option(lambda key: _get(options, key))
    immunity = str(int(_get(options, "transactiontimeoutseconds") or 3600))
    extra = {PROPERTY_TRANSACTION: "true", PROPERTY_PRODUCER_GROUP: group, PROPERTY_CHECK_IMMUNITY: immunity}

    async def run() -> array.array:
        halves = array.array("q")
        async with AsyncProducer(endpoint, timeout=timeout, credentials=credentials_option(lambda k: _get(options, k))) \
                as producer:
            pending: set[asyncio.Task] = set()
            try:
                for key, batch in _batches(messages):
                    topic, queue_id, shard = key
                    pending.add(asyncio.create_task(producer.send_batch(topic, batch, queue_id=queue_id, shard_key=shard,
                                                                        properties=extra, one_half=len(batch) > 1)))
                    if len(pending) >= BATCHES_IN_FLIGHT:
                        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                        _collect(done, halves)
                if pending:
                    done, pending = await asyncio.wait(pending)
                    _collect(done, halves)
            except BaseException:
                if pending:  # (sent: stored or not, each is rolled back if it was)
                    done, late = await asyncio.wait(pending, timeout=timeout)
                    for task in late:
                        task.cancel()
                    with contextlib.suppress(PipelineError):
                        _collect(done, halves)
                await _end(producer, group, halves, ROLLBACK)  # (best effort: what is left, the node discards)
                raise
        return halves

    return pack(asyncio.run(run()))


def _batches(messages):
    """(topic, queue id, sharding key) and up to BATCH of its rows (HALF_BYTES of bodies), in the
    rows' order per key. A batch of one row goes as a half of its own (a row near the node's
    maxMessageSize would not fit a one-half batch's body)."""
    groups: dict[tuple, list] = {}
    sizes: dict[tuple, int] = {}  # bytes of bodies in each key's group
    for message, queue_id, shard in messages:
        key = (message.topic, queue_id, shard)
        if key in groups and sizes[key] + len(message.body) > HALF_BYTES:
            yield key, groups.pop(key)
        group = groups.setdefault(key, [])
        sizes[key] = (sizes[key] if len(group) else 0) + len(message.body)
        group.append(message)
        if len(group) >= BATCH:
            yield key, groups.pop(key)
    yield from groups.items()


def _collect(done, halves: array.array) -> None:
    """The halves of the batches `done`; PipelineError for the first that failed (after every
    failure was looked at: none is left unretrieved)."""
    refused = None
    for task in done:
        try:
            results = task.result()
        except SendError as e:
            refused = refused or e
            continue
        for result in results:
            halves.append(result.queue_offset)
            halves.append(decode_msg_id(result.offset_msg_id)[1])
    if refused is not None:
        raise PipelineError(f"the node refused a transactional send: {refused.status} {refused.remark}".strip())


def pack(halves: array.array) -> bytes:
    """(queue offset, CommitLog offset) pairs as delta-coded, compressed bytes (a commit message,
    an intent part): both offsets mostly grow, so the deltas are small."""
    deltas = array.array("q", halves)
    for i in range(len(deltas) - 1, 1, -1):
        deltas[i] -= deltas[i - 2]
    return zlib.compress(deltas.tobytes(), 1)


def unpack(data: bytes) -> array.array:
    halves = array.array("q")
    halves.frombytes(zlib.decompress(data))
    for i in range(2, len(halves)):
        halves[i] += halves[i - 2]
    return halves


# -- the driver ------------------------------------------------------------------------------------

def end_halves(options: dict, group: str, packed: list[bytes], outcome: int, *, settle_s: float = 0.0) -> None:
    """Commit (or roll back) every half the tasks reported; raises PipelineError naming what
    could not be ended (a repeat is fine: ends are idempotent). Then every other half of the
    group still open is rolled back: what task attempts killed before they could report or roll
    back sent (Spark kills a stage's other tasks when one fails). With `settle_s`, that sweep is
    made again after it: a killed attempt's Python worker goes on sending until Spark destroys it."""
    halves = array.array("q")
    for data in packed:
        halves.extend(unpack(data))

    async def work(producer: AsyncProducer) -> None:
        await _end(producer, group, halves, outcome, strict=True)
        await _roll_back_open(producer, group)
        if settle_s > 0:
            await asyncio.sleep(settle_s)
            await _roll_back_open(producer, group)

    asyncio.run(_with_producer(options, work))


async def _roll_back_open(producer: AsyncProducer, group: str) -> None:
    for _ in range(100):  # (a request rolls back up to 100,000; a bound on the loop)
        try:
            reply, _ = await producer.request({"code": protocol.END_TRANSACTIONS, "producerGroup": group,
                                               "openOfGroup": True, "commitOrRollback": ROLLBACK}, timeout=60)
        except SendError:
            return  # (best effort: what stays open, the node discards)
        if reply.get("status") != "OK" or not reply.get("results"):
            return


async def _with_producer(options: dict, work):
    endpoint = _get(options, "endpoint")
    timeout = timeout_option(lambda key: _get(options, key))
    async with AsyncProducer(endpoint, timeout=timeout, retries=3,
                             credentials=credentials_option(lambda k: _get(options, k))) as producer:
        return await work(producer)


async def _end(producer: AsyncProducer, group: str, halves: array.array, outcome: int, *, strict: bool = False) -> None:
    step = protocol.MAX_ENDS_PER_REQUEST * 2
    chunks = [halves[at: at + step] for at in range(0, len(halves), step)]
    failures: list[str] = []
    gate = asyncio.Semaphore(ENDS_IN_FLIGHT)

    async def one(chunk) -> None:
        ends = [{"tranStateTableOffset": chunk[i], "commitLogOffset": chunk[i + 1], "commitOrRollback": outcome}
                for i in range(0, len(chunk), 2)]
        async with gate:
            for attempt in range(4):  # (the node busy or restarting: ends are idempotent, so again)
                try:
                    reply, _ = await producer.request({"code": protocol.END_TRANSACTIONS, "producerGroup": group,
                                                       "ends": ends})
                except SendError as e:
                    reply = {"status": e.status, "remark": e.remark}
                results = reply.get("results") if reply.get("status") == "OK" else None
                if results is not None and all(r["status"] == "OK" for r in results):
                    _check_outcomes(results, outcome, failures)
                    return
                if attempt == 3:
                    failures.append(f"{reply.get('status')}: {reply.get('remark', '')}"[:300] if results is None else
                                    next(f"{r['status']}: {r.get('remark', '')}" for r in results if r["status"] != "OK"))
                await asyncio.sleep(0.2 * 2 ** attempt)
                if results is not None:  # only what failed goes again
                    ends = [e for e, r in zip(ends, results) if r["status"] != "OK"]

    await asyncio.gather(*(one(chunk) for chunk in chunks))
    if failures and strict:
        raise PipelineError(f"{len(failures)} end requests failed, first: {failures[0]}")


def _check_outcomes(results: list[dict], outcome: int, failures: list[str]) -> None:
    """A commit that finds a half discarded or rolled back already did not make it visible."""
    if outcome != COMMIT:
        return
    other = next((r["outcome"] for r in results if r.get("outcome") not in (None, "commit")), None)
    if other is not None:
        failures.append(f"a half was {other} before the commit (its write took longer than its immunity "
                        f"and the node's checks)")


# -- a stream's commits ----------------------------------------------------------------------------

def commits_topic(group: str) -> str:
    return f"%SPARK%{group}"[:127]


def commit_batch(options: dict, group: str, batch_id: int, packed: list[bytes]) -> str:
    """A micro-batch's commit, once whatever Spark replays: "committed", or "replayed" when the
    node holds its commit already (this attempt's halves are then rolled back)."""
    return asyncio.run(_with_producer(options, lambda producer: _commit_batch(options, producer, group, batch_id,
                                                                              packed)))


async def _commit_batch(options: dict, producer: AsyncProducer, group: str, batch_id: int, packed: list[bytes]) -> str:
    topic = commits_topic(group)
    last, intent = _last_commit(options, topic)
    mine = array.array("q")
    for data in packed:
        mine.extend(unpack(data))
    if intent is not None:  # a batch whose intent is whole and whose ends may not all have been made
        await _end(producer, group, intent[1], COMMIT, strict=True)
        await _marker(producer, topic, {"kind": "done", "batch": intent[0]})
        last = intent[0]
    if last is not None and batch_id <= last:
        await _end(producer, group, mine, ROLLBACK)
        await _roll_back_open(producer, group)
        return "replayed"
    await _ensure_topic(producer, topic)
    parts = [mine[at: at + 2 * INTENT_PART_HALVES] for at in range(0, len(mine), 2 * INTENT_PART_HALVES)] or \
        [array.array("q")]
    for i, part in enumerate(parts):
        await _marker(producer, topic, {"kind": "intent", "batch": batch_id, "part": i, "parts": len(parts)}, pack(part))
    await _end(producer, group, mine, COMMIT, strict=True)
    await _marker(producer, topic, {"kind": "done", "batch": batch_id})
    await _roll_back_open(producer, group)
    return "committed"


async def _ensure_topic(producer: AsyncProducer, topic: str) -> None:
    """The sink's commits topic, made with one queue when it is not there (autoCreateTopicEnable off)."""
    reply, _ = await producer.request({"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": topic})
    if reply.get("status") == "TOPIC_NOT_EXIST":
        reply, _ = await producer.request({"code": protocol.UPDATE_AND_CREATE_TOPIC, "topic": topic,
                                           "readQueueNums": 1, "writeQueueNums": 1})
        if reply.get("status") != "OK":
            raise PipelineError(f"the sink's commits topic {topic} could not be made: {reply.get('status')} "
                                f"{reply.get('remark', '')}")


async def _marker(producer: AsyncProducer, topic: str, fields: dict, body: bytes = b"") -> None:
    message = Message(topic, body or b"-", properties={"SPARK_COMMIT": orjson.dumps(fields).decode()})
    result = await producer.send_message(message, queue_id=0)
    if result.status != "PUT_OK":
        raise PipelineError(f"the sink's commit record was not stored: {result.status}")


def _last_commit(options: dict, topic: str) -> tuple[int | None, tuple[int, array.array] | None]:
    """(the last batch done, a whole intent after it not yet done) from the tail of `topic`."""
    endpoint = _get(options, "endpoint")
    with PullConsumer(endpoint, timeout=timeout_option(lambda key: _get(options, key)),
                      credentials=credentials_option(lambda k: _get(options, k))) as consumer:
        try:
            end = consumer.max_offset(topic, 0)
        except SendError as e:
            if e.status == "TOPIC_NOT_EXIST":
                return None, None
            raise
        while end > 0:
            tail = _markers(consumer, topic, end - 1, 1)
            if not tail:
                return None, None
            fields, _ = tail[0]
            if fields["kind"] == "done":
                return fields["batch"], None
            first = end - 1 - fields["part"]
            if fields["part"] == fields["parts"] - 1:  # whole: its halves may be partly ended
                halves = array.array("q")
                for _, body in _markers(consumer, topic, first, fields["parts"]):
                    halves.extend(unpack(body))
                return None, (fields["batch"], halves)  # (the caller takes its batch for the last)
            end = first  # an intent cut short: none of its halves was ended
        return None, None


def _markers(consumer, topic: str, offset: int, count: int) -> list[tuple[dict, bytes]]:
    out = []
    while len(out) < count:
        result = consumer.pull(topic, 0, offset + len(out), max_count=min(32, count - len(out)))
        if not result.messages:
            break
        out += [(orjson.loads(m.properties["SPARK_COMMIT"]), m.body) for m in result.messages]
    return out
