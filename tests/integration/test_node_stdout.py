"""`mqnode start`'s stdout carries only the node's own lines: Ray's driver prints its raylet's
"A worker died" there (in colour) when a service process is killed; it reaches the log on stderr
as one line instead (node.server.logs.ForeignLines)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest
from nodes import ROOT, free_port

pytestmark = pytest.mark.slow


def test_a_killed_service_leaves_stdout_to_the_nodes_own_lines(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    port, ha = free_port(), free_port()
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        node = subprocess.Popen([str(ROOT / "scripts" / "mqnode"), "start", "--storePathRootDir", str(tmp_path / "store"),
                                 "--runDir", str(run), "--listen", f"tcp://127.0.0.1:{port}", "--listenPort", str(port),
                                 "--haListenPort", str(ha)], stdout=stdout, stderr=stderr)
        try:
            deadline = time.monotonic() + 120
            while b"mqnode ready" not in out.read_bytes():
                assert node.poll() is None and time.monotonic() < deadline, err.read_text()[-2000:]
                time.sleep(0.2)
            os.kill(int((run / "dispatcher.pid").read_text()), signal.SIGKILL)
            deadline = time.monotonic() + 60
            while b"service dispatcher restarted" not in err.read_bytes():
                assert time.monotonic() < deadline, err.read_text()[-2000:]
                time.sleep(0.2)
            time.sleep(2.0)  # (the raylet's message comes on its own thread)
        finally:
            node.send_signal(signal.SIGTERM)
            node.wait(60)
    lines = out.read_text().splitlines()
    assert lines and all(line.startswith("mqnode ") for line in lines), lines
    assert "\x1b[" not in err.read_text()
    # no error line of Ray's own on a sound node's stderr (its core worker's "restart will fail" for
    # each constructor argument in the object store came at every start)
    assert not re.findall(r"^\[[0-9-]+ [0-9:,]+ E \d+ \d+\].*", err.read_text(), re.MULTILINE)
