#!/usr/bin/env bash
# make up: LocalStack, the stack (functions off), and the local runner in the background.
# Writes the stack outputs to .local/outputs.json (SubmissionQueueUrl first among them).
set -euo pipefail
# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
cd "$SAS_ROOT"

OUTPUTS="$SAS_LOCAL_DIR/outputs.json"
PIDFILE="$SAS_LOCAL_DIR/runner.pid"
LOG="$SAS_LOCAL_DIR/runner.log"

infra/localstack.sh ensure
cargo build -q -p sas-cli --bin sasctl
target/debug/sasctl --outputs "$OUTPUTS" deploy-local --name "${SAS_STACK_NAME:-sas-local}"

if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
  echo "local runner already running (pid $(cat "$PIDFILE")); restarting it on the new outputs"
  kill "$(cat "$PIDFILE")" && sleep 1
fi
SAS_OUTPUTS="$OUTPUTS" nohup target/debug/sasctl run >"$LOG" 2>&1 &
echo $! >"$PIDFILE"
sleep 1
kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { echo "the runner died at start:"; tail -20 "$LOG"; exit 1; }
cat <<TXT

Up. The runner (pid $(cat "$PIDFILE")) polls every queue; its log is $LOG.
Stack outputs: $OUTPUTS
Submission queue: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["SubmissionQueueUrl"])' "$OUTPUTS")

Try:
  target/debug/sasctl submit --input '{"sku": "book"}'          # prints the task id
  target/debug/sasctl status <task id>
  target/debug/sasctl list --state Processed
  make down
TXT
