#!/usr/bin/env bash
# make demo, the main job: LocalStack (installed and started if needed), the stack deployed onto
# it, every role run locally, sample orders processed and checked. Stops LocalStack afterwards if
# this script started it.
set -euo pipefail
# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
cd "$SAS_ROOT"

# Stop LocalStack afterwards only if this script is the one that starts it.
if ! infra/localstack.sh healthy; then
  trap 'echo; infra/localstack.sh stop' EXIT
fi
infra/localstack.sh ensure
echo "[demo] building sasctl"
cargo build -q -p sas-cli --bin sasctl
OUTPUTS="$SAS_LOCAL_DIR/demo-outputs.json"
target/debug/sasctl --outputs "$OUTPUTS" deploy-local --name sas-demo
echo "[demo] role logs: $SAS_LOCAL_DIR/demo.log"
echo
RUST_LOG="${RUST_LOG:-info}" target/debug/sasctl --outputs "$OUTPUTS" demo 2>"$SAS_LOCAL_DIR/demo.log"
