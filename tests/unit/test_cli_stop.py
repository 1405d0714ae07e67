"""`mqnode stop` signals only a node's launcher: which command lines it takes for one."""

from __future__ import annotations

import pytest

from node.tools.cli_stop import _not_a_node


@pytest.mark.parametrize("argv", [
    ["/x/.venv/bin/python", "-m", "node.tools.cli", "start", "--store", "/s"],  # scripts/mqnode
    ["/x/.venv/bin/python", "/x/.venv/bin/mqnode", "start", "--store", "/s"],  # the installed command
])
def test_a_mqnode_start_is_a_node(argv):
    assert _not_a_node(argv) == ""


@pytest.mark.parametrize("argv, said", [
    (["ray::NodeHost.serve"], "cluster down"),  # a node of `mqnode cluster`: its actor would be restarted
    (["/x/.venv/bin/python", "-m", "node.tools.cli", "verify", "--store", "/s"], "not a `mqnode start`"),
    (["/x/.venv/bin/python", "/x/.venv/bin/mqnode", "dump", "--topic", "start"], "not a `mqnode start`"),
    (["python3", "-c", "from shm.store_files import StoreLock"], "not a `mqnode start`"),
    ([], "not a `mqnode start`"),
])
def test_anything_else_is_left_alone(argv, said):
    assert said in _not_a_node(argv)


def test_a_command_started_with_its_standard_streams_closed_gives_them_dev_null(tmp_path):
    """`mqnode ... <&- >&- 2>&-`: each becomes /dev/null (node.tools.cli.standard_streams_open), so
    the process has a sys.stderr (Ray's start wants one) and no file it opens takes descriptor 0, 1
    or 2 (what is printed would land in it)."""
    import os
    import subprocess
    import sys

    from nodes import ROOT

    code = ("import faulthandler, os, sys; from node.tools.cli import standard_streams_open; "
            "standard_streams_open(); faulthandler.enable(); print('into /dev/null'); sys.stdout.flush(); "
            "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT); "
            "os.write(fd, repr([fd, os.readlink('/proc/self/fd/0'), os.readlink('/proc/self/fd/2')]).encode())")
    report = tmp_path / "report"

    def closed():
        for fd in (0, 1, 2):
            os.close(fd)

    done = subprocess.run([sys.executable, "-c", code, str(report)], cwd=ROOT, preexec_fn=closed, timeout=60)
    assert done.returncode == 0
    fd, stdin, stderr = eval(report.read_text())
    assert fd > 2 and stdin == stderr == os.devnull
