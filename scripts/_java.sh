# Sourced by the scripts that start Spark: make sure a Java runtime (17 or newer, as Spark 4
# needs) is at hand and JAVA_HOME names it. Where none is found on a Debian machine and the
# script runs as root, a headless JRE is installed from Debian's packages; otherwise it says
# exactly what to install.
_java_ok() { "$1" -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); exit !(v[1] >= 17)}'; }
_java_found=""
for candidate in "${JAVA_HOME:+$JAVA_HOME/bin/java}" "$(command -v java || true)" /usr/lib/jvm/*/bin/java; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && _java_ok "$candidate"; then _java_found="$candidate"; break; fi
done
if [ -z "$_java_found" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "mqnode: installing a Java runtime for Spark (openjdk-17-jre-headless)" >&2
    source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/_apt.sh"
    _apt_install openjdk-17-jre-headless
    _java_found="$(ls /usr/lib/jvm/*/bin/java 2>/dev/null | head -1)"
  fi
  if [ -z "$_java_found" ]; then
    echo "mqnode: Spark needs Java 17 or newer: install it (Debian/Ubuntu: apt-get install openjdk-17-jre-headless;" \
         "elsewhere a JRE 17+ from adoptium.net) or set JAVA_HOME" >&2
    exit 1
  fi
fi
export JAVA_HOME="$(dirname "$(dirname "$(readlink -f "$_java_found")")")"
