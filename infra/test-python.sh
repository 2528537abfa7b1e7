#!/usr/bin/env bash
# make test-python: the project's Python unit tests with the tools venv's pytest (config: pytest.ini):
# the Lambda executor's (infra/lambda-executor/test_*.py: layers, Runtime API server, sandbox), the
# Lambda smoke harness's (infra/test_lambda_smoke.py) and the cost benchmark's
# (bench/test_cost_proxy.py). No LocalStack, Docker or network; a few seconds. ARGS go to pytest
# (make test-python ARGS='-k sandbox -v').
set -euo pipefail

# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
cd "$SAS_ROOT"

"$SAS_ROOT/infra/tools.sh" install
exec "$TOOLS_VENV/bin/python" -m pytest "$@"
