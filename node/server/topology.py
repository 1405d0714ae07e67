"""The node's topology, declared as data: which services exist and which process hosts each.

A *service* is one job of the node (route requests, encode sends, append, group commit, read,
dispatch, allocate, clean, schedule, pop, transaction check), run by one shell (an actor class, `actor_class`). A
*process* is a Ray actor hosting one or more shells: its `kind`'s, the `hosted` ones in the same
loop and the `threads` ones each on a thread of its own (actors.host); every shell runs the same
code whichever process hosts it (`build`). The launcher starts the processes
`processes(settings)` lists, the supervisor watches exactly those, the launcher hands the front
`hosts(settings)` (where each service lives, for `admin stats`), and docs/architecture.md is
checked against `SERVICES` by a test. Two topologies, chosen by the setting `topology`:

```
split (the default: every service its own process; scales across cores; the write path's
       hand-offs are rings in shared memory, actors.links)
  front       router
  ingress-i   ingress           (ingressWorkers of them; with 0 the writer encodes: writer hosts ingress)
  writer      write
  flush       group commit
  pull-i      read              (pullWorkers of them; 0 = one per core)
  dispatcher  dispatch          allocator  allocate          clean  clean       schedule  schedule
  pop         pop               proxy      proxy (gRPC; unless grpcServerPort = 0)
  transaction transaction check
  ha-server   ha-server         ha-client  ha-client (a slave only)
  (with namesrvAddr, the clean process hosts register: the registrations with the name services)

compact (an operator's choice: fewest processes and wake-ups, best on one or two cores)
  front       router + ingress + write + read (pull hold) in one loop, group commit on a thread
  dispatcher  dispatch          allocator  allocate          clean  clean       schedule  schedule
  pop         pop               proxy      proxy (gRPC; unless grpcServerPort = 0)
  transaction transaction check
  ha-server   ha-server         ha-client  ha-client (a slave only)
```
"""

from __future__ import annotations

from dataclasses import dataclass

from actors.base import Actor
from actors.host import Host

# every service a node runs, and what it does
SERVICES = {
    "router": "the client-facing ROUTER socket: checks every request at the edge, answers routes, offsets and admin",
    "ingress": "validates send requests and encodes them into CommitLog records",
    "write": "the CommitLog's single writer: appends, publishes `written`, answers what need not wait for the disk",
    "group commit": "fdatasync up to `written`, publishes `flushed`, answers the SYNC_FLUSH sends it covers",
    "read": "pulls, queries, offsets by time, view by id, from read-only mappings; holds empty pulls",
    "dispatch": "the reput: ConsumeQueue and IndexFile entries for every record, publishes `dispatched`",
    "allocate": "creates the next CommitLog segment and prefaults pages ahead of the writer",
    "schedule": "delivers delayed messages (levels) and timers when due (re-put through the write path); consumers' send-backs to %RETRY%/%DLQ%",
    "pop": "pop consumption: hands a group's members messages from any queue, invisible until acked; acks, change-invisible, redelivery when the time runs out, %DLQ% past retryMaxTimes; the pop log",
    "proxy": "RocketMQ 5's gRPC protocol (apache.rocketmq.v2) on grpcServerPort: routes, settings, sends, receives and acks (pop) for the official RocketMQ 5 clients, carried to the front as a client",
    "transaction check": "transactional messages: ends half messages (END_TRANSACTION: the committed message and the op record), asks a producer of the group about the halves left open (CHECK_TRANSACTION_STATE), discards those asked transactionCheckMax times",
    "clean": "deletes expired CommitLog segments and the ConsumeQueue and index files below the min offset; disk-full flag",
    "register": "registers the node with the name services of namesrvAddr (REGISTER_BROKER: its group, address, role, topics) every registerNameServerPeriod and when its topics change; unregisters at stop",
    "ha-server": "a master's HA endpoint: sends each following slave the CommitLog from where it stands, publishes its acks (SYNC_MASTER)",
    "ha-client": "a slave's follower: appends its master's CommitLog byte for byte (the slave's CommitLog writer); promotion",
}
TOPOLOGIES = ("compact", "split")


def actor_class(kind: str) -> type[Actor]:
    """The shell class of a process kind, imported here rather than at the top: Ray builds a
    process's shells in its own worker, and a worker that imported every service's modules paid
    ~0.25 s more CPU at each start and restart (13 processes a node: ~3 s of a 2-core start)."""
    match kind:
        case "front":
            from actors.front import Front as shell
        case "ingress":
            from actors.ingress import Ingress as shell
        case "writer":
            from actors.writer import Writer as shell
        case "flush":
            from actors.flush import Flush as shell
        case "allocator":
            from actors.allocator import Allocator as shell
        case "dispatcher":
            from actors.dispatcher import Dispatcher as shell
        case "pull":
            from actors.pull import Pull as shell
        case "clean":
            from actors.clean import Clean as shell
        case "schedule":
            from actors.schedule import Schedule as shell
        case "pop":
            from actors.pop import Pop as shell
        case "transaction":
            from actors.transaction import Transaction as shell
        case "proxy":
            from actors.proxy.shell import Proxy as shell
        case "ha-server":
            from actors.ha_server import HaServer as shell
        case "ha-client":
            from actors.ha_client import HaClient as shell
        case "registrar":
            from actors.registrar import Registrar as shell
        case _:
            raise KeyError(f"no shell of kind {kind!r}")
    return shell


@dataclass(frozen=True)
class Process:
    label: str  # what the supervisor, the pid files and admin stats call it: "front", "pull-2"
    kind: str  # the actor class that hosts its services
    services: tuple[str, ...]
    instance: int = 0
    threads: tuple[str, ...] = ()  # kinds of the shells it runs on threads (their labels, their heartbeats)
    hosted: tuple[str, ...] = ()  # kinds of the shells it runs in its loop after its `kind`'s

    @property
    def beats(self) -> tuple[str, ...]:
        """Every heartbeat the process writes: a hang in any of them is a hang of the process."""
        return (self.label, *self.threads)


def ha_processes(settings) -> list[Process]:
    """Every node serves HA (a slave's ha-server waits for a promotion); a slave also follows."""
    follower = [Process("ha-client", "ha-client", ("ha-client",))] if settings.is_slave else []
    return [Process("ha-server", "ha-server", ("ha-server",)), *follower]


def proxy_processes(settings) -> list[Process]:
    """The gRPC proxy, unless grpcServerPort is 0."""
    return [Process("proxy", "proxy", ("proxy",))] if settings.grpc_port else []


def clean_process(settings) -> Process:
    """The clean service's process; with namesrvAddr it hosts the registrations too (a few
    small requests a minute: not worth a process of their own)."""
    if settings.namesrvAddr:
        return Process("clean", "clean", ("clean", "register"), hosted=("registrar",))
    return Process("clean", "clean", ("clean",))


def processes(settings) -> list[Process]:
    """The node's processes in start order (the front last: the others' sockets exist then)."""
    if settings.topology == "compact":
        return [Process("allocator", "allocator", ("allocate",)),
                Process("dispatcher", "dispatcher", ("dispatch",)),
                clean_process(settings),
                Process("schedule", "schedule", ("schedule",)),
                Process("pop", "pop", ("pop",)),
                Process("transaction", "transaction", ("transaction check",)),
                *ha_processes(settings),
                *proxy_processes(settings),
                Process("front", "front", ("router", "ingress", "write", "group commit", "read"),
                        hosted=("writer", "pull"), threads=("flush",))]
    ingress = settings.ingressWorkers
    pulls = settings.pull_processes
    return [Process("flush", "flush", ("group commit",)),
            Process("allocator", "allocator", ("allocate",)),
            Process("dispatcher", "dispatcher", ("dispatch",)),
            clean_process(settings),
            Process("schedule", "schedule", ("schedule",)),
            Process("pop", "pop", ("pop",)),
            Process("transaction", "transaction", ("transaction check",)),
            Process("writer", "writer", ("write",) if ingress else ("ingress", "write")),
            *(Process(f"ingress-{i}", "ingress", ("ingress",), i) for i in range(ingress)),
            *(Process(f"pull-{i}", "pull", ("read",), i) for i in range(pulls)),
            *ha_processes(settings),
            *proxy_processes(settings),
            Process("front", "front", ("router",))]


def hosts(settings) -> dict[str, list[str]]:
    """service -> the labels of the processes that host it."""
    out: dict[str, list[str]] = {service: [] for service in SERVICES}
    for process in processes(settings):
        for service in process.services:
            out[service].append(process.label)
    return out


def build(process: Process, settings, kwargs: dict[str, dict]) -> Actor:
    """The actor that runs `process`: its one shell, or a host of its shells. `kwargs` are each
    kind's constructor arguments (the write service's recovered state, the router's `hosts`)."""
    def shell(kind: str) -> Actor:
        return actor_class(kind)(settings, **kwargs.get(kind, {}))

    members = [shell(kind) for kind in (process.kind, *process.hosted)]
    threads = [shell(kind) for kind in process.threads]
    if len(members) == 1 and not threads:
        return members[0]
    return Host(settings, process.label, members, threads)
