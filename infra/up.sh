#!/usr/bin/env bash
# make up: LocalStack, the stack (functions off), and the local runner in the background.
# SAS_MODE=lambda make up: the stack with its five functions on instead (LocalStack invokes them;
# no local runner), pointed at the order service started here.
# Writes the stack outputs to .local/outputs.json (SubmissionQueueUrl first among them).
set -euo pipefail
# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
cd "$SAS_ROOT"

OUTPUTS="$SAS_LOCAL_DIR/outputs.json"
PIDFILE="$SAS_LOCAL_DIR/runner.pid"
LOG="$SAS_LOCAL_DIR/runner.log"
SVC_PIDFILE="$SAS_LOCAL_DIR/order-service.pid"
SVC_LOG="$SAS_LOCAL_DIR/order-service.log"
export ORDER_SERVICE_URL="${ORDER_SERVICE_URL:-http://127.0.0.1:${ORDER_SERVICE_PORT:-8081}}"

# stop_pid FILE: stop the process a pid file names, if it runs.
stop_pid() {
  if [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; then
    kill "$(cat "$1")" && sleep 1
  fi
  rm -f "$1"
}

MODE="${SAS_MODE:-local}"
case "$MODE" in
  lambda | local) ;;
  *) echo "SAS_MODE must be lambda or local, not '$MODE'" >&2; exit 2 ;;
esac

infra/localstack.sh ensure
if [ "$MODE" = lambda ]; then
  cargo build -q --workspace --bins
  target/debug/sasctl --outputs "$OUTPUTS" deploy-local --name "${SAS_STACK_NAME:-sas-local}" \
    --functions "${CARGO_TARGET_DIR:-$SAS_ROOT/target}/debug" --param "OrderServiceUrl=$ORDER_SERVICE_URL"
else
  cargo build -q --workspace --bins
  target/debug/sasctl --outputs "$OUTPUTS" deploy-local --name "${SAS_STACK_NAME:-sas-local}"
fi

stop_pid "$SVC_PIDFILE"
nohup target/debug/order-service --listen "${ORDER_SERVICE_URL#http://}" >"$SVC_LOG" 2>&1 &
echo $! >"$SVC_PIDFILE"
stop_pid "$PIDFILE"
if [ "$MODE" = local ]; then
  SAS_OUTPUTS="$OUTPUTS" nohup target/debug/sasctl run >"$LOG" 2>&1 &
  echo $! >"$PIDFILE"
fi
sleep 1
kill -0 "$(cat "$SVC_PIDFILE")" 2>/dev/null || { echo "the order service died at start:"; tail -20 "$SVC_LOG"; exit 1; }
if [ "$MODE" = local ]; then
  kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { echo "the runner died at start:"; tail -20 "$LOG"; exit 1; }
  roles="The runner (pid $(cat "$PIDFILE")) polls every queue; its log is $LOG."
else
  roles="The five functions run in LocalStack (logs: CloudWatch Logs /aws/lambda/<function>, or
infra/localstack.sh logs -f, which echoes their output)."
fi
cat <<TXT

Up ($MODE mode). $roles
The order service (pid $(cat "$SVC_PIDFILE")) listens on $ORDER_SERVICE_URL; its log is $SVC_LOG.
Stack outputs: $OUTPUTS
Submission queue: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["SubmissionQueueUrl"])' "$OUTPUTS")

Try:
  target/debug/sasctl submit --input '{"customer": "c-1", "items": [{"sku": "book", "qty": 1}]}'   # prints the task id
  curl -s $ORDER_SERVICE_URL/ledger                              # the effects the order service applied
  target/debug/sasctl status <task id>
  target/debug/sasctl list --state Processed
  make down
TXT
