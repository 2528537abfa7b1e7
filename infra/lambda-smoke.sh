#!/usr/bin/env bash
# make lambda-smoke: build the five function binaries and boot each under a Lambda Runtime API, the
# host Lambda executor's (infra/lambda_smoke.py). No stack and no AWS endpoint are needed.
set -euo pipefail
# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
cd "$SAS_ROOT"
cargo build -q --workspace --bins
exec python3 infra/lambda_smoke.py "${CARGO_TARGET_DIR:-$SAS_ROOT/target}/debug"
