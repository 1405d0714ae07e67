"""conf/broker.toml, rendered from the settings' definitions (shm.settings):
`python -m shm.settings > conf/broker.toml`; a test checks the file is what this renders."""

from __future__ import annotations

from dataclasses import fields

from shm.settings import Settings
from shm.settings_rules import NOT_IMPLEMENTED, render_value


def render_conf() -> str:
    """conf/broker.toml: every key, its default and what it does, grouped as the spec groups them."""
    lines = ["# mqnode broker settings: RocketMQ 4.9 MessageStoreConfig/BrokerConfig names and defaults.",
             "# Flat `key = value` lines (TOML; RocketMQ broker.conf `key=value` lines parse too).",
             "# Keys left out of a file given with --conf keep these defaults.",
             "# Generated from shm/settings.py: python -m shm.settings > conf/broker.toml", ""]
    group = None
    for f in fields(Settings):
        if f.metadata["group"] != group:
            group = f.metadata["group"]
            lines += ["", f"# ---- {group}"]
        lines.append(f"# {f.metadata['comment']}")
        if f.name in NOT_IMPLEMENTED:
            lines.append(f"# Not implemented yet ({NOT_IMPLEMENTED[f.name]}): only the default is accepted.")
        lines.append(f"{f.name} = {render_value(f.default)}")
    return "\n".join(lines).replace("\n\n\n", "\n\n") + "\n"
