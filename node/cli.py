"""`scripts/mqnode`: the command users run. Subcommands: start, produce, admin, dump, verify.

Every command that opens a store takes its settings from `--conf FILE` (flat key = value lines,
see conf/broker.toml) and from `--<settingName> VALUE` flags, which win over the file.
"""

from __future__ import annotations

import argparse
import base64
import sys

import orjson

from shm import settings as settings_module
from shm.codec import Corruption, Record
from shm.mapped_file import StoreError
from shm.settings import FIELDS, Settings, SettingsError


def _add_store_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", help="store root directory (storePathRootDir)")
    parser.add_argument("--conf", help="settings file (flat key = value lines, as conf/broker.toml)")
    group = parser.add_argument_group("settings (override --conf)")
    for name in FIELDS:
        group.add_argument(f"--{name}", dest=f"setting_{name}", metavar="VALUE", help=argparse.SUPPRESS)
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
    for name in FIELDS:
        value = getattr(args, f"setting_{name}", None)
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
    from node.launcher import run
    from shm.store_files import StoreLocked

    settings = _settings_from(args)
    try:
        return run(settings, ray_address=args.ray_address)
    except StoreLocked as e:
        print(f"mqnode start: {e}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqnode", description="mqnode: a RocketMQ-compatible message store node")
    commands = parser.add_subparsers(dest="command", required=True)
    dump = commands.add_parser("dump", help="print CommitLog records as JSON lines")
    _add_store_options(dump)
    dump.add_argument("--topic", help="only records of this topic")
    dump.add_argument("--from", dest="from_offset", type=int, help="start at this CommitLog offset (a record start)")
    dump.add_argument("--count", type=int, help="stop after this many records")
    dump.set_defaults(handler=cmd_dump)
    verify = commands.add_parser("verify", help="check CRCs, ConsumeQueues and the IndexFile of a store")
    _add_store_options(verify)
    verify.set_defaults(handler=cmd_verify)
    start = commands.add_parser("start", help="run a node until SIGINT/SIGTERM (defaults: conf/broker.toml)")
    _add_store_options(start)
    start.add_argument("--ray-address", help="join this Ray cluster instead of starting an embedded Ray")
    start.set_defaults(handler=cmd_start)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (SettingsError, StoreError) as e:
        print(f"mqnode {args.command}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
