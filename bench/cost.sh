#!/usr/bin/env bash
# make bench-cost: what one task costs on AWS, counted on LocalStack (see bench/README.md).
#
#   bench/cost.sh          the workloads (bench/cost_bench.py's WORKLOADS: the sim workflows and
#                          three translated Step Functions state machines), idle polling and one
#                          idle sweep; SWEEP=1 adds the sweep benchmark
#   bench/cost.sh sweep    only the sweep benchmark (one small workload first, for items to copy)
#
# It builds sasctl, starts LocalStack when none answers (infra/localstack.sh ensure), deploys a
# fresh stack of its own (BENCH_STACK, default sas-bench), starts the counting proxy
# (bench/cost_proxy.py) and the local runner pointed at the proxy, runs bench/cost_bench.py, and
# stops what it started: the runner and the proxy always; LocalStack only if it started it (else
# it deletes its stack, so a shared LocalStack is left as it was).
# Knobs: BENCH_N (1-step tasks, default 200; 3-step workloads get half), BENCH_LOG_LEVEL (the
# runner's RUST_LOG, default info, as the template's LogLevel), BENCH_ONLY (workloads to run, e.g.
# 5 for the 1,000-element map alone), BENCH_CONCURRENCY (the runner's batches in flight per queue,
# as concurrent invocations; default 4), SWEEP=1, SWEEP_FINISHED
# (100000), BENCH_QUEUE_BUDGET_MS (15000), LOCALSTACK_PORT (4566), CARGO_TARGET_DIR.
# Output: the tables on stdout, raw figures in .local/bench-cost.json, every DynamoDB item write
# (sizes before/after, index entry sizes, units) in .local/bench-writes.jsonl.
set -euo pipefail
# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../infra/env.sh"
cd "$SAS_ROOT"

MODE="${1:-cost}"
case "$MODE" in
  cost | sweep) ;;
  *) echo "usage: bench/cost.sh [cost|sweep]" >&2; exit 2 ;;
esac
STACK="${BENCH_STACK:-sas-bench}"
OUTPUTS="$SAS_LOCAL_DIR/bench-outputs.json"
JSON_OUT="$SAS_LOCAL_DIR/bench-cost.json"
IN_FLIGHT="$SAS_LOCAL_DIR/bench-in-flight-item.json"
PORT_FILE="$SAS_LOCAL_DIR/bench-proxy.port"
PROXY_LOG="$SAS_LOCAL_DIR/bench-proxy.log"
TRACE="$SAS_LOCAL_DIR/bench-writes.jsonl"
RUNNER_LOG="$SAS_LOCAL_DIR/bench-runner.log"
# The runner's stdout: its JSON log lines and EMF records, as the functions write them.
RUNNER_OUT="$SAS_LOCAL_DIR/bench-runner.jsonl"
# The runner's configuration: the base files + the translated state machines (bench/asl_bench.py).
BENCH_WORKFLOWS="$SAS_LOCAL_DIR/bench-workflows.json"
BENCH_AGENTS="$SAS_LOCAL_DIR/bench-agents.json"
ASL_INFO="$SAS_LOCAL_DIR/bench-asl.json"
ASL_LOG="$SAS_LOCAL_DIR/bench-asl.log"
UPSTREAM="http://127.0.0.1:$LOCALSTACK_PORT"
# SASCTL_BIN: measure that sasctl (e.g. a copy of another build) instead of building this checkout's
SASCTL="${SASCTL_BIN:-${CARGO_TARGET_DIR:-$SAS_ROOT/target}/debug/sasctl}"
PYTHON="${PYTHON:-python3}"
mkdir -p -- "$SAS_LOCAL_DIR"

log() { printf 'bench-cost: %s\n' "$*" >&2; }

started_ls=0
proxy_pid=""
runner_pid=""
asl_pid=""

# stop PID NAME: SIGTERM, then SIGKILL after 20 s.
stop() {
  local pid="$1" i
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  log "stopping the $2 (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 200; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
  local rc=$?
  stop "$runner_pid" runner
  stop "$asl_pid" "approver and stub"
  stop "$proxy_pid" proxy
  if [ "$started_ls" = 1 ]; then
    infra/localstack.sh stop
  elif [ "${BENCH_KEEP_STACK:-0}" != 1 ] && [ -x "$SASCTL" ]; then
    log "deleting stack $STACK (BENCH_KEEP_STACK=1 keeps it)"
    "$SASCTL" --outputs "$OUTPUTS" delete-local --name "$STACK" >/dev/null 2>&1 || log "could not delete stack $STACK"
  fi
  exit "$rc"
}
trap cleanup EXIT

start=$SECONDS
# The proxy's cost rules first (a second; no point measuring with broken rules).
"$PYTHON" -m unittest discover -s bench -q
if ! infra/localstack.sh healthy; then
  infra/localstack.sh ensure
  started_ls=1
fi
if [ -n "${SASCTL_BIN:-}" ]; then
  log "measuring $SASCTL_BIN (SASCTL_BIN: not built)"
else
  log "building sasctl"
  cargo build -q -p sas-cli --bin sasctl
fi

# A fresh stack: an earlier run may have left tasks (or 100,000 of them) in its table.
"$SASCTL" --outputs "$OUTPUTS" delete-local --name "$STACK" >/dev/null 2>&1 || true
"$SASCTL" --outputs "$OUTPUTS" deploy-local --name "$STACK" >&2

rm -f -- "$PORT_FILE" "$IN_FLIGHT" "$TRACE"
"$PYTHON" bench/cost_proxy.py --upstream "$UPSTREAM" --port-file "$PORT_FILE" --trace "$TRACE" >"$PROXY_LOG" 2>&1 &
proxy_pid=$!
for ((i = 0; i < 100; i++)); do
  [ -s "$PORT_FILE" ] && break
  kill -0 "$proxy_pid" 2>/dev/null || { cat "$PROXY_LOG" >&2; exit 1; }
  sleep 0.1
done
PROXY="http://127.0.0.1:$(cat "$PORT_FILE")"

# The translated state machines (bench/asl_bench.py): what sim agents cannot stand for (the
# recommendation "buy", the approver; the approval queue is created and deleted by it), then the
# runner's workflows and agents files: the base ones (SAS_WORKFLOWS_FILE, SAS_AGENTS_FILE, else
# config/) + the three translations, their functions sim agents.
rm -f -- "$ASL_INFO"
"$PYTHON" bench/asl_bench.py serve --outputs "$OUTPUTS" --upstream "$UPSTREAM" --proxy "$PROXY" \
  --info "$ASL_INFO" 2>"$ASL_LOG" &
asl_pid=$!
for ((i = 0; i < 100; i++)); do
  [ -s "$ASL_INFO" ] && break
  kill -0 "$asl_pid" 2>/dev/null || { cat "$ASL_LOG" >&2; exit 1; }
  sleep 0.1
done
"$PYTHON" bench/asl_bench.py config --sasctl "$SASCTL" --info "$ASL_INFO" \
  --base-workflows "${SAS_WORKFLOWS_FILE:-config/workflows.json}" --base-agents "${SAS_AGENTS_FILE:-config/agents.json}" \
  --workflows "$BENCH_WORKFLOWS" --agents "$BENCH_AGENTS"

# The roles, as in make up, but through the proxy. No periodic sweep during the workloads (it is
# scheduled, not per task: measured on its own); a short queue budget so that every deadline timer
# fires, and is counted, within the run. Batches gather for the template's default
# BatchingWindowSeconds (1 s), as the functions' event sources do.
# Logs as the functions write them (JSON, RUST_LOG=BENCH_LOG_LEVEL, default the template's INFO),
# with their EMF records: bench/cost_bench.py counts the bytes per task (what seeing costs).
export BENCH_LOG_LEVEL="${BENCH_LOG_LEVEL:-info}"
MAP_BUCKET="$("$PYTHON" -c 'import sys; sys.path.insert(0, "bench"); import asl_bench; print(asl_bench.MAP_BUCKET)')" \
AWS_ENDPOINT_URL="$PROXY" SAS_OUTPUTS="$OUTPUTS" SAS_WORKFLOWS_FILE="$BENCH_WORKFLOWS" SAS_AGENTS_FILE="$BENCH_AGENTS" \
  QUEUE_BUDGET_MS="${BENCH_QUEUE_BUDGET_MS:-15000}" \
  SAS_LOG_FORMAT=json SAS_METRICS=on RUST_LOG="$BENCH_LOG_LEVEL" \
  "$SASCTL" run --sweep-every 86400 --batch-window-ms "${BENCH_BATCH_WINDOW_MS:-1000}" \
    --concurrency "${BENCH_CONCURRENCY:-4}" >"$RUNNER_OUT" 2>"$RUNNER_LOG" &
runner_pid=$!
sleep 1
kill -0 "$runner_pid" 2>/dev/null || { echo "the runner died at start:" >&2; tail -20 "$RUNNER_LOG" "$RUNNER_OUT" >&2; exit 1; }
log "LocalStack $UPSTREAM, proxy $PROXY (log $PROXY_LOG), runner pid $runner_pid (log $RUNNER_LOG)"

common=(--outputs "$OUTPUTS" --upstream "$UPSTREAM" --proxy "$PROXY" --sasctl "$SASCTL" --json-out "$JSON_OUT"
  --in-flight "$IN_FLIGHT" --runner-out "$RUNNER_OUT")
rc=0
if [ "$MODE" = sweep ]; then
  BENCH_N="${BENCH_N:-20}" QUEUE_BUDGET_MS="${BENCH_QUEUE_BUDGET_MS:-15000}" \
    "$PYTHON" bench/cost_bench.py workloads "${common[@]}" --only 3 >/dev/null || rc=$?
else
  only=()
  [ -n "${BENCH_ONLY:-}" ] && only=(--only "$BENCH_ONLY")
  QUEUE_BUDGET_MS="${BENCH_QUEUE_BUDGET_MS:-15000}" "$PYTHON" bench/cost_bench.py workloads "${common[@]}" "${only[@]}" || rc=$?
fi
if [ "$rc" = 0 ] && { [ "$MODE" = sweep ] || [ "${SWEEP:-0}" = 1 ]; }; then
  # The sweep recovers the expired copies: without a runner their follow-up messages stay queued,
  # so only the sweep's own requests are counted.
  stop "$runner_pid" runner
  runner_pid=""
  "$PYTHON" bench/cost_bench.py sweep "${common[@]}" --finished "${SWEEP_FINISHED:-100000}" || rc=$?
fi
log "done in $((SECONDS - start)) s"
exit "$rc"
