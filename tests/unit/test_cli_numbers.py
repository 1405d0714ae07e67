"""The CLI's counts, seconds and thread numbers are refused below their least with a usage error:
`consume --count -1` read nothing and said nothing, `consume --push --threads -1` ended in a
traceback."""

from __future__ import annotations

import pytest

from node.tools.cli import build_parser

E = ["--endpoint", "tcp://127.0.0.1:1"]


@pytest.mark.parametrize("argv", [
    ["consume", *E, "--topic", "T", "--group", "G", "--count", "-1"],
    ["consume", *E, "--topic", "T", "--group", "G", "--timeout", "-1"],
    ["consume", *E, "--topic", "T", "--group", "G", "--timeout", "nan"],
    ["consume", *E, "--topic", "T", "--group", "G", "--push", "--threads", "0"],
    ["produce", *E, "--topic", "T", "--batch", "-1"],
    ["produce", *E, "--topic", "T", "--timeout", "-0.5"],
    ["recall", *E, "--topic", "T", "--timeout", "x"],
    ["admin", "stats", *E, "--timeout", "-1"],
    ["produce", *E, "--topic", "T", "--timeout", "0"],  # (a client's wait: Producer(timeout=0) is a ValueError)
    ["dump", "--count", "-2"],
    ["query", *E, "--topic", "T", "--key", "k", "--max", "0"],  # (the node's SYSTEM_ERROR, before)
    ["query", *E, "--topic", "T", "--queue-id", "1", "--queue-offset", "-1"],
    ["query", *E, "--topic", "T", "--queue-id", "-1", "--queue-offset", "0"],
    ["produce", *E, "--topic", "T", "--transaction", "commit", "--group", "bad group"],  # (a traceback, before)
    ["consume", *E, "--topic", "T", "--group", "bad group", "--push"],
    ["consume", *E, "--topic", "T", "--group", ""],
])
def test_a_number_below_its_least_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    said = capsys.readouterr().err
    assert e.value.code == 2 and ("is below" in said or "is not" in said or "group" in said), said


def test_the_least_and_the_defaults_are_taken():
    args = build_parser().parse_args(["consume", *E, "--topic", "T", "--group", "G", "--count", "0", "--timeout", "0",
                                      "--threads", "1"])
    assert (args.count, args.timeout, args.threads) == (0, 0.0, 1)
    assert build_parser().parse_args(["produce", *E, "--topic", "T"]).timeout == 3.0


@pytest.mark.parametrize("flags, said", [
    (["--broadcast"], "--broadcast is for --push"), (["--threads", "4"], "--threads is for --push"),
    (["--no-ack"], "--no-ack is for --pop"), (["--push", "--invisible-ms", "5000"], "--invisible-ms is for --pop"),
    (["--orderly"], "--orderly is for --push or --pop"), (["--push", "--pop"], "exclude each other"),
    (["--push", "--offset-store-dir", "/tmp/x"], "--offset-store-dir is for --push --broadcast"),
])
def test_a_consume_flag_its_mode_would_ignore_is_a_usage_error(flags, said, capsys):
    """(They were ignored in silence: a --broadcast without --push read as an ordinary group.)"""
    from node.tools.cli import cmd_consume

    args = build_parser().parse_args(["consume", *E, "--topic", "T", "--group", "G", *flags])
    assert cmd_consume(args) == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize("flags, said", [
    (["--transaction", "commit", "--group", "P", "--delay-level", "2"], "--transaction sends each message at once"),
    (["--request", "--group", "P", "--delay-ms", "100"], "--request sends each message at once"),
    (["--request", "--group", "P", "--batch", "4"], "it takes no --batch"),
    (["--check-answer", "commit"], "--check-answer is for --transaction unknown"),
    (["--transaction", "unknown", "--request", "--group", "P"], "exclude each other"),
])
def test_a_produce_flag_its_mode_would_ignore_is_a_usage_error(flags, said, capsys):
    """(A transactional message's delay was dropped in silence, as RocketMQ's client drops it.)"""
    from node.tools.cli import cmd_produce

    args = build_parser().parse_args(["produce", *E, "--topic", "T", *flags])
    assert cmd_produce(args) == 2 and said in capsys.readouterr().err
