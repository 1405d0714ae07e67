"""The argparse types of the CLI's flags (node.tools.cli and its commands): numbers with a least
value, true/false, a JSON object. Each refusal is argparse's usage error (status 2)."""

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
