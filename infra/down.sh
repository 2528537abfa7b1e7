#!/usr/bin/env bash
# make down: stop the local runner, the order service and LocalStack.
set -euo pipefail
# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
for name in runner order-service; do
  pidfile="$SAS_LOCAL_DIR/$name.pid"
  [ -f "$pidfile" ] || continue
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    echo "$name stopped (pid $pid)"
  fi
  rm -f "$pidfile"
done
"$SAS_ROOT/infra/localstack.sh" stop
