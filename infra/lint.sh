#!/usr/bin/env bash
# Lint the infrastructure: sam validate --lint and cfn-lint on template.yaml (tools venv) gate it.
# ShellCheck findings on the scripts are advisory (printed, never fatal): ShellCheck is not part
# of the pinned tools and is present on some machines only, so it must not change the verdict.
set -euo pipefail

# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
cd "$SAS_ROOT"

"$SAS_ROOT/infra/tools.sh" install
export PATH="$TOOLS_VENV/bin:$PATH"

echo "== sam validate --lint"
# sam validate resolves the region for the SAM transform; any region will do offline.
AWS_REGION="${AWS_REGION:-us-east-1}" sam validate --lint --template-file template.yaml

echo "== cfn-lint (config: .cfnlintrc)"
cfn-lint
echo "cfn-lint: no findings"

echo "== python: infra/*.py parse"
for f in infra/*.py; do
  "$TOOLS_VENV/bin/python" -c 'import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])' "$f"
done

if command -v shellcheck >/dev/null 2>&1; then
  echo "== shellcheck (advisory)"
  if shellcheck -x infra/*.sh .ci/run; then
    echo "shellcheck: no findings"
  else
    echo "shellcheck: findings above (advisory, not failing the lint)"
  fi
else
  echo "== shellcheck: not installed, skipped (apt-get install shellcheck)"
fi
