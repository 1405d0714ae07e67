"""`scripts/mqnode`: the command users run. Subcommands: start, produce, consume, query, admin,
keygen, dump, verify.

Every command that opens a store takes its settings from `--conf FILE` (flat key = value lines,
see conf/broker.toml) and from `--<settingName> VALUE` flags, which win over the file.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
from pathlib import Path

import orjson

from node.client.errors import BadEndpoint
from node.tools import cli_values as values
from shm import settings as settings_module
from shm.codec import Corruption, Record
from shm.mapped_file import StoreError
from shm.settings import FIELDS, REPLACED_BY_TOPOLOGY, Settings, SettingsError


def _add_store_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", help="store root directory (storePathRootDir)")
    add_settings_flags(parser, "settings (override --conf)")


def add_settings_flags(parser: argparse.ArgumentParser, title: str) -> None:
    """--conf, --<setting> and --set: the same settings flags on every command that reads a store."""
    parser.add_argument("--conf", help="settings file (flat key = value lines, as conf/broker.toml)")
    group = parser.add_argument_group(title)
    for name in FIELDS:
        group.add_argument(f"--{name}", dest=f"setting_{name}", metavar="VALUE", help=argparse.SUPPRESS)
    for name in REPLACED_BY_TOPOLOGY:  # refused with an error that names `topology`
        group.add_argument(f"--{name}", dest=f"replaced_{name}", metavar="VALUE", help=argparse.SUPPRESS)
    group.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="any setting of conf/broker.toml, e.g. --mappedFileSizeCommitLog 65536 or "
                            "--set maxHashSlotNum=500 (every setting is also a --<name> flag)")


def _settings_from(args: argparse.Namespace) -> Settings:
    overrides: dict[str, object] = {}
    for item in args.set:
        name, separator, value = item.partition("=")
        if not separator:
            raise SettingsError(f"--set {item!r}: expected KEY=VALUE")
        overrides[name.strip()] = value
    for name in (*FIELDS, *REPLACED_BY_TOPOLOGY):
        value = getattr(args, f"setting_{name}", None) or getattr(args, f"replaced_{name}", None)
        if value is not None:
            overrides[name] = value
    if args.store:
        overrides["storePathRootDir"] = args.store
    return settings_module.load(args.conf, overrides)


# -- dump --------------------------------------------------------------------------------------


def record_json(record: Record) -> dict:
    """A record as RocketMQ names its fields; the body as text when it is UTF-8, else base64."""
    out = {
        "offset": record.position, "size": record.total_size, "topic": record.topic,
        "queueId": record.queue_id, "queueOffset": record.queue_offset, "flag": record.flag,
        "sysFlag": record.sys_flag, "bornTimestamp": record.born_timestamp,
        "storeTimestamp": record.store_timestamp, "bornHost": str(record.born_host),
        "storeHost": str(record.store_host), "reconsumeTimes": record.reconsume_times,
        "preparedTransactionOffset": record.prepared_transaction_offset, "bodyCrc": record.body_crc,
        "properties": record.properties, "msgId": record.msg_id,
    }
    try:
        out["body"] = record.body.decode("utf-8")
    except UnicodeDecodeError:
        out["bodyBase64"] = base64.b64encode(record.body).decode("ascii")
    return out


def cmd_dump(args: argparse.Namespace) -> int:
    from shm.store import MessageStore
    from shm.verify import walk_records

    settings = _settings_from(args)
    if not settings.commitlog_dir.is_dir():
        raise StoreError(f"no store at {settings.root}: {settings.commitlog_dir} does not exist")
    with MessageStore(settings, readonly=True) as store:
        printed = 0
        write = sys.stdout.buffer.write
        for item in walk_records(store, args.from_offset):
            if isinstance(item, Corruption):
                print(f"mqnode dump: {item.kind.value} at offset {item.position}: {item.detail}", file=sys.stderr)
                return 1
            if args.topic is not None and item.topic != args.topic:
                continue
            write(orjson.dumps(record_json(item)) + b"\n")
            printed += 1
            if args.count is not None and printed >= args.count:
                break
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from shm.verify import verify_store

    report = verify_store(_settings_from(args))
    print(report.summary())
    return 0 if report.ok else 1


def cmd_start(args: argparse.Namespace) -> int:
    from node.server.launcher import run
    from node.server.ray_worker import defer
    from shm.store_files import StoreLocked

    defer()  # (what `import ray` loads and a launcher does not use, as in the service processes)
    settings = _settings_from(args)
    try:
        return run(settings, ray_address=args.ray_address)
    except StoreLocked as e:
        print(f"mqnode start: {e}", file=sys.stderr)
        return 1


def cmd_namesrv(args: argparse.Namespace) -> int:
    from node.server import namesrv

    from node.server import logs
    from node.server.ray_worker import defer

    defer()  # (as `start`)
    _, out = logs.own_stdout("namesrv")  # (Ray's driver prints its raylets' news on stdout)
    return namesrv.run(namesrv.endpoint_of(args.listen), args.dir, args.ray_address, out=out)


DEFAULT_ENDPOINT = "tcp://127.0.0.1:10911"


def target(args: argparse.Namespace) -> dict:
    """A client's way to the messages: one node (--endpoint) or a cluster (--namesrv)."""
    namesrv = getattr(args, "namesrv", None)
    return {"namesrv": namesrv} if namesrv else {"endpoint": args.endpoint}


def cmd_produce(args: argparse.Namespace) -> int:
    """Bodies from stdin, one per line; a JSON line per message; exit 1 if any send failed."""
    from node.client import Message, Producer, SendError

    problem = values.produce_flags_problem(args)
    if problem:
        print(f"mqnode produce: error: {problem}", file=sys.stderr)
        return 2
    properties = {}
    for item in args.property:
        name, separator, value = item.partition("=")
        if not separator or not name or not value:  # (an empty value is not stored: RocketMQ's parser drops it)
            raise SettingsError(f"--property {item!r}: expected KEY=VALUE, neither empty")
        properties[name] = value
    keys = args.keys.split() if args.keys else None
    lines = (line.rstrip(b"\n") for line in sys.stdin.buffer)  # (as bytes: a body need not be text)
    if args.request:
        from node.tools.cli_requests import produce_requests
        return produce_requests(args, lines, lambda body: {"tags": args.tags, "keys": keys, "properties": dict(properties),
                                                           "queue_id": args.queue})
    if args.transaction:
        from node.tools.cli_transactions import produce_in_transaction
        return produce_in_transaction(args, lines, lambda body: {"tags": args.tags, "keys": keys,
                                                                 "properties": dict(properties), "queue_id": args.queue})
    failed = 0
    out = sys.stdout
    with Producer(**target(args), timeout=args.timeout) as producer:
        def message(body: bytes) -> Message:
            return Message(args.topic, body, args.tags, keys, dict(properties), args.delay_level,
                           deliver_at_ms=args.deliver_at, delay_ms=args.delay_ms)

        def report(outcome) -> None:
            nonlocal failed
            if isinstance(outcome, SendError):
                failed += 1
                out.write(orjson.dumps({"status": outcome.status, "remark": outcome.remark}).decode() + "\n")
            else:
                out.write(orjson.dumps(outcome.to_json()).decode() + "\n")

        for chunk in _chunks(lines, args.batch or 256):
            if args.batch:
                try:
                    for result in producer.send_batch(args.topic, [message(b) for b in chunk], queue_id=args.queue):
                        report(result)
                except SendError as e:
                    for _ in chunk:
                        report(e)
                continue
            futures = [producer._call_async(producer.inner.send_message(message(b), queue_id=args.queue)) for b in chunk]
            for future in futures:
                try:
                    report(future.result())
                except SendError as e:
                    report(e)
            out.flush()
    return 1 if failed else 0


def cmd_recall(args: argparse.Namespace) -> int:
    """Recall timer messages before their time: each handle (a `recallHandle` `produce` printed)
    from --handle or stdin lines; a JSON line each; exit 1 if any recall failed."""
    from node.client import Producer, SendError

    handles = args.handle or [line.strip() for line in sys.stdin if line.strip()]
    failed = 0
    with Producer(**target(args), timeout=args.timeout) as producer:
        for handle in handles:
            try:
                shown = {"status": "OK", "msgId": producer.recall(args.topic, handle)}
            except (SendError, ValueError) as e:
                failed += 1
                shown = {"status": getattr(e, "status", "ILLEGAL_HANDLE"), "remark": getattr(e, "remark", str(e))}
            print(orjson.dumps(shown).decode(), flush=True)
    return 1 if failed else 0


def _chunks(iterable, size: int):
    chunk = []
    for item in iterable:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def cmd_consume(args: argparse.Namespace) -> int:
    """One JSON line per message; commits the group's offsets as it goes."""
    from node.client import PullConsumer, SendError

    problem = values.consume_flags_problem(args)
    if problem:
        print(f"mqnode consume: error: {problem}", file=sys.stderr)
        return 2
    if args.push:
        from node.tools.cli_groups import consume_push

        return consume_push(args)
    if args.pop:
        from node.tools.cli_groups import consume_pop

        return consume_pop(args)
    printed = 0
    expression, expression_type = selection(args)
    with PullConsumer(**target(args)) as consumer:
        try:
            start = args.from_time if args.from_time is not None else args.start
            for message in consumer.consume(args.topic, args.group, start=start, subscription=expression,
                                            expression_type=expression_type, idle_timeout=args.timeout,
                                            limit=args.count):
                sys.stdout.write(orjson.dumps(message.to_json()).decode() + "\n")
                sys.stdout.flush()
                printed += 1
        except SendError as e:
            print(f"mqnode consume: {e}", file=sys.stderr)
            return 1
    return 0


def selection(args: argparse.Namespace) -> tuple[str, str]:
    """`consume`'s filter: (expression, expression type) from --sql or --tags."""
    return (args.sql, "SQL92") if args.sql else (args.tags or "*", "TAG")


def add_credentials(parser: argparse.ArgumentParser) -> None:
    """A node with security on (docs/operations.md "Access control"): each flag stands for the
    environment variable named in its help, which it overrides for this command."""
    group = parser.add_argument_group("credentials (a node with aclEnable or curveEnable)")
    for flag, variable, what in CREDENTIAL_FLAGS:
        group.add_argument(flag, dest=variable, metavar="VALUE", help=f"{what} (else ${variable})")


CREDENTIAL_FLAGS = (("--access-key", "MQNODE_ACCESS_KEY", "the ACL account's access key"),
                    ("--secret-key", "MQNODE_SECRET_KEY", "its secret key: requests are signed with it"),
                    ("--server-key", "MQNODE_SERVER_KEY", "the node's CURVE public key: Z85 text or its .key file"),
                    ("--client-key", "MQNODE_CLIENT_KEY", "this client's CURVE key pair, a .key_secret file "
                                                          "(for a node with curveClientKeysDir)"))


def cmd_keygen(args: argparse.Namespace) -> int:
    """A CURVE key pair in ZeroMQ's certificate format: NAME.key (public) and NAME.key_secret."""
    import zmq.auth

    directory = Path(args.dir)
    for suffix in (".key", ".key_secret"):
        if (directory / f"{args.name}{suffix}").exists():
            print(f"mqnode keygen: {directory / (args.name + suffix)} exists; not overwritten (another --name "
                  "or --dir, or remove it)", file=sys.stderr)
            return 1
    directory.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.auth.create_certificates(directory, args.name)
    os.chmod(secret, 0o600)
    key = zmq.auth.load_certificate(public)[0].decode()
    print(orjson.dumps({"publicKeyFile": str(public), "secretKeyFile": str(secret), "publicKey": key}).decode())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqnode", description="mqnode: a RocketMQ-compatible message store node")
    commands = parser.add_subparsers(dest="command", required=True)
    dump = commands.add_parser("dump", help="print CommitLog records as JSON lines")
    _add_store_options(dump)
    dump.add_argument("--topic", help="only records of this topic")
    dump.add_argument("--from", dest="from_offset", type=int, help="start at this CommitLog offset (a record start)")
    dump.add_argument("--count", type=values.COUNT, help="stop after this many records")
    dump.set_defaults(handler=cmd_dump)
    verify = commands.add_parser("verify", help="check CRCs, ConsumeQueues and the IndexFile of a store")
    _add_store_options(verify)
    verify.set_defaults(handler=cmd_verify)
    start = commands.add_parser("start", help="run a node until SIGINT, SIGTERM or SIGHUP (defaults: conf/broker.toml)")
    _add_store_options(start)
    start.add_argument("--ray-address", help="join this Ray cluster instead of starting an embedded Ray")
    start.set_defaults(handler=cmd_start)
    names = commands.add_parser("namesrv", help="run a name service (RocketMQ's NameServer requests) until SIGINT, SIGTERM or SIGHUP")
    names.add_argument("--listen", default="tcp://127.0.0.1:9876", help="its endpoint (host:port or tcp://host:port)")
    names.add_argument("--dir", help="where its table's file goes (default ~/mqnode/namesrv-PORT)")
    names.add_argument("--ray-address", help="join this Ray cluster instead of starting an embedded Ray")
    names.set_defaults(handler=cmd_namesrv)
    from node.tools import cli_stop

    cli_stop.add_parser(commands, _add_store_options, _settings_from)
    _produce_parser(commands)
    _recall_parser(commands)
    _consume_parser(commands)
    from node.tools import cli_query

    cli_query.add_parser(commands, add_credentials, DEFAULT_ENDPOINT)
    _admin_parser(commands)
    from node.tools import cli_cluster

    cli_cluster.add_parser(commands)
    keygen = commands.add_parser("keygen", help="make a CURVE key pair: the node's (curveSecretKeyFile) or a client's")
    keygen.add_argument("--dir", default="conf/curve", help="where to write NAME.key and NAME.key_secret")
    keygen.add_argument("--name", default="node", help="the files' name (default node)")
    keygen.set_defaults(handler=cmd_keygen)
    return parser


def _produce_parser(commands) -> None:
    produce = commands.add_parser("produce", help="send stdin lines as messages, print a JSON result per line")
    produce.add_argument("--endpoint", default=DEFAULT_ENDPOINT)
    produce.add_argument("--namesrv", help="a cluster's name services (host:port;host:port) instead of --endpoint")
    add_credentials(produce)
    produce.add_argument("--topic", required=True)
    produce.add_argument("--tags")
    produce.add_argument("--keys", help='space-separated keys, e.g. "k1 k2"')
    produce.add_argument("--property", action="append", default=[], metavar="KEY=VALUE", help="a user property (repeatable)")
    produce.add_argument("--delay-level", type=int, default=0, help="RocketMQ delay level (1..18 by default)")
    timer = produce.add_mutually_exclusive_group()
    timer.add_argument("--deliver-at", type=int, metavar="MS", help="a timer: deliver at this epoch time in ms")
    timer.add_argument("--delay-ms", type=int, metavar="N", help="a timer: deliver N ms after sending")
    produce.add_argument("--queue", type=int, help="queue id (default: round-robin)")
    produce.add_argument("--batch", type=values.COUNT, default=0, help="send N lines at a time as one batch (one queue)")
    produce.add_argument("--timeout", type=values.TIMEOUT, default=3.0,
                         help="seconds to wait for each reply; with --transaction unknown --check-answer: to stay "
                              "connected answering the node's checks")
    produce.add_argument("--transaction", choices=["commit", "rollback", "unknown"],
                         help="send each line as a transaction's half, then end it so (unknown: left to the check)")
    produce.add_argument("--group", type=values.group, help="--transaction: the producer group (PGROUP) the node asks about open halves; "
                                         "--request: the requester's producer group")
    produce.add_argument("--request", action="store_true",
                         help="send each line as a request (request-reply) and print its reply, waiting --timeout s")
    produce.add_argument("--check-answer", choices=["commit", "rollback"],
                         help="--transaction unknown: answer the node's checks so, while connected")
    produce.set_defaults(handler=cmd_produce)


def _recall_parser(commands) -> None:
    recall = commands.add_parser("recall", help="cancel timer messages before their time by the recallHandle "
                                                "produce printed (RocketMQ 5.3's recall)")
    recall.add_argument("--endpoint", default=DEFAULT_ENDPOINT)
    recall.add_argument("--namesrv", help="a cluster's name services (host:port;host:port) instead of --endpoint")
    add_credentials(recall)
    recall.add_argument("--topic", required=True)
    recall.add_argument("--handle", action="append", help="a recall handle (repeatable; default: one a stdin line)")
    recall.add_argument("--timeout", type=values.TIMEOUT, default=3.0, help="seconds to wait for each reply")
    recall.set_defaults(handler=cmd_recall)


def _consume_parser(commands) -> None:
    consume = commands.add_parser("consume", help="print a topic's messages as JSON lines, committing a group's offsets")
    consume.add_argument("--endpoint", default=DEFAULT_ENDPOINT)
    consume.add_argument("--namesrv", help="a cluster's name services (host:port;host:port) instead of --endpoint")
    add_credentials(consume)
    consume.add_argument("--topic", required=True)
    consume.add_argument("--group", type=values.group, required=True)
    consume.add_argument("--from", dest="start", choices=["first", "last", "committed"], default="committed",
                         help="committed (default): the group's offsets, first where it has none")
    consume.add_argument("--from-time", type=int, metavar="MS", help="instead of --from: each queue from its first "
                                                                      "message stored at or after this epoch time (ms)")
    chosen = consume.add_mutually_exclusive_group()
    chosen.add_argument("--tags", help='subscription: "*" or "TagA || TagB"')
    chosen.add_argument("--sql", help="subscription: a SQL92 selector over the messages' properties, e.g. "
                                      "\"a > 5 AND TAGS IN ('TagA')\" (a node with enablePropertyFilter)")
    consume.add_argument("--count", type=values.COUNT, help="stop after N messages")
    consume.add_argument("--timeout", type=values.SECONDS, default=5.0, help="stop after S seconds without a message")
    consume.add_argument("--push", action="store_true", help="a push consumer: a member of the group, its share of "
                                                             "the queues (rebalanced as members come and go)")
    consume.add_argument("--broadcast", action="store_true", help="--push: every member gets every message")
    consume.add_argument("--orderly", action="store_true", help="--push: each queue in order, under its lock; "
                                                                "--pop: a queue's next message only once the one before is acked")
    consume.add_argument("--pop", action="store_true", help="pop consumption: messages from any queue, each invisible "
                                                            "to the group until acked (each is acked once printed)")
    consume.add_argument("--invisible-ms", type=values.MOST, help="--pop: how long a popped message stays "
                                                                          "invisible to the group unless acked")
    consume.add_argument("--no-ack", action="store_true", help="--pop: print without acking (they come back)")
    consume.add_argument("--threads", type=values.THREADS, help="--push: consume threads (default 20)")
    consume.add_argument("--instance-name", help="--push: this member's name in its client id (default: the pid)")
    consume.add_argument("--offset-store-dir", help="--push --broadcast: where its offsets file goes")
    consume.set_defaults(handler=cmd_consume)


def _admin_parser(commands) -> None:
    admin = commands.add_parser("admin", help="ask a running node: stats, topics, groups, offsets, a topic's route, "
                                              "delays, transactions, replication (ha), or to clean; promote a slave (role); create, update or delete topics and groups; "
                                              "reset a group's offsets")
    admin.add_argument("what", choices=["stats", "topics", "groups", "offsets", "topic", "group", "reset-offset", "clean",
                                        "delays", "ha", "role", "transactions", "cluster", "config", "producers",
                                        "consumer-status"])
    admin.add_argument("action", nargs="?", choices=["create", "update", "delete"],
                       help="for `admin topic` and `admin group` (without: `admin topic` shows the topic's route and each "
                            "queue's offsets), and `admin config update`")
    admin.add_argument("--endpoint", default=DEFAULT_ENDPOINT)
    admin.add_argument("--namesrv", help="a cluster's name services (host:port;host:port): for `admin cluster`, "
                                         "`admin topics` (the cluster's view), `admin topic` (each group's queues); "
                                         "every other command but `admin role` runs on every group's master")
    add_credentials(admin)
    admin.add_argument("--topic", help="for `admin topic` and `admin reset-offset`; filters `admin offsets`")
    admin.add_argument("--group", help="for `admin offsets`, `admin group`, `admin consumer-status` and `admin "
                                       "reset-offset`; a producer group for `admin producers`, and filters `admin "
                                       "transactions`' open halves")
    admin.add_argument("--client-id", help="admin consumer-status: one member of --group (default: every member)")
    admin.add_argument("--stacks", action="store_true",
                       help="admin consumer-status: each member's thread stacks too (`jstack`: where its listener is)")
    admin.add_argument("--queues", type=int, help="admin topic create|update: read and write queues")
    admin.add_argument("--read-queues", type=int, help="admin topic create|update: read queues only")
    admin.add_argument("--write-queues", type=int, help="admin topic create|update: write queues only")
    admin.add_argument("--perm", type=int, help="admin topic create|update: 6 read and write, 4 read only, 2 write only")
    admin.add_argument("--retry-queues", type=int, help="admin group create|update: retryQueueNums")
    admin.add_argument("--max-retries", type=int, help="admin group create|update: retryMaxTimes (send-backs before the DLQ)")
    admin.add_argument("--which-broker-when-slow", type=int, help="admin group create|update: whichBrokerWhenConsumeSlowly")
    admin.add_argument("--consume-enable", type=values.boolean, help="admin group create|update: true|false (false: its pulls are refused)")
    admin.add_argument("--broadcast", type=values.boolean, help="admin group create|update: consumeBroadcastEnable, true|false")
    admin.add_argument("--fifo", dest="orderly_group", type=values.boolean,
                       help="admin group create|update: consumeMessageOrderly, true|false (RocketMQ 5 clients over "
                            "gRPC consume the group in order: FIFO)")
    admin.add_argument("--retry-policy", type=values.json_object, metavar="JSON",
                       help="admin group create|update: groupRetryPolicy, RocketMQ 5's, how gRPC consumers back off "
                            "between retries: '{\"type\": \"EXPONENTIAL\", \"exponentialRetryPolicy\": {\"initial\": 1000, "
                            "\"max\": 60000, \"multiplier\": 2}}' or '{\"type\": \"CUSTOMIZED\", \"customizedRetryPolicy\": "
                            "{\"next\": [1000, 5000]}}'")
    admin.add_argument("--to-timestamp", type=int, metavar="MS", help="admin reset-offset: to the first message stored at or after")
    admin.add_argument("--to", choices=["first", "last"], help="admin reset-offset: to each queue's first or last offset")
    admin.add_argument("--role", choices=["ASYNC_MASTER", "SYNC_MASTER"],
                       help="admin role: promote a slave (it stops following and takes sends), or switch a master")
    admin.add_argument("--force", action="store_true",
                       help="for `admin clean`: delete the oldest segments whatever their age (never the last)")
    admin.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="admin config update: a setting to change while the node runs (brokerPermission: 6, 4 read "
                            "only, 2 write only), until it stops")
    admin.add_argument("--timeout", type=values.TIMEOUT, default=None, help="seconds to wait (default 5; 120 for clean)")
    from node.tools.cli_admin import cmd_admin

    admin.set_defaults(handler=cmd_admin)


STANDARD_STREAMS = (("stdin", "r"), ("stdout", "w"), ("stderr", "w"))


def standard_streams_open() -> None:
    """Give a closed stdin, stdout or stderr /dev/null, as daemons do (OpenSSH's sanitise_stdfd).
    A command started with one closed (`2>&-`, a supervisor that closes them) had it as None:
    `start` died in Ray's start without a word (its faulthandler wants a stderr); and the next
    file the process opened would take the descriptor, so what is printed would land in it."""
    for fd, (name, mode) in enumerate(STANDARD_STREAMS):
        try:
            os.fstat(fd)
        except OSError:  # closed: the lowest free descriptor is this one (the lower ones are open by now)
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False, encoding="utf-8", errors="backslashreplace"))


def main(argv: list[str] | None = None) -> int:
    standard_streams_open()
    args = build_parser().parse_args(argv)
    for _, variable, _ in CREDENTIAL_FLAGS:  # the clients this command makes read them (node.security)
        if getattr(args, variable, None):
            os.environ[variable] = getattr(args, variable)
    try:
        return args.handler(args)
    except (SettingsError, StoreError, BadEndpoint) as e:
        print(f"mqnode {args.command}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:  # (Ctrl-C on consume, produce, query...: the shell's status for it, no traceback)
        return 130


if __name__ == "__main__":
    sys.exit(main())
