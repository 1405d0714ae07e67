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
