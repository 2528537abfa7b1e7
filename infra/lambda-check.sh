#!/usr/bin/env bash
# Check the `host` Lambda executor (infra/lambda-executor/) against the running LocalStack:
# functions with a Python/shell bootstrap, invoke, errors, timeout, crash, init failures,
# concurrency, CloudWatch Logs, an SQS event source with ReportBatchItemFailures and a scheduled
# EventBridge rule (see infra/lambda_check.py). Prints `  PASS ...`/`  FAIL ...: why` per check and
# a closing `lambda-check: N passed, M failed`; exits 1 when any check failed. Cleans up after itself.
# Takes ~20-75 s: the scheduled rule's first fire comes 0-60 s after its creation on LocalStack.
#
#   LOCALSTACK_PORT=4566 infra/lambda-check.sh      (LocalStack must be running: infra/localstack.sh start)
set -euo pipefail

# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
[ -x "$LOCALSTACK_VENV/bin/python" ] || { echo "run infra/localstack.sh install first" >&2; exit 1; }

health="$(curl -fsS --max-time 5 "$AWS_ENDPOINT_URL/_localstack/health" 2>/dev/null)" \
  || { echo "no LocalStack answers at $AWS_ENDPOINT_URL (infra/localstack.sh start)" >&2; exit 1; }
if ! grep -qE '"lambda": *"(available|running)"' <<<"$health"; then
  echo "LocalStack at $AWS_ENDPOINT_URL has no lambda service (SERVICES must include lambda)" >&2
  exit 1
fi

exec "$LOCALSTACK_VENV/bin/python" "$SAS_ROOT/infra/lambda_check.py" "$@"
