#!/usr/bin/env bash
# Lambda smoke test: every binary boots under the Lambda Runtime API emulator (`cargo lambda
# watch`) and handles its fixture event from events/ (real SQS and EventBridge shapes).
#
#   bash infra/lambda-smoke.sh
#
# What it does, in order:
#   1. builds the four function binaries and sasctl (debug, shared target/), so that the
#      emulator's `cargo run` finds them fresh and invocations do not time out on a compile;
#   2. deploys a throwaway stack onto LocalStack (`sasctl deploy-local --name smoke-...`) and
#      exports the functions' environment from its outputs;
#   3. starts `cargo lambda watch` in the background on a free local port (its output goes to
#      .local/lambda-watch.log, never into the crates: watch would rebuild in a loop);
#   4. invokes each binary with each fixture (`cargo lambda invoke <bin> --data-file events/..`)
#      and checks the response ({"batchItemFailures":[]} for SQS events, a sweep report with
#      "expired" and no errors for the scheduled event) and a few side effects in LocalStack;
#   5. stops watch, deletes the stack, prints a summary; exits non-zero on any failure.
#
# A failing invocation prints the function's own output (and the panic location, if any) from the
# watch log. The fixtures and what each expects: events/README.md.
#
# Needs: LocalStack on AWS_ENDPOINT_URL (started with infra/localstack.sh ensure when the default
# local one is down), the tools venv (infra/tools.sh install; cargo-lambda + boto3), cargo.
# No stdin, no Docker, no network beyond LocalStack.
#
# Knobs: SMOKE_PORT (default: a free port), SMOKE_KEEP=1 (keep the stack and the outputs file),
# SMOKE_INVOKE_TIMEOUT (seconds per invocation, default 120), SMOKE_LOG (watch log path).
set -euo pipefail

# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
cd "$SAS_ROOT"

readonly EVENTS_DIR="$SAS_ROOT/events"
readonly WATCH_LOG="${SMOKE_LOG:-$SAS_LOCAL_DIR/lambda-watch.log}"
readonly INVOKE_TIMEOUT="${SMOKE_INVOKE_TIMEOUT:-120}"
readonly CARGO_LAMBDA="$TOOLS_VENV/bin/cargo-lambda"
readonly PY="$TOOLS_VENV/bin/python"
STACK="smoke-$(date +%s)-$RANDOM"
readonly STACK

START=$SECONDS
WORK="$(mktemp -d "${TMPDIR:-/tmp}/sas-smoke.XXXXXX")"
OUTPUTS="$WORK/outputs.json"
WATCH_PID=""
PORT=""
STACK_CREATED=0
FAILURES=0
SUMMARY=()

log() { printf '[smoke %3ds] %s\n' "$((SECONDS - START))" "$*" >&2; }
die() { log "error: $*"; exit 1; }
fail() {
  FAILURES=$((FAILURES + 1))
  log "FAIL: $*"
}

# ---------------------------------------------------------------------------------------------
# cleanup: stop watch (and the function processes it spawned), delete the stack
# ---------------------------------------------------------------------------------------------

# The function processes watch spawned for this run: they carry our Runtime API address.
our_function_pids() {
  [ -n "$PORT" ] || return 0
  local p
  for p in $(pgrep -x 'sas-(submitter|scheduler|agent|supervisor)' 2>/dev/null || true); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "AWS_LAMBDA_RUNTIME_API=http://127.0.0.1:$PORT/.*"; then
      echo "$p"
    fi
  done
}

stop_watch() {
  [ -n "$WATCH_PID" ] || return 0
  local pid=$WATCH_PID
  WATCH_PID=""
  # setsid made watch a process-group leader: signal the group it leads, by its id. On SIGINT
  # watch terminates the function instances it started (each runs in a process group of its own).
  kill -INT -- "-$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "watch (pid $pid) did not stop on SIGINT; killing its process group"
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
  local left
  left="$(our_function_pids)"
  if [ -n "$left" ]; then
    log "stopping function processes left by watch: $(echo "$left" | tr '\n' ' ')"
    # shellcheck disable=SC2086
    kill $left 2>/dev/null || true
  fi
}

delete_stack() {
  [ "$STACK_CREATED" = 1 ] || return 0
  if [ "${SMOKE_KEEP:-0}" = 1 ]; then
    log "SMOKE_KEEP=1: keeping stack $STACK (outputs: $OUTPUTS)"
    return 0
  fi
  # Fire and forget: LocalStack deletes the queues and the table in the background.
  "$PY" - "$STACK" <<'PY' >/dev/null 2>&1 || log "warning: could not delete stack $STACK"
import sys, boto3
from botocore.config import Config
cfg = Config(connect_timeout=5, read_timeout=20, retries={"max_attempts": 2})
boto3.client("cloudformation", config=cfg).delete_stack(StackName=sys.argv[1])
PY
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  stop_watch
  delete_stack
  if [ "${SMOKE_KEEP:-0}" != 1 ]; then rm -rf -- "$WORK"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------------------------
# preconditions
# ---------------------------------------------------------------------------------------------

for f in submitter-sqs.json submitter-sqs-malformed.json submitter-sqs-long-reason.json \
  scheduler-sqs.json agent-sqs.json supervisor-sqs.json supervisor-scheduled.json; do
  [ -f "$EVENTS_DIR/$f" ] || die "missing fixture events/$f"
done

if [ ! -x "$CARGO_LAMBDA" ] || [ ! -x "$PY" ]; then
  log "cargo-lambda not in the tools venv; installing it (infra/tools.sh install)"
  bash infra/tools.sh install </dev/null
fi
[ -x "$CARGO_LAMBDA" ] || die "$CARGO_LAMBDA missing after infra/tools.sh install"
log "$("$CARGO_LAMBDA" lambda --version)"

localstack_up() { curl -fsS --max-time 5 -o /dev/null "$AWS_ENDPOINT_URL/_localstack/health"; }
if ! localstack_up 2>/dev/null; then
  if [ "$AWS_ENDPOINT_URL" = "http://localhost:$LOCALSTACK_PORT" ]; then
    log "LocalStack is not answering on $AWS_ENDPOINT_URL; starting it (infra/localstack.sh ensure)"
    bash infra/localstack.sh ensure </dev/null
  else
    die "nothing answers on AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL"
  fi
fi

# ---------------------------------------------------------------------------------------------
# build (separately: building both packages in one command unifies features differently, and
# watch's `cargo run --bin` would then rebuild dependencies)
# ---------------------------------------------------------------------------------------------

t=$SECONDS
log "building the function binaries (cargo build -p sas-functions --bins)"
cargo build -q -p sas-functions --bins </dev/null || die "cargo build -p sas-functions failed"
log "building sasctl"
cargo build -q -p sas-cli --bin sasctl </dev/null || die "cargo build -p sas-cli failed"
log "built in $((SECONDS - t)) s"

# ---------------------------------------------------------------------------------------------
# a throwaway stack, and the functions' environment from its outputs
# ---------------------------------------------------------------------------------------------

sasctl() { "$SAS_ROOT/target/debug/sasctl" --outputs "$OUTPUTS" "$@" </dev/null; }

t=$SECONDS
log "deploying stack $STACK onto $AWS_ENDPOINT_URL"
STACK_CREATED=1
sasctl deploy-local --name "$STACK" >"$WORK/deploy.log" 2>&1 || {
  grep -v '^ *[0-9]*: \|^  *at \|^Stack backtrace:' "$WORK/deploy.log" | head -n 20 >&2
  die "sasctl deploy-local --name $STACK failed"
}
log "deployed in $((SECONDS - t)) s"

# KEY=VALUE lines for the functions' environment, from the outputs JSON.
"$PY" - "$OUTPUTS" >"$WORK/function.env" <<'PY' || die "the stack outputs miss a key (see above)"
import json, sys
out = json.load(open(sys.argv[1]))
env = {
    "TASK_TABLE": "TaskTableName",
    "SUBMISSION_QUEUE_URL": "SubmissionQueueUrl",
    "SUBMISSION_DLQ_URL": "SubmissionDlqUrl",
    "SCHEDULER_QUEUE_URL": "SchedulerQueueUrl",
    "AGENT_QUEUE_URL": "AgentQueueUrl",
    "SUPERVISOR_QUEUE_URL": "SupervisorQueueUrl",
    "ALERT_TOPIC_ARN": "AlertTopicArn",
}
missing = [k for k in env.values() if not out.get(k)]
if missing:
    sys.exit(f"stack outputs lack {missing}")
for var, key in env.items():
    print(f"{var}={out[key]}")
print(f"SUPERVISOR_SHARDS={out.get('SupervisorShards', '4')}")
PY
set -a
# shellcheck disable=SC1091
source "$WORK/function.env"
set +a
# Logs: info from our crates, quiet from the SDK.
export RUST_LOG="${RUST_LOG:-info}"

# ---------------------------------------------------------------------------------------------
# cargo lambda watch
# ---------------------------------------------------------------------------------------------

if [ -n "${SMOKE_PORT:-}" ]; then
  PORT=$SMOKE_PORT
else
  PORT="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
fi

mkdir -p -- "$(dirname -- "$WATCH_LOG")"
: >"$WATCH_LOG"
log "starting cargo lambda watch on 127.0.0.1:$PORT (log: ${WATCH_LOG#"$SAS_ROOT"/})"
# --ignore-changes: others edit the crates meanwhile; a reload mid-run would make the test flaky.
# The environment (stack resources, LocalStack endpoint, dummy credentials) is inherited by every
# function process watch spawns.
setsid "$CARGO_LAMBDA" lambda watch --invoke-address 127.0.0.1 --invoke-port "$PORT" \
  --ignore-changes </dev/null >>"$WATCH_LOG" 2>&1 &
WATCH_PID=$!

for _ in $(seq 1 300); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then break; fi
  kill -0 "$WATCH_PID" 2>/dev/null || { tail -n 30 "$WATCH_LOG" >&2; die "cargo lambda watch exited"; }
  sleep 0.1
done
(exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null || die "cargo lambda watch is not listening on $PORT after 30 s"

# ---------------------------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------------------------

# check_response KIND FILE: `sqs` wants {"batchItemFailures": []}; `sweep` wants a sweep report.
check_response() {
  "$PY" - "$1" "$2" <<'PY'
import json, sys
kind, path = sys.argv[1], sys.argv[2]
text = open(path).read().strip()
try:
    r = json.loads(text)
except ValueError:
    sys.exit(f"the response is not JSON: {text[:500]!r}")
if not isinstance(r, dict):
    sys.exit(f"the response is not a JSON object: {text[:500]}")
if "errorType" in r or "errorMessage" in r:
    sys.exit(f"the function returned an error: {text[:1000]}")
if kind == "sqs":
    if "batchItemFailures" not in r:
        sys.exit(f"no batchItemFailures in {text[:500]}")
    if r["batchItemFailures"] != []:
        ids = [f.get("itemIdentifier") for f in r["batchItemFailures"]]
        sys.exit(f"records reported as failed (SQS would deliver them again): {ids}")
elif kind == "sweep":
    missing = [k for k in ("expired", "recovered", "stale", "errors") if not isinstance(r.get(k), int)]
    if missing:
        sys.exit(f"not a sweep report (no integer {missing}): {text[:500]}")
    if r["errors"] != 0:
        sys.exit(f"the sweep reported errors: {text}")
PY
}

# sqs_peek QUEUE_URL: up to 10 messages from a queue, one JSON line each (body + attributes).
sqs_peek() {
  "$PY" - "$1" <<'PY'
import json, sys, boto3
sqs = boto3.client("sqs")
seen = {}
for _ in range(3):
    r = sqs.receive_message(QueueUrl=sys.argv[1], MaxNumberOfMessages=10, WaitTimeSeconds=1,
                            VisibilityTimeout=30, MessageAttributeNames=["All"])
    for m in r.get("Messages", []):
        seen[m["MessageId"]] = {"body": m["Body"],
                                "attributes": {k: v.get("StringValue") for k, v in m.get("MessageAttributes", {}).items()}}
    if seen:
        break
for m in seen.values():
    print(json.dumps(m))
PY
}

# expect_log WHAT PATTERN: a line the handler should have logged since the invocation started.
# Informational: log wording may change, the response is what decides.
expect_log() {
  if tail -c +"$((LOG_MARK + 1))" "$WATCH_LOG" | grep -q -- "$2"; then
    log "  log: $1"
  else
    log "  note: expected a log line matching '$2' ($1); not found (wording changed?)"
  fi
}

# invoke NAME BIN FIXTURE KIND
invoke() {
  local name=$1 bin=$2 fixture=$3 kind=$4 t=$SECONDS rc=0 why
  LOG_MARK=$(stat -c %s "$WATCH_LOG")
  log "invoke $bin with events/$fixture"
  timeout "$INVOKE_TIMEOUT" "$CARGO_LAMBDA" lambda invoke "$bin" \
    --invoke-address 127.0.0.1 --invoke-port "$PORT" --data-file "$EVENTS_DIR/$fixture" \
    </dev/null >"$WORK/$name.out" 2>"$WORK/$name.err" || rc=$?
  RESPONSE="$(cat "$WORK/$name.out")"
  if [ "$rc" = 124 ]; then
    why="no response within ${INVOKE_TIMEOUT} s"
  elif [ "$rc" != 0 ]; then
    # cargo-lambda prints the function's error after a "×"; keep that line when there is one.
    why="$(sed -n 's/^ *× *//p' "$WORK/$name.err" "$WORK/$name.out" | head -n 1)"
    why="cargo lambda invoke exited $rc: ${why:-$(tr '\n' ' ' <"$WORK/$name.err")$(tr '\n' ' ' <"$WORK/$name.out")}"
  else
    why="$(check_response "$kind" "$WORK/$name.out" 2>&1)" && why=""
  fi
  if [ -z "$why" ]; then
    log "  ok ($((SECONDS - t)) s): $RESPONSE"
    SUMMARY+=("PASS  $bin <- events/$fixture")
    return 0
  fi
  fail "$bin <- events/$fixture: $why"
  tail -c +"$((LOG_MARK + 1))" "$WATCH_LOG" >"$WORK/$name.log"
  if grep -q 'panicked at' "$WORK/$name.log"; then
    log "  the function panicked:"
    grep -A1 'panicked at' "$WORK/$name.log" | sed 's/^/    | /' >&2
    log "  (a panic fails the whole invocation: SQS would deliver every record of the batch again)"
  fi
  log "  the function's output for this invocation (${WATCH_LOG#"$SAS_ROOT"/}), without backtraces:"
  grep -v '^ *[0-9]*: \|^  *at ' "$WORK/$name.log" | cut -c1-400 | tail -n 15 | sed 's/^/    | /' >&2
  SUMMARY+=("FAIL  $bin <- events/$fixture: $why")
  return 1
}

# side NAME CONDITION-DESCRIPTION: record a side-effect check.
side_ok() { log "  ok: $1"; SUMMARY+=("PASS  $1"); }
side_fail() { fail "$1: $2"; SUMMARY+=("FAIL  $1: $2"); }

# 1. Submitter, a valid submission: the task is created and handed to the Scheduler.
if invoke submit sas-submitter submitter-sqs.json sqs; then
  expect_log "task created" '"task created"'
  if st="$(sasctl status fixture-1 --json 2>"$WORK/status.err")"; then
    state="$(printf '%s' "$st" | "$PY" -c 'import json,sys; t=json.load(sys.stdin); print(t.get("process_state") or t.get("ProcessState"))')"
    side_ok "submitter: task fixture-1 is in the table (state $state)"
  else
    side_fail "submitter: task fixture-1 in the table" "sasctl status: $(tr '\n' ' ' <"$WORK/status.err")"
  fi
fi

# in_dlq WHAT FIXTURE REASON: the fixture's raw body is in the submission DLQ, with a
# RejectReason attribute containing REASON.
in_dlq() {
  local what=$1 fixture=$2 reason=$3
  if sqs_peek "$SUBMISSION_DLQ_URL" >"$WORK/dlq.jsonl" 2>"$WORK/dlq.err" &&
    "$PY" - "$WORK/dlq.jsonl" "$EVENTS_DIR/$fixture" "$reason" <<'PY' 2>"$WORK/dlq.why"
import json, sys
msgs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
body = json.load(open(sys.argv[2]))["Records"][0]["body"]
hit = [m for m in msgs if m["body"] == body]
if not hit:
    sys.exit(f"the raw body is not in the submission DLQ ({len(msgs)} other messages there)")
got = hit[0]["attributes"].get("RejectReason") or ""
if sys.argv[3] not in got:
    sys.exit(f"RejectReason is {got[:200]!r}, expected it to contain {sys.argv[3]!r}")
PY
  then
    side_ok "$what"
  else
    side_fail "$what" "$(cat "$WORK/dlq.why" "$WORK/dlq.err" 2>/dev/null | tr '\n' ' ')"
  fi
}

# 2. Submitter, a body that is not JSON: rejected into the DLQ, the record still succeeds.
if invoke submit-malformed sas-submitter submitter-sqs-malformed.json sqs; then
  expect_log "submission rejected" '"submission rejected"'
  in_dlq "submitter: the non-JSON body is in the submission DLQ with its RejectReason" \
    submitter-sqs-malformed.json "not JSON"
fi

# 2b. Submitter, a valid-JSON submission naming an unknown workflow with a long non-ASCII name:
# the rejection reason is over 1024 bytes and must be cut for the DLQ attribute without
# splitting a character. Same contract as 2: DLQ, and the record succeeds.
if invoke submit-long-reason sas-submitter submitter-sqs-long-reason.json sqs; then
  in_dlq "submitter: the unknown-workflow submission is in the submission DLQ with its RejectReason" \
    submitter-sqs-long-reason.json "unknown workflow"
fi

# 3. Scheduler: a run message for a task that does not exist is dropped (logged), not failed.
if invoke schedule sas-scheduler scheduler-sqs.json sqs; then
  expect_log "no such task" 'no such task'
fi

# 4. Agent: CompleteBy already passed, so nothing is started and nothing is sent back.
if invoke agent sas-agent agent-sqs.json sqs; then
  expect_log "nothing started (CompleteBy passed)" 'CompleteBy passed'
fi

# 5. Supervisor, a timer for a missing task.
invoke timer sas-supervisor supervisor-sqs.json sqs || true

# 6. Supervisor, the EventBridge scheduled event: a sweep of every shard.
invoke sweep sas-supervisor supervisor-scheduled.json sweep || true

# The scheduler queue holds the submitter's run message for fixture-1, and no agent result
# (the agent fixture must not have reported anything).
if sqs_peek "$SCHEDULER_QUEUE_URL" >"$WORK/sched.jsonl" 2>"$WORK/sched.err" &&
  "$PY" - "$WORK/sched.jsonl" <<'PY' 2>"$WORK/sched.why"
import json, sys
bodies = [json.loads(json.loads(l)["body"]) for l in open(sys.argv[1]) if l.strip()]
if any(b.get("type") == "result" for b in bodies):
    sys.exit(f"an agent result was sent although CompleteBy had passed: {bodies}")
if not any(b.get("type") == "run" and b.get("task_id") == "fixture-1" for b in bodies):
    sys.exit(f"no run message for fixture-1 on the scheduler queue: {bodies}")
PY
then
  side_ok "scheduler queue: the run message for fixture-1, no agent result"
else
  side_fail "scheduler queue contents" "$(cat "$WORK/sched.why" "$WORK/sched.err" 2>/dev/null | tr '\n' ' ')"
fi

# Every binary must still be alive after its invocations (a panic would have killed it).
for bin in sas-submitter sas-scheduler sas-agent sas-supervisor; do
  if ! our_function_pids | xargs -r ps -o comm= -p 2>/dev/null | grep -qx "$bin"; then
    side_fail "$bin process" "not running after its invocations (crashed?); see ${WATCH_LOG#"$SAS_ROOT"/}"
  fi
done

if grep -q '"level":"ERROR"\|panicked at' "$WATCH_LOG"; then
  log "errors in the functions' output:"
  grep '"level":"ERROR"\|panicked at' "$WATCH_LOG" | head -n 10 | sed 's/^/    | /' >&2
fi

# ---------------------------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------------------------

stop_watch
printf '\n' >&2
for line in "${SUMMARY[@]}"; do printf '  %s\n' "$line" >&2; done
if [ "$FAILURES" -gt 0 ]; then
  log "FAILED: $FAILURES check(s) failed in $((SECONDS - START)) s (stack $STACK, log ${WATCH_LOG#"$SAS_ROOT"/})"
  exit 1
fi
log "all Lambda smoke checks passed in $((SECONDS - START)) s"
