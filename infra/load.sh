#!/usr/bin/env bash
# make load: a benchmark on the stack `make up` runs (not a test). Sends a burst of N sim-order
# tasks (default 1000) to the submission queue, polls the table until every task is terminal, and
# reports drain time, throughput, latency percentiles, attempts per step and final states.
#
#   make load                 N=1000 against .local/outputs.json (runs `make up` first if no runner runs)
#   make load N=100 ARGS='--json --timeout-secs 300'
#
# The benchmark is `sas-dev load` (crates/dev, the developer's binary; not sasctl's).
# What `make up` started stays up: `make down` stops it.
set -euo pipefail
# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
cd "$SAS_ROOT"

N="${N:-1000}"
OUTPUTS="$SAS_LOCAL_DIR/outputs.json"
PIDFILE="$SAS_LOCAL_DIR/runner.pid"

if [ ! -f "$OUTPUTS" ] || [ ! -f "$PIDFILE" ] || ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null \
  || ! infra/localstack.sh healthy; then
  echo "load: no local runner or LocalStack is running for this checkout: make up first" >&2
  infra/up.sh >&2
fi
cargo build -q --workspace --bins
echo "load: $N tasks; the runner (pid $(cat "$PIDFILE"), log $SAS_LOCAL_DIR/runner.log) does the work" >&2
# shellcheck disable=SC2086 # ARGS is a list of extra options
exec target/debug/sas-dev --outputs "$OUTPUTS" load --tasks "$N" ${ARGS:-}
