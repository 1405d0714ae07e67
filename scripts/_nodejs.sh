# Sourced by scripts/test: Apache RocketMQ's official Node.js client (rocketmq-client-nodejs, pinned
# in tests/nodejs/package-lock.json) for tests/integration/test_grpc.py, test_grpc_acl.py and
# test_grpc_cluster.py, installed from the npm registry with `npm ci` when tests/nodejs has none or the lock file changed. A machine
# without Node.js (16.19 or newer) skips those tests, and the test run says so; a failed install
# is reported by the tests themselves.
_nodejs_dir="$MQNODE_ROOT/tests/nodejs"
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  if ! node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 16 || (a === 16 && b >= 19) ? 0 : 1)'; then
    echo "mqnode: Node.js $(node --version) is older than 16.19: the official Node.js client's tests will fail" >&2
  elif [ ! -d "$_nodejs_dir/node_modules/rocketmq-client-nodejs" ] || \
       [ "$_nodejs_dir/package-lock.json" -nt "$_nodejs_dir/node_modules/.package-lock.json" ]; then
    echo "mqnode: installing the official RocketMQ Node.js client for its tests (npm ci in tests/nodejs)" >&2
    (cd "$_nodejs_dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) || \
      echo "mqnode: npm ci in tests/nodejs failed: the Node.js client's tests will say so" >&2
  fi
else
  echo "mqnode: no Node.js here: the official Node.js client's tests skip (install nodejs and npm to run them)" >&2
fi
