"""Fencing at a slave's start: cut what the master never had, before any service runs.

A slave asks its master's ha-server for the master's epoch history (the zmq link's `E`
request) and compares it with its own (shm.epochs.common_prefix). Bytes past the common prefix
were written by a master that lost its role (an old master restarted as a slave of the node
promoted in its place): they are cut (shm.recovery.cut) and the launcher says how many. The
cut happens here, not in the running ha-client, because the slave's dispatcher and readers
must never see the log go backwards. A master that cannot be reached is not waited for: once
it can, the ha-client's handshake finds the log diverged (so it does when a master restarted
without a tail it had sent). Where a cut would mend it, the ha-client says so in the control block (`fence_pending`) and the launcher ends the node
(`pending`), so that its restart (its supervisor's, or the cluster's) cuts the tail here and
follows; any other refusal (no shared history, an old master) is only said, in `admin ha`.
The RocketMQ link has no epochs and no fencing.
"""

from __future__ import annotations

import orjson
import zmq

from actors import guard
from actors.ha_link import HISTORY
from node import protocol
from shm import epochs
from shm.recovery import cut

ASK_TIMEOUT_MS = 3000


def master_history(settings, timeout_ms: int = ASK_TIMEOUT_MS) -> tuple[list[epochs.Epoch], int] | str:
    """The master's (epochs, max offset), or why they could not be had."""
    host, port = settings.ha_master
    context = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    guard.secure_link(sock, guard.ha_link_keys(settings))
    try:
        endpoint = protocol.tcp_endpoint(host, port)
        protocol.ipv6_ready(sock, endpoint)
        sock.connect(endpoint)
        sock.send(HISTORY)
        if not sock.poll(timeout_ms):
            return f"the master {host}:{port} did not answer within {timeout_ms} ms"
        reply = sock.recv()
        if reply[:1] != HISTORY:
            return f"the master refused: {reply[1:].decode('utf-8', 'replace')}"
        answer = orjson.loads(reply[1:])
        return epochs.from_wire(answer["epochs"]), int(answer["maxOffset"])
    except (ValueError, KeyError, TypeError, orjson.JSONDecodeError) as e:
        return f"the master's history is malformed: {e}"
    finally:
        sock.close(0)


def fence(settings, store, out=print) -> int:
    """Cut the recovered `store` to what it shares with its master; returns the bytes dropped."""
    if settings.haProtocol != "zmq":
        return 0
    answer = master_history(settings)
    if isinstance(answer, str):
        out(f"mqnode fencing skipped: {answer}", flush=True)
        return 0
    master, master_end = answer
    own = epochs.EpochFile(settings.root)
    decision = epochs.common_prefix(master, master_end, own.entries, store.commitlog.offset_written)
    if decision.refusal:
        out(f"mqnode fencing: {decision.refusal}", flush=True)
        return 0
    dropped = cut(store, decision.keep) if decision.dropped else 0
    if dropped:
        out(f"mqnode fencing: dropped {dropped} bytes past offset {decision.keep} that the master "
            f"{settings.haMasterAddress} never had", flush=True)
    own.adopt(master)
    return dropped


def pending(settings, control) -> str | None:
    """Why the node must end so that its restart fences it (the ha-client's hello was refused for
    bytes of this slave's log past their common history), or None."""
    dropped = control.get("fence_pending")
    if not dropped:
        return None
    return (f"this slave's log holds {dropped} bytes that its master {settings.haMasterAddress} does not have "
            f"(it was not asked at the start, or it lost them): the restart cuts them")
