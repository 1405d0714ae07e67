"""`mqnode produce --request --group G`: each stdin line a request, its reply printed
(docs/operations.md "Request and reply")."""

from __future__ import annotations

import argparse
import asyncio
import sys

import orjson

IN_FLIGHT = 256  # requests waiting for their replies at once; the replies print in the lines' order


def produce_requests(args: argparse.Namespace, lines, options_of) -> int:
    """A JSON line per request: its reply (the replier's message), or the status that says why
    there is none (REQUEST_TIMEOUT after `--timeout` s); exit 1 if any request got no reply."""
    from node.client import Requester, SendError
    from node.tools.cli import _chunks, target
    from shm.settings import SettingsError

    if args.transaction:
        raise SettingsError("produce takes --request or --transaction, not both")
    if not args.group:
        raise SettingsError("produce --request needs --group (the producer group the requester heartbeats as)")
    failed = 0
    with Requester(group=args.group, timeout=args.timeout, **target(args)) as requester:
        for chunk in _chunks(lines, IN_FLIGHT):
            waits = [asyncio.run_coroutine_threadsafe(
                requester.inner.request(args.topic, body, args.timeout, **options_of(body)), requester.loop)
                for body in chunk]
            for wait in waits:
                try:
                    shown = wait.result().to_json()
                except SendError as e:
                    failed += 1
                    shown = {"status": e.status, "remark": e.remark}
                sys.stdout.write(orjson.dumps(shown).decode() + "\n")
            sys.stdout.flush()
    return 1 if failed else 0
