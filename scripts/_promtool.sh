# Sourced by scripts/test: Prometheus's `promtool` for the metrics test's `promtool check metrics`
# (tests/integration/test_metrics.py). Where it is missing on a Debian machine and the script
# runs as root, Debian's `prometheus` package (which carries promtool) is installed, with its
# server kept from starting; elsewhere the test says it skipped that check.
if ! command -v promtool >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "mqnode: installing promtool for the metrics test (Debian's prometheus package)" >&2
  _policy=/usr/sbin/policy-rc.d
  _made_policy=0
  if [ ! -e "$_policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$_policy" && chmod +x "$_policy" && _made_policy=1  # no service starts
  fi
  source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/_apt.sh"
  if ! _apt_install --no-install-recommends prometheus; then
    echo "mqnode: could not install prometheus; the metrics test skips promtool" >&2
  fi
  if [ "$_made_policy" = 1 ]; then rm -f "$_policy"; fi
fi
