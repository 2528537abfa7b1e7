#!/usr/bin/env bash
# make test-lambda: the Lambda-mode tests (tests/tests/it/lambda.rs): each deploys a stack with the
# five functions on and drives them through LocalStack's event sources, scheduled rule and Invoke.
# Builds the bootstraps first (debug), and the previous release's (infra/previous-release.sh: the
# upgrade test's), starts LocalStack when none answers (and then stops it).
# The runner's output goes to .local/test-lambda-output.log (CI counts its summary).
set -euo pipefail
# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
cd "$SAS_ROOT"

if ! infra/localstack.sh healthy; then
  trap 'infra/localstack.sh stop' EXIT
fi
infra/localstack.sh ensure
# The previous release's functions, for the upgrade test (built once; before this build's, which
# puts this build's binaries back in target/debug)
SAS_PREVIOUS_FUNCTIONS="$(infra/previous-release.sh)"
export SAS_PREVIOUS_FUNCTIONS
echo "[test-lambda] cargo build --workspace --bins (the bootstraps the tests deploy; sasctl and the order service for the walkthrough)"
# --workspace, as every build of the project's scripts: one feature set, built once
cargo build -q --workspace --bins
mkdir -p "$SAS_LOCAL_DIR"
status=0
if cargo nextest --version >/dev/null 2>&1; then
  echo "[test-lambda] cargo nextest run --workspace --test it -E 'test(/^lambda::/)' $*"
  cargo nextest run --workspace --test it --no-fail-fast -E 'test(/^lambda::/)' "$@" 2>&1 \
    | tee "$SAS_LOCAL_DIR/test-lambda-output.log" || status=$?
else
  echo "[test-lambda] cargo test --workspace --test it lambda:: $*"
  cargo test --workspace --test it "$@" -- lambda:: 2>&1 | tee "$SAS_LOCAL_DIR/test-lambda-output.log" || status=$?
fi
exit "$status"
