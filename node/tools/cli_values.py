"""The CLI's flags (node.tools.cli and its commands): their argparse types (numbers with a least
value, true/false, a JSON object, a group's name), each refusal argparse's usage error (status 2),
and the combinations `produce` and `consume` refuse (status 2 too): a flag their mode would
ignore."""

from __future__ import annotations

import argparse

import orjson

from node import protocol


def _at_least(least: int | float, kind=int, *, above: bool = False):
    """An argparse type: a number (`kind`) of at least `least` (`above`: more than it) ("--count -1"
    read no message and said nothing; "--threads -1" was a traceback)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (value > least if above else value >= least):  # (NaN too)
            raise argparse.ArgumentTypeError(f"{text} is not above {least}" if above else f"{text} is below {least}")
        return value
    return parse


# a count; seconds without a message (0: stop when none is waiting); a client's wait for a reply; threads
COUNT, SECONDS, TIMEOUT, THREADS = _at_least(0), _at_least(0.0, float), _at_least(0.0, float, above=True), _at_least(1)
MOST = THREADS  # the most of something to find: 1 or more


def boolean(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
    return text.lower() == "true"


def json_object(text: str) -> dict:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object")
    return value


def group(text: str) -> str:
    """A consumer or producer group's name, as the clients check it (a ValueError there was a
    traceback from `produce --transaction` and `consume --push`)."""
    try:
        protocol.check_group(text, "group")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def consume_flags_problem(args: argparse.Namespace) -> str | None:
    """A flag `consume` would ignore in the mode asked for (a --broadcast without --push read as
    an ordinary group, in silence)."""
    if args.push and args.pop:
        return "--push and --pop exclude each other"
    needs = (("--broadcast", args.broadcast, args.push, "--push"), ("--threads", args.threads, args.push, "--push"),
             ("--instance-name", args.instance_name, args.push, "--push"),
             ("--offset-store-dir", args.offset_store_dir, args.push and args.broadcast, "--push --broadcast"),
             ("--orderly", args.orderly, args.push or args.pop, "--push or --pop"),
             ("--no-ack", args.no_ack, args.pop, "--pop"), ("--invisible-ms", args.invisible_ms, args.pop, "--pop"))
    for flag, given, mode, named in needs:
        if given not in (None, False) and not mode:
            return f"{flag} is for {named}"
    return None


def produce_flags_problem(args: argparse.Namespace) -> str | None:
    """A flag `produce` would ignore in the mode asked for (a --delay-level with --transaction
    sent at once, as RocketMQ's client drops a transactional message's delay, in silence)."""
    if args.transaction and args.request:
        return "--transaction and --request exclude each other"
    mode = "--transaction" if args.transaction else "--request" if args.request else None
    delays = [flag for flag, given in (("--delay-level", args.delay_level), ("--deliver-at", args.deliver_at),
                                       ("--delay-ms", args.delay_ms), ("--batch", args.batch)) if given]
    if mode and delays:
        return f"{mode} sends each message at once, alone: it takes no {', '.join(delays)}"
    if args.check_answer and args.transaction != "unknown":
        return "--check-answer is for --transaction unknown (the halves the node then asks about)"
    return None
