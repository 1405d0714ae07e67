"""The JSON files under `<store>/config/`, read and written as RocketMQ 4.9 (fastjson) does.

fastjson writes maps with integer keys bare (`{0:12,1:7}`), which is not JSON: `loads` accepts
that; `dumps` writes it, with fastjson's pretty format (tabs; a bean's fields on their own lines,
alphabetical). Persisting follows spec §8: write `<file>.tmp`, copy the current file to
`<file>.bak`, replace; a missing, empty or unparseable file falls back to `.bak`.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import orjson

_BARE_INT_KEY = re.compile(r'([{,]\s*)(-?\d+)\s*:')


def loads(text: str):
    """Parse fastjson output, quoting bare integer keys first (values are never touched: the
    pattern only matches after `{` or `,`, and strings in these files hold no `{`/`,` + digits + `:`)."""
    return orjson.loads(_BARE_INT_KEY.sub(r'\1"\2":', text))


def dumps(value, indent: int = 0, *, bean: bool = True) -> str:
    """fastjson PrettyFormat: dicts with str keys are beans (fields on their own lines), dicts
    with int keys are maps (`{k:v,...}` as fastjson prints them)."""
    pad = "\t" * indent
    if isinstance(value, dict):
        if not value:
            return "{}"
        if all(isinstance(k, int) for k in value):
            return "{" + ",".join(f"{k}:{dumps(v, indent + 1)}" for k, v in value.items()) + "\n" + pad + "}"
        inner = ",\n".join(f'{pad}\t{orjson.dumps(str(k)).decode()}:{dumps(v, indent + 1)}' for k, v in value.items())
        return "{\n" + inner + "\n" + pad + "}"
    return orjson.dumps(value).decode()


def read(path: Path):
    """The file's content, or its `.bak`, or None when neither parses."""
    for candidate in (path, path.with_name(path.name + ".bak")):
        try:
            text = candidate.read_text(encoding="utf-8")
            if text.strip():
                return loads(text)
        except (OSError, orjson.JSONDecodeError, UnicodeDecodeError):
            continue
    return None


def persist(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w", encoding="utf-8") as f:
        f.write(dumps(value))
        f.flush()
        os.fsync(f.fileno())
    if path.exists():
        shutil.copyfile(path, path.with_name(path.name + ".bak"))
    os.replace(temporary, path)
