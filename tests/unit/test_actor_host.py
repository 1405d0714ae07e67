"""What a service process says as it dies (node.server.actor_host): out of descriptors or
mappings, the line names the limit to raise, as the start's does; another death names none."""

from __future__ import annotations

import errno
import logging

import pytest

from node.server import actor_host


class Dies:
    label = "dispatcher"

    def __init__(self, error: BaseException):
        self.error = error

    def run(self) -> None:
        raise self.error


class Exited(Exception):
    pass


def death_line(error: BaseException, monkeypatch, caplog) -> str:
    host = object.__new__(actor_host.ActorHost)  # (no Ray: only the thread's body)
    host.actor = Dies(error)

    def exit_(status: int):
        raise Exited(status)

    monkeypatch.setattr(actor_host.os, "_exit", exit_)
    with caplog.at_level(logging.ERROR, logger="mqnode"), pytest.raises(Exited):
        host._run()
    (record,) = [r for r in caplog.records if r.name == "mqnode"]
    return record.getMessage()


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.ENOMEM])
def test_a_service_out_of_descriptors_or_mappings_names_the_limits(code, monkeypatch, caplog):
    line = death_line(OSError(code, "out"), monkeypatch, caplog)
    assert line.startswith("actor dispatcher died: ") and "may open" in line and "vm.max_map_count" in line


def test_another_death_names_no_limit(monkeypatch, caplog):
    assert death_line(OSError(errno.EIO, "broken disk"), monkeypatch, caplog) == "actor dispatcher died"
    caplog.clear()
    assert death_line(AssertionError("invariant"), monkeypatch, caplog) == "actor dispatcher died"
