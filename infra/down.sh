#!/usr/bin/env bash
# make down: stop the local runner and LocalStack.
set -euo pipefail
# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
PIDFILE="$SAS_LOCAL_DIR/runner.pid"
if [ -f "$PIDFILE" ]; then
  pid=$(cat "$PIDFILE")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    echo "local runner stopped (pid $pid)"
  fi
  rm -f "$PIDFILE"
fi
"$SAS_ROOT/infra/localstack.sh" stop
