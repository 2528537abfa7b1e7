#!/usr/bin/env bash
# Run the workspace tests against LocalStack.
# Starts LocalStack when none answers on $LOCALSTACK_PORT and stops it afterwards only in that case
# (a LocalStack that was already running, ours or a Docker one, is left as it was).
# Extra arguments go to the test runner: cargo nextest when installed, else cargo test.
# The Lambda-mode tests (lambda::*, functions deployed on LocalStack) are left to
# infra/test-lambda.sh (make test-lambda), a step of its own in CI.
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
# The runner's summary is kept in .local/ so that CI can print one closing line for the run.
mkdir -p "$SAS_LOCAL_DIR"
if cargo nextest --version >/dev/null 2>&1; then
  # No doc tests: the crates have none (nextest does not run them; `cargo test --workspace --doc`
  # cost CI a build of every crate in doc-test form, about 3 minutes, to run 0 tests).
  echo "[test] cargo nextest run --workspace --no-fail-fast $*"
  rc=0
  cargo nextest run --workspace --no-fail-fast -E 'not test(/^lambda::/)' "$@" 2>&1 \
    | tee "$SAS_LOCAL_DIR/test-output.log" || rc=$?
  [ "$status" -ne 0 ] || status=$rc
else
  skip=(-- --skip lambda::)
  for a in "$@"; do [ "$a" != -- ] || skip=(--skip lambda::); done
  echo "[test] cargo test --workspace $* ${skip[*]}"
  cargo test --workspace "$@" "${skip[@]}" 2>&1 | tee "$SAS_LOCAL_DIR/test-output.log" || status=$?
fi
exit "$status"
