"""`--profile`: py-spy on every actor of the node and every load-test worker, for the whole run.

Each process gets one `py-spy record --gil --format raw` (collapsed stacks: `frame;... count`,
sampled only while a thread holds the GIL, so waits in epoll or ZeroMQ do not count as work).
At the end each profile is reduced to its busiest leaf functions ("self" time), which
results.json and report.html show as "where the time goes", beside the process's CPU seconds
measured by the OS over the same stretch (py-spy's sample counts are not CPU time: GIL-free C
work is missing from them). The raw files stay in `<output>/profiles/` for speedscope or
flamegraph.pl.
py-spy attaches with ptrace: inside a container that may need CAP_SYS_PTRACE; a profiler that
cannot attach is reported, and the run goes on.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psutil

RATE = 100          # samples per second per process
TOP = 8             # leaf functions listed per process
STOP_TIMEOUT = 20.0

_LINE = re.compile(r":\d+\)$")


def py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Profiler:
    def __init__(self, directory: Path):
        self.directory = directory
        self.running: dict[str, subprocess.Popen] = {}
        self.errors: dict[str, str] = {}
        self.watched: dict[str, tuple[psutil.Process, float]] = {}  # CPU seconds at attach
        self.cpu: dict[str, float] = {}  # CPU seconds while profiled

    def attach(self, label: str, pid: int) -> None:
        binary = py_spy()
        if binary is None:
            self.errors[label] = "py-spy is not installed"
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            process = psutil.Process(pid)
            self.watched[label] = (process, _cpu(process))
        except psutil.Error:
            pass
        self.running[label] = subprocess.Popen(
            [binary, "record", "--pid", str(pid), "--rate", str(RATE), "--format", "raw", "--nonblocking", "--gil",
             "--output", str(self.directory / f"{label}.txt")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def measure(self, cpu_of_exited: dict[str, float] | None = None) -> None:
        """CPU seconds of every profiled process since it was attached; processes that already
        exited (the workers) report their own, passed in `cpu_of_exited` as totals."""
        for label, (process, began) in self.watched.items():
            try:
                self.cpu[label] = round(_cpu(process) - began, 2)
            except psutil.Error:
                if cpu_of_exited and label in cpu_of_exited:
                    self.cpu[label] = round(cpu_of_exited[label], 2)

    def stop(self) -> None:
        """py-spy writes its file when interrupted (or when its process exits)."""
        for process in self.running.values():
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        for label, process in self.running.items():
            try:
                _, err = process.communicate(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                _, err = process.communicate()
            if not (self.directory / f"{label}.txt").exists():
                lines = (err or b"").decode(errors="replace").strip().splitlines()
                self.errors[label] = lines[0] if lines else "no output"

    def summary(self) -> dict:
        out = {}
        for path in sorted(self.directory.glob("*.txt")):
            out[path.stem] = summarise(path.read_text(errors="replace"))
            out[path.stem]["cpuSeconds"] = self.cpu.get(path.stem)
        for label, error in self.errors.items():
            out.setdefault(label, {"samples": 0, "top": [], "error": error})
        return out


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def summarise(collapsed: str) -> dict:
    """Samples and the busiest leaf functions (line numbers merged) of a collapsed-stack file."""
    leaves: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        leaf = _LINE.sub(")", stack.rsplit(";", 1)[-1])
        leaves[leaf] += int(count)
        total += int(count)
    top = [{"function": f, "share": round(n / total, 4)} for f, n in leaves.most_common(TOP)] if total else []
    return {"samples": total, "seconds": round(total / RATE, 2), "top": top}
