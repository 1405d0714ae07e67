"""The node's log (node.server.logs): a service process's lines reach the launcher's stderr
through the run directory's socket, one line each, and its own rotating file with logDir."""

from __future__ import annotations

import io
import logging
import re
import time

from helpers import small_settings

from node.server import logs

LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} (INFO|WARNING|ERROR|DEBUG) (\S+)\[(\d+)\] (.*)")


def test_a_services_lines_reach_the_launchers_stderr_and_its_own_file(tmp_path):
    settings = small_settings(tmp_path / "store", runDir=str(tmp_path / "run"), logDir=str(tmp_path / "logs"),
                              logLevel="INFO")
    (tmp_path / "run").mkdir()
    out = io.StringIO()
    sink = logs.LogSink(settings, out=out)
    logger = logs.configure(settings, "dispatcher", relay=True)
    try:
        logger.debug("not at INFO")
        logger.warning("slave %d left: %s", 1, "a reason")
        logger.info("deleted CommitLog segment 00000000000000000000")
        deadline = time.monotonic() + 5
        while out.getvalue().count("\n") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        sink.stop()
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()
    lines = out.getvalue().splitlines()
    parsed = [LINE.fullmatch(line).groups() for line in lines]
    assert [(level, who, message) for level, who, _, message in parsed] == [
        ("WARNING", "dispatcher", "slave 1 left: a reason"),
        ("INFO", "dispatcher", "deleted CommitLog segment 00000000000000000000")]
    assert (tmp_path / "logs" / "dispatcher.log").read_text().splitlines() == lines


def test_a_relay_with_no_launcher_drops_lines_and_never_blocks(tmp_path):
    settings = small_settings(tmp_path / "store", runDir=str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    logger = logs.configure(settings, "front", relay=True)
    try:
        began = time.monotonic()
        for i in range(logs.LOG_HWM + 100):
            logger.info("line %d", i)
        assert time.monotonic() - began < 10
    finally:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()
    assert logging.getLogger(logs.LOGGER).handlers == []


def test_what_a_library_prints_on_the_launchers_stdout_becomes_one_log_line_each():
    import io
    import logging

    from node.server.logs import ForeignLines

    logger = logging.getLogger("mqnode-test-foreign")
    seen = io.StringIO()
    handler = logging.StreamHandler(seen)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        out = ForeignLines(logger)
        print("\x1b[33m(raylet)\x1b[0m A worker died or was", file=out, end="")
        print(" killed", file=out)
        print("\n\nsecond", file=out)
        assert seen.getvalue() == "(raylet) A worker died or was killed\nsecond\n"
    finally:
        logger.removeHandler(handler)
