#!/usr/bin/env bash
# make demo, the main job: LocalStack (installed and started if needed), the stack deployed onto
# it, sample orders processed and checked. Two modes (SAS_MODE):
#   lambda (default, `make demo`)      the five functions deployed onto LocalStack (debug builds of
#                                      their bootstraps, zipped to S3) and invoked by its SQS event
#                                      source mappings and scheduled rule; stack sas-demo-lambda
#   local  (`make demo-local`)         every role in the sas-dev process (the local runner), against
#                                      stack sas-demo deployed with the functions off; fastest to iterate
# The demo is `sas-dev demo` (crates/dev: the developer's binary, which links the order service;
# sasctl does not). The order service runs inside sas-dev in both; the Agent function reaches it
# through ORDER_SERVICE_URL (template parameter OrderServiceUrl). QUEUE_BUDGET_MS and
# RESULT_GRACE_MS (10 s and 2 s here, 5 min and 10 s by default) make a lost attempt show within
# seconds; sas-dev passes them to the functions as template parameters. Stops LocalStack afterwards if this script started it.
set -euo pipefail
# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
cd "$SAS_ROOT"

MODE="${SAS_MODE:-lambda}"
case "$MODE" in
  lambda | local) ;;
  *) echo "SAS_MODE must be lambda or local, not '$MODE'" >&2; exit 2 ;;
esac
export QUEUE_BUDGET_MS="${QUEUE_BUDGET_MS:-10000}" RESULT_GRACE_MS="${RESULT_GRACE_MS:-2000}"

# The build (the longest step on a fresh clone) runs while LocalStack is installed and started.
if [ "$MODE" = lambda ]; then
  build=(cargo build -q --workspace --bins)
  what="the workspace's binaries: sasctl, sas-dev, the five function bootstraps, the order service (debug)"
else
  build=(cargo build -q --workspace --bins)
  what="the workspace's binaries (sasctl and sas-dev among them; debug)"
fi
mkdir -p "$SAS_LOCAL_DIR"
BUILD_LOG="$SAS_LOCAL_DIR/demo-build.log"
started=$SECONDS
echo "[demo] $MODE mode: building $what in the background (log: $BUILD_LOG)"
"${build[@]}" >"$BUILD_LOG" 2>&1 &
build_pid=$!
cleanup() {
  local rc=$?
  kill "$build_pid" 2>/dev/null || true
  # A demo that ended well leaves LocalStack running, so `make ui` shows its orders; one that
  # failed stops the LocalStack it started.
  if [ "$rc" -ne 0 ] && [ "${stop_localstack:-0}" = 1 ]; then echo; infra/localstack.sh stop; fi
}
trap cleanup EXIT
# Stop LocalStack afterwards (on failure) only if this script is the one that starts it.
infra/localstack.sh healthy || stop_localstack=1
infra/localstack.sh ensure
if ! wait "$build_pid"; then
  cat "$BUILD_LOG"
  echo "[demo] the build failed" >&2
  exit 1
fi
echo "[demo] built and LocalStack ready after $((SECONDS - started)) s; sas-dev log: $SAS_LOCAL_DIR/demo.log"
echo
if [ "$MODE" = lambda ]; then
  RUST_LOG="${RUST_LOG:-info}" target/debug/sas-dev --outputs "$SAS_LOCAL_DIR/demo-lambda-outputs.json" \
    demo --functions "${CARGO_TARGET_DIR:-$SAS_ROOT/target}/debug" --name "${SAS_STACK_NAME:-sas-demo-lambda}" \
    2>"$SAS_LOCAL_DIR/demo.log"
else
  OUTPUTS="$SAS_LOCAL_DIR/demo-outputs.json"
  target/debug/sasctl --outputs "$OUTPUTS" deploy-local --name "${SAS_STACK_NAME:-sas-demo}"
  RUST_LOG="${RUST_LOG:-info}" target/debug/sas-dev --outputs "$OUTPUTS" demo 2>"$SAS_LOCAL_DIR/demo.log"
fi
echo "[demo] $MODE mode: $((SECONDS - started)) s in all"
echo
echo "[demo] look at these orders in the browser: make ui   (serves http://127.0.0.1:8080/ until Ctrl-C)"
echo "[demo] LocalStack keeps running for it; make down stops it"
