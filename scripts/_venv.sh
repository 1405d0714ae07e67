# Sourced by the scripts: make sure .venv exists and holds this project, then use it.
# A stamp per extras set holds pyproject.toml's hash (and the C source's), so a changed dependency list reinstalls once.
set -euo pipefail
MQNODE_ROOT="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
VENV="$MQNODE_ROOT/.venv"
EXTRAS="${MQNODE_EXTRAS:-}"
# The C sources are compiled at install: a change to one reinstalls too.
stamp_want="$(cat "$MQNODE_ROOT/pyproject.toml" "$MQNODE_ROOT"/shm/*.c | sha256sum | cut -c1-16)"
stamp_file="$VENV/.mqnode-installed${EXTRAS:+-$EXTRAS}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "mqnode: creating $VENV (first use; this takes a minute)" >&2
  "${PYTHON:-python3}" -m venv "$VENV"
fi
if [ ! -f "$stamp_file" ] || [ "$(cat "$stamp_file")" != "$stamp_want" ]; then
  echo "mqnode: installing mqnode${EXTRAS:+[$EXTRAS]} and its dependencies into $VENV" >&2
  log="$VENV/install.log"
  if ! { "$VENV/bin/python" -m pip install --disable-pip-version-check --upgrade pip &&
         "$VENV/bin/python" -m pip install --disable-pip-version-check -e "$MQNODE_ROOT${EXTRAS:+[$EXTRAS]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "mqnode: installing failed (log above, also in $log)" >&2
    exit 1
  fi
  # the C extensions are built in place, one build for every extras set: the other sets' stamps
  # no longer say what is built (a checkout of another commit rebuilt them), so they go
  rm -f "$VENV"/.mqnode-installed*
  echo "$stamp_want" > "$stamp_file"
  [ -z "$EXTRAS" ] || echo "$stamp_want" > "$VENV/.mqnode-installed"
fi
# mqnode's own modules as bytecode, made here since a node cannot count on making it itself: pip
# compiles what it installs, but mqnode is installed editable, and where PYTHONDONTWRITEBYTECODE is
# set (CI containers set it) every one of a node's ~12 processes compiled every module it imports,
# at every start and restart (~1.3 CPU-s a node start; docs/operations.md). Up to date: ~0.1 s.
"$VENV/bin/python" -P -m compileall -q "$MQNODE_ROOT"/actors "$MQNODE_ROOT"/node "$MQNODE_ROOT"/shm "$MQNODE_ROOT"/tests >/dev/null || true
export PATH="$VENV/bin:$PATH"
