#!/usr/bin/env bash
# Deploy/inspect/delete template.yaml on LocalStack (see infra/stack.py; functions off by default):
#   infra/stack.sh deploy NAME [Key=Value ...] [--code DIR] | outputs NAME | delete NAME | smoke
set -euo pipefail

# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
[ -x "$LOCALSTACK_VENV/bin/python" ] || { echo "run infra/localstack.sh install first" >&2; exit 1; }
exec "$LOCALSTACK_VENV/bin/python" "$SAS_ROOT/infra/stack.py" "$@"
