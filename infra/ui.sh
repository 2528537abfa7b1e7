#!/usr/bin/env bash
# make ui: `sasctl ui` (the console in the browser) on the stack of the last `make demo` (Lambda
# mode), else `make demo-local`'s, else `make up`'s. Serves http://127.0.0.1:8080/ until Ctrl-C.
#
#   make ui                        the console, on loopback
#   make ui ARGS='--read-only'     offers and takes no action
#   make ui ARGS='--listen 127.0.0.1:9000'
set -euo pipefail
# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
cd "$SAS_ROOT"

OUTPUTS=""
for f in demo-lambda-outputs.json demo-outputs.json outputs.json; do
  if [ -f "$SAS_LOCAL_DIR/$f" ]; then OUTPUTS="$SAS_LOCAL_DIR/$f"; break; fi
done
if [ -z "$OUTPUTS" ]; then
  echo "ui: no stack outputs in $SAS_LOCAL_DIR: run make demo (or make up) first" >&2
  exit 1
fi
if ! infra/localstack.sh healthy; then
  echo "ui: LocalStack is not running, so its tables are gone: run make demo (or make up) first" >&2
  exit 1
fi
cargo build -q --workspace --bins
echo "ui: the stack of $OUTPUTS" >&2
# shellcheck disable=SC2086 # ARGS is a list of extra options
exec target/debug/sasctl --outputs "$OUTPUTS" ui ${ARGS:-}
