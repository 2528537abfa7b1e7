#!/usr/bin/env bash
# Run the workspace tests against LocalStack.
# Starts LocalStack when none answers on $LOCALSTACK_PORT and stops it afterwards only in that case
# (a LocalStack that was already running, ours or a Docker one, is left as it was).
# Extra arguments go to the test runner: cargo nextest when installed, else cargo test.
set -euo pipefail

# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
cd "$SAS_ROOT"

started_here=0
if ! "$SAS_ROOT/infra/localstack.sh" healthy; then
  started_here=1
  trap '"$SAS_ROOT/infra/localstack.sh" stop' EXIT
fi
"$SAS_ROOT/infra/localstack.sh" ensure
if [ "$started_here" = 0 ]; then
  echo "[test] using the LocalStack already running on port $LOCALSTACK_PORT (left running)"
fi

status=0
if cargo nextest --version >/dev/null 2>&1; then
  echo "[test] cargo nextest run --workspace --no-fail-fast $*"
  cargo nextest run --workspace --no-fail-fast "$@" || status=$?
  echo "[test] cargo test --workspace --doc"
  cargo test --workspace --doc || { rc=$?; [ "$status" -ne 0 ] || status=$rc; }
else
  echo "[test] cargo test --workspace $*"
  cargo test --workspace "$@" || status=$?
fi
exit "$status"
