#!/usr/bin/env bash
# Lint the infrastructure: sam validate --lint, cfn-lint (on template.yaml, and again with
# GradualDeploy=true) and checkov on template.yaml (tools venvs) gate it; checkov fails on any failed check or parsing error (skips are in the template, each with
# its reason). ruff (config: ruff.toml) gates the project's Python: any finding fails the lint.
# The Python unit tests are `make test-python` (infra/test-python.sh).
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

# The gradual deploy path (GradualDeploy=true: CodeDeploy's application, role and a deployment
# group per function, with the alarms that roll it back) exists only when the parameter is true,
# and cfn-lint reads a SAM template without transforming it: sam validate on a copy of the
# template whose default is true, then cfn-lint on SAM's transform of it (infra/sam_transform.py;
# W2001 ignored: the transform puts DeploymentType's value in place of its Ref; W1028: the
# Agent's CALLBACK_URL keeps an !If on FunctionsEnabled, which LocalStack needs to delete a stack
# without functions, inside a function of that condition).
echo "== GradualDeploy=true: sam validate --lint, then cfn-lint on the transformed template"
gradual="$SAS_LOCAL_DIR/lint/template-gradual.yaml"
mkdir -p "$(dirname -- "$gradual")"
awk '/^  GradualDeploy:$/ { in_param = 1 }
     in_param && /^    Default: "false"$/ { sub(/"false"/, "\"true\""); in_param = 0; flipped = 1 }
     { print }
     END { if (!flipped) exit 1 }' template.yaml >"$gradual" ||
  { echo "lint: template.yaml has no GradualDeploy parameter defaulting to \"false\"" >&2; exit 1; }
AWS_REGION="${AWS_REGION:-us-east-1}" sam validate --lint --template-file "$gradual"
python "$SAS_ROOT/infra/sam_transform.py" template.yaml "${gradual%.yaml}.json" GradualDeploy=true
groups=$(grep -c '"Type": "AWS::CodeDeploy::DeploymentGroup"' "${gradual%.yaml}.json" || true)
[ "$groups" = 5 ] || { echo "lint: GradualDeploy=true gives $groups CodeDeploy deployment groups, not one per function (5)" >&2; exit 1; }
cfn-lint --include-checks I --ignore-checks W2001 W1028 -- "${gradual%.yaml}.json"
echo "cfn-lint (GradualDeploy=true, transformed: 5 deployment groups): no findings"

echo "== checkov (config: .checkov.yaml)"
checkov_json="$SAS_LOCAL_DIR/checkov-results.json"
rm -f -- "$checkov_json"
checkov_rc=0
"$CHECKOV_VENV/bin/checkov" --quiet -o cli -o json --output-file-path "console,$checkov_json" || checkov_rc=$?
"$CHECKOV_VENV/bin/python" - "$checkov_json" "$checkov_rc" <<'PY'
import json
import sys

path, rc = sys.argv[1], int(sys.argv[2])
try:
    with open(path) as f:
        report = json.load(f)
except (OSError, ValueError) as exc:
    sys.exit(f"checkov: no report ({exc}); exit {rc}")
reports = report if isinstance(report, list) else [report]
summary = {key: sum(r["summary"][key] for r in reports) for key in ("passed", "failed", "skipped", "parsing_errors", "resource_count")}
print(
    f"checkov {reports[0]['summary']['checkov_version']}: {summary['passed']} passed, {summary['failed']} failed, "
    f"{summary['skipped']} skipped, {summary['parsing_errors']} parsing errors, {summary['resource_count']} resources"
)
if rc != 0 or summary["failed"] or summary["parsing_errors"] or not summary["resource_count"]:
    sys.exit("checkov: failed (fix the template, or skip the check on the resource with a one-line reason)")
PY

echo "== $(ruff --version) check on the project's Python (config: ruff.toml)"
ruff check --output-format concise .

if command -v shellcheck >/dev/null 2>&1; then
  echo "== shellcheck (advisory)"
  if shellcheck -x infra/*.sh bench/*.sh .ci/run; then
    echo "shellcheck: no findings"
  else
    echo "shellcheck: findings above (advisory, not failing the lint)"
  fi
else
  echo "== shellcheck: not installed, skipped (apt-get install shellcheck)"
fi
