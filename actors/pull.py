"""pull: the read service's shell. It serves the read side from read-only mappings and holds
empty pulls (long polling); what it reads and how long it holds is its core's,
actors.pull_core.ReadCore (the control block, the store's mappings and a clock in; replies out).
This shell owns the links and sockets, whichever process hosts it: in compact, the front's
process loop, which saves two ipc hops and a process wake-up per pull.

Links (actors.links): read requests in from the router, replies out to it: rings
`front-to-pull-i` and `pull-i-to-front` when this shell runs in a pull worker process of its
own (split; a reply too large for a ring message goes by the front's `replies` socket), local
links when it runs in the front's process (compact, actors.host). Socket: `arrivals` SUB
(connected to the dispatcher's PUB: "queue grew" announcements), read only while some pull is
held (`follow_arrivals`).
"""

from __future__ import annotations

import zmq

from actors.base import Actor, incoming, socket
from actors.links import inbox, reply_outbox, service_links_statistics
from actors.pull_core import ReadCore
from actors.wire import arrivals_from_wire, arrivals_subscriptions, read_from_wire

MAX_TAKE = 256
ARRIVALS_HWM = 10_000  # announcements left from the last pulls held (or, without the C fence, any) are dropped unread


class Pull(Actor):
    """The read service's shell: read requests from the router, replies to it, the dispatcher's
    arrivals while pulls are held."""

    name = "pull"

    def __init__(self, settings, *, instance: int = 0):
        super().__init__(settings, instance=instance)
        self.core: ReadCore | None = None
        self.requests = self.replies = None

    def open(self) -> None:
        self.core = ReadCore(self.settings, self.control, watcher=1 + self.instance)
        self.arrivals = arrivals_socket(self.context, self.endpoints, self.core.watcher)
        self.requests, self.replies = self._links()
        self.idle_items = self.requests.poll_items()
        self.watch_items = self.idle_items + [(self.arrivals, zmq.POLLIN)]

    def _links(self):
        """The router's ends: local links in its process, else its rings."""
        links = self.local_links
        if links is not None and links.get(f"front-to-{self.label}") is not None:
            return links.into(self.label)[0], links.get(f"{self.label}-to-front")
        return inbox(self, read_from_wire), reply_outbox(self)

    def poll_items(self) -> list:
        return self.watch_items if self.core.watching else self.idle_items

    def timeout_ms(self) -> int:
        return self.requests.wait_ms(self.core.timeout_ms())

    def step(self, events: set) -> None:
        core, out = self.core, []
        if self.arrivals in events:
            read_arrivals(core, self.arrivals, out)
        for request in self.requests.take():  # (header, client, arrival[, header as the client sent it])
            core.serve_request(request[0], request[1], request[2], out)
        follow_arrivals(core, self.arrivals, out)
        core.after_turn(out)
        if out:
            self.replies.send(out)

    def follow_min_offset(self, min_offset: int) -> None:
        self.core.follow_min_offset(min_offset)

    def follow_topic_deletions(self) -> None:
        self.core.follow_topic_deletions()

    def drain(self) -> None:
        out: list = []
        self.core.release_all(out)
        if out:
            self.replies.send(out)

    def statistics(self) -> dict:
        stats = super().statistics() | (self.core.statistics() if self.core is not None else {})
        if self.replies is not None and not self.replies.local:  # (its rings: a worker of its own)
            stats["links"] = service_links_statistics(self.requests, self.replies)
        return stats

    def close(self) -> None:
        if self.core is not None:
            self.core.close()
        for end in (self.requests, self.replies):
            if end is not None and not end.local:  # (local links: the host's)
                end.close()
        super().close()


def arrivals_socket(context: zmq.Context, endpoints: dict, watcher: int) -> zmq.Socket:
    """A SUB to the dispatcher's "queue grew" announcements addressed to this reader's watcher
    slot (or to every reader)."""
    arrivals = socket(context, zmq.SUB, hwm=ARRIVALS_HWM)
    for address in arrivals_subscriptions(watcher):
        arrivals.setsockopt(zmq.SUBSCRIBE, address)
    arrivals.connect(endpoints["arrivals"])
    return arrivals


def read_arrivals(core: ReadCore, arrivals: zmq.Socket, out: list) -> None:
    for raw in incoming(arrivals, MAX_TAKE, multipart=False):
        core.on_arrivals(arrivals_from_wire(raw), out)


def follow_arrivals(core: ReadCore, arrivals: zmq.Socket, out: list) -> None:
    """Start or stop reading arrivals as pulls are held. While no pull is held the dispatcher
    addresses this reader none (reading them cost every worker ~40 µs a send for nothing, and
    unread they filled its memory: actors.dispatcher). When holding starts: say so first, drop
    what is left from the last time, then look at each held pull's queue once more. Anything dispatched before that look is found by it; anything after is
    announced into the emptied queue, which is read from now on."""
    if core.held_count and not core.watching:
        core.set_watching(True)
        for _ in incoming(arrivals, ARRIVALS_HWM, multipart=False):
            pass
        core.catch_up(out)
    if core.watching and not core.held_count:
        core.set_watching(False)
