# Sourced by the scripts that install a Debian package (root, apt-get): `_apt_install ARGS...` is
# `apt-get update` then `apt-get install -y -qq ARGS...`, under one lock: scripts/test installs
# promtool while it installs Java, and apt's own lock would fail the second at once.
_apt_install() {
  (
    flock 9
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  ) 9>/var/lib/apt/mqnode-install.lock
}
