"""scripts/_venv.sh, the set-up every script sources, on a tree of its own whose .venv's python
only notes what it is asked (no pip runs): when it installs, and when it leaves the venv alone."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "_venv.sh", tmp_path / "scripts")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "shm").mkdir()
    (tmp_path / "shm" / "_a.c").write_text("int a;\n")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/asked\n')
    python.chmod(0o755)
    return tmp_path


def _installs(root: Path, extras: str) -> list[str]:
    """What one script's start (`extras` its MQNODE_EXTRAS) had pip install."""
    asked = root / "asked"
    asked.unlink(missing_ok=True)
    subprocess.run(["bash", "-c", f"MQNODE_EXTRAS={extras} source {root}/scripts/_venv.sh"], check=True,
                   capture_output=True, timeout=30)
    return [line.rsplit("/", 1)[-1] for line in asked.read_text().splitlines() if " -e " in line]


def test_each_extras_set_installs_once_and_a_changed_source_installs_each_again(tmp_path):
    root = _tree(tmp_path)
    assert _installs(root, "tools") == [f"{root.name}[tools]"]
    assert _installs(root, "pipeline") == [f"{root.name}[pipeline]"]
    assert _installs(root, "tools") == [] and _installs(root, "pipeline") == []  # (each ~6 s before, and again)
    (root / "shm" / "_a.c").write_text("int a, b;\n")  # (a checkout of another commit)
    assert _installs(root, "pipeline") == [f"{root.name}[pipeline]"]
    assert _installs(root, "tools") == [f"{root.name}[tools]"]
    assert _installs(root, "pipeline") == []
