# Sourced by the scripts: make sure .venv exists and holds this project, then use it.
# A stamp per extras set holds pyproject.toml's hash (and the C source's), so a changed dependency list reinstalls once.
set -euo pipefail
MQNODE_ROOT="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
VENV="$MQNODE_ROOT/.venv"
EXTRAS="${MQNODE_EXTRAS:-}"
# The C sources are compiled at install: a change to one reinstalls too.
stamp_want="$(cat "$MQNODE_ROOT/pyproject.toml" "$MQNODE_ROOT"/shm/*.c | sha256sum | cut -c1-16)"
stamp_file="$VENV/.mqnode-installed${EXTRAS:+-$EXTRAS}"  # this extras set's dependencies, installed for stamp_want
built_file="$VENV/.mqnode-built"  # what the installs last did for: the C extensions, built in place, are its
if [ ! -x "$VENV/bin/python" ]; then
  echo "mqnode: creating $VENV (first use; this takes a minute)" >&2
  "${PYTHON:-python3}" -m venv "$VENV"
fi
built="$(cat "$built_file" 2>/dev/null || true)"
if [ "$(cat "$stamp_file" 2>/dev/null || true)" != "$stamp_want" ] || [ "$built" != "$stamp_want" ]; then
  echo "mqnode: installing mqnode${EXTRAS:+[$EXTRAS]} and its dependencies into $VENV" >&2
  log="$VENV/install.log"
  if ! { "$VENV/bin/python" -m pip install --disable-pip-version-check --upgrade pip &&
         "$VENV/bin/python" -m pip install --disable-pip-version-check -e "$MQNODE_ROOT${EXTRAS:+[$EXTRAS]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "mqnode: installing failed (log above, also in $log)" >&2
    exit 1
  fi
  # the C extensions are built in place, one build for every extras set: after an install for
  # another commit (a checkout), the other sets' stamps no longer say what is there, so they go;
  # after a first install of this set for the same commit they still do (each script's first run
  # reinstalled the others' before: ~6 s at each change between scripts/mqnode and scripts/pipeline,
  # rewriting the C extensions under a running node's processes)
  [ "$built" = "$stamp_want" ] || rm -f "$VENV"/.mqnode-installed*
  echo "$stamp_want" > "$built_file"
  echo "$stamp_want" > "$stamp_file"
  [ -z "$EXTRAS" ] || echo "$stamp_want" > "$VENV/.mqnode-installed"
fi
# mqnode's own modules as bytecode, made here since a node cannot count on making it itself: pip
# compiles what it installs, but mqnode is installed editable, and where PYTHONDONTWRITEBYTECODE is
# set (CI containers set it) every one of a node's ~12 processes compiled every module it imports,
# at every start and restart (~1.3 CPU-s a node start; docs/operations.md). Up to date: ~0.1 s.
"$VENV/bin/python" -P -m compileall -q "$MQNODE_ROOT"/actors "$MQNODE_ROOT"/node "$MQNODE_ROOT"/shm "$MQNODE_ROOT"/tests >/dev/null || true
export PATH="$VENV/bin:$PATH"
