# Sourced by the scripts: make sure .venv exists and holds this project, then use it.
# A stamp of pyproject.toml's hash means a changed dependency list reinstalls once.
set -euo pipefail
MQNODE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$MQNODE_ROOT/.venv"
EXTRAS="${MQNODE_EXTRAS:-}"
stamp_want="$(sha256sum "$MQNODE_ROOT/pyproject.toml" | cut -c1-16)${EXTRAS:+-$EXTRAS}"
stamp_file="$VENV/.mqnode-installed"
if [ ! -x "$VENV/bin/python" ]; then
  echo "mqnode: creating $VENV (first use; this takes a minute)" >&2
  "${PYTHON:-python3}" -m venv "$VENV"
fi
if [ ! -f "$stamp_file" ] || ! grep -qx -- "$stamp_want" "$stamp_file"; then
  echo "mqnode: installing mqnode${EXTRAS:+[$EXTRAS]} into $VENV" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$MQNODE_ROOT${EXTRAS:+[$EXTRAS]}" >&2
  echo "$stamp_want" > "$stamp_file"
fi
export PATH="$VENV/bin:$PATH"
