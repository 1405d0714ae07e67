"""The node's log: every service's events on the node's stderr, one line each.

A service runs in a Ray worker, whose stderr is a file under Ray's session directory where
nobody looks. So each service process logs to the `mqnode` logger with one handler, `Relay`,
which pushes each formatted line over the node's private ipc socket `logs` (run directory,
mode 0700) to the launcher; the launcher's `LogSink` thread writes them to its own stderr,
where a terminal, a container runtime or journald (its stderr a socket: lines are written
whole) takes them. With `logDir` set, every process also appends its lines to
`<logDir>/<label>.log`, rotated at LOG_FILE_BYTES (LOG_FILES kept): one file a process, so no
two processes rotate one file.

A line: `2026-11-27T10:01:02.345 WARNING dispatcher[12345] message`. `logLevel` sets the level
(INFO by default; DEBUG, WARNING, ERROR). stdout carries only the launcher's own lines (`ready`,
`stopping`, `stopped`): what else is printed there in `mqnode start`'s process (Ray's driver
prints its raylet's messages) is logged as a WARNING line instead (`ForeignLines`). A relay
whose launcher is not there (yet, or gone) drops lines rather than block a service: a log is
never a reason to stop serving (LOG_HWM lines queue).
"""

from __future__ import annotations

import io
import logging
import logging.handlers
import os
import re
import sys
import threading
from pathlib import Path

import zmq

LOGGER = "mqnode"
LOG_HWM = 10_000
LOG_FILE_BYTES = 64 * 1024 * 1024
LOG_FILES = 5
FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(service)s[%(process)d] %(message)s"
DATE_FORMAT = "%Y-%m-%dT%H:%M:%S"
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
MAX_PARTIAL = 65536  # a line printed without an end is logged once this long


def endpoint(settings) -> str:
    return f"ipc://{Path(settings.run_dir) / 'logs'}"


class _Service(logging.Filter):
    """Stamps each record with the process's label."""

    def __init__(self, label: str):
        super().__init__()
        self.label = label

    def filter(self, record: logging.LogRecord) -> bool:
        record.service = self.label
        return True


class Relay(logging.Handler):
    """A service process's lines, to the launcher's sink (dropped while it cannot take them)."""

    def __init__(self, settings):
        super().__init__()
        self.context = zmq.Context.instance()
        self.sock = self.context.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 500)  # (a line logged just before the process exits still leaves)
        self.sock.setsockopt(zmq.SNDHWM, LOG_HWM)
        self.sock.connect(endpoint(settings))
        self.lock_send = threading.Lock()  # (loggers are called from several threads of a process)
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
            with self.lock_send:
                self.sock.send_string(line, zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1
        except Exception:  # never let a log line take a service down
            self.handleError(record)

    def close(self) -> None:
        self.sock.close()
        super().close()


def configure(settings, label: str, *, relay: bool) -> logging.Logger:
    """The `mqnode` logger of this process: to the launcher's sink (`relay`, a service process)
    or this process's stderr (the launcher), and to `<logDir>/<label>.log` when set."""
    logger = logging.getLogger(LOGGER)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    formatter = logging.Formatter(FORMAT, DATE_FORMAT)
    handlers: list[logging.Handler] = [Relay(settings) if relay else logging.StreamHandler(sys.stderr)]
    if settings.logDir:
        directory = Path(settings.logDir).expanduser()
        directory.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.handlers.RotatingFileHandler(directory / f"{label}.log", maxBytes=LOG_FILE_BYTES,
                                                             backupCount=LOG_FILES))
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.addFilter(_Service(label))
        logger.addHandler(handler)
    logger.setLevel(settings.logLevel)
    logger.propagate = False  # (not again into Ray's worker files)
    return logger


class LogSink:
    """The launcher's end: the services' lines, written to its stderr as they come."""

    def __init__(self, settings, out=sys.stderr):
        self.context = zmq.Context.instance()
        self.sock = self.context.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, LOG_HWM)
        self.sock.bind(endpoint(settings))
        self.out = out
        self.stopping = threading.Event()
        self.lines = 0
        self.thread = threading.Thread(target=self._run, name="mqnode-logs", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            if not self.sock.poll(200):
                continue
            lines = []
            for _ in range(1000):  # (bounded: the stop flag is looked at between batches)
                try:
                    line = self.sock.recv_string(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self.lines += 1
                lines.append(line)
            try:
                self.out.write("".join(f"{line}\n" for line in lines))
                self.out.flush()
            except OSError:  # (a terminal that hung up: the node stops on its SIGHUP, and says nothing more)
                to_devnull(self.out)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(2)
        self.sock.close()


def own_stdout(label: str) -> tuple[logging.Logger, OwnLines]:
    """For a launcher without a node's settings (`mqnode namesrv`, `mqnode cluster up`): its
    logger on stderr, and its own lines' `out` (OwnLines)."""
    from shm import settings as settings_module

    logger = configure(settings_module.Settings(), label, relay=False)
    return logger, OwnLines(logger)


class OwnLines:
    """A launcher's own lines (`mqnode ready ...`, `mqnode stopping`), printed as `print` prints
    them to the stdout it had, while sys.stdout becomes ForeignLines. Once a stream is gone (its
    reader ended: `mqnode start | head -1`; a terminal hung up) it is made /dev/null, the log
    says so once, and the lines go on unsaid: a write that raised skipped the node's stop (its
    store then recovered as after a crash), and Python's flush at exit would fail again."""

    def __init__(self, logger: logging.Logger):
        self.logger, self.stdout = logger, sys.stdout
        sys.stdout = ForeignLines(logger)

    def __call__(self, *parts, file=None, **kwargs) -> None:
        stream = self.stdout if file is None else file
        try:
            print(*parts, file=stream, **kwargs)
        except OSError as e:  # (BrokenPipeError; EIO from a terminal that hung up)
            to_devnull(stream)
            self.logger.warning("%s is gone (%s): this process's own lines go unsaid from now on",
                                getattr(stream, "name", "a stream"), e.strerror or e)


class ForeignLines(io.TextIOBase):
    """`sys.stdout` of a launcher that owns its process (`mqnode start`): what a library prints
    there becomes WARNING lines of the node's log on stderr, colour codes stripped, so stdout
    carries only the node's own lines. Ray's driver prints its raylet's messages there ("(raylet)
    A worker died or was killed ...", in colour) whatever `log_to_driver` says."""

    def __init__(self, logger: logging.Logger):
        self.logger, self.partial = logger, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.partial += text
        *lines, self.partial = self.partial.split("\n")
        if len(self.partial) > MAX_PARTIAL:
            lines.append(self.partial)
            self.partial = ""
        for line in lines:
            clean = _COLOUR.sub("", line).strip()
            if clean:
                self.logger.warning("%s", clean)
        return len(text)


def to_devnull(stream) -> None:
    """Point `stream`'s descriptor at /dev/null (what it still buffers goes there too)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)
