#!/usr/bin/env bash
# make sam-deploy-local: the path to AWS, taken against LocalStack. SAM's own deploy (samlocal: SAM
# CLI with LocalStack's endpoint) packages `sam build`'s output (.aws-sam/build; built here with
# infra/sam-build.sh x86_64 when missing), uploads it to S3 and creates the stack through a change
# set, with the five functions on (LocalStack runs them as host processes). Then the post-deploy
# smoke check the README gives for AWS (`sasctl --stack NAME smoke`: one sim-order task to
# Processed, its timeline), then the README's tear-down: lift the task table's deletion protection
# (samconfig.toml's TableDeletionProtection=true), then `samlocal delete`.
# Knob: SAM_DEPLOY_STACK (sas-samdeploy).
set -euo pipefail

# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
cd "$SAS_ROOT"

STACK="${SAM_DEPLOY_STACK:-sas-samdeploy}"
log() { printf '[sam-deploy-local] %s\n' "$*" >&2; }

infra/sam-build.sh --if-missing x86_64
cargo build -q -p sas-cli --bin sasctl
if ! infra/localstack.sh healthy; then
  trap 'infra/localstack.sh stop' EXIT
fi
infra/localstack.sh ensure
export PATH="$TOOLS_VENV/bin:$PATH"

# The stack's task table, and whether it is protected against deletion (True/False).
aws_table() {
  "$TOOLS_VENV/bin/python" -c 'import boto3, sys
outs = boto3.client("cloudformation").describe_stacks(StackName=sys.argv[1])["Stacks"][0]["Outputs"]
print(next(o["OutputValue"] for o in outs if o["OutputKey"] == "TaskTableName"))' "$STACK"
}
table_exists() {
  "$TOOLS_VENV/bin/python" -c 'import boto3, sys
sys.exit(0 if sys.argv[1] in boto3.client("dynamodb").list_tables(Limit=100)["TableNames"] else 1)' "$1"
}
stack_parameter() {
  "$TOOLS_VENV/bin/python" -c 'import boto3, sys
ps = boto3.client("cloudformation").describe_stacks(StackName=sys.argv[1])["Stacks"][0]["Parameters"]
print(next(p["ParameterValue"] for p in ps if p["ParameterKey"] == sys.argv[2]))' "$STACK" "$1"
}
table_protected() {
  "$TOOLS_VENV/bin/python" -c 'import boto3, sys
print(boto3.client("dynamodb").describe_table(TableName=sys.argv[1])["Table"].get("DeletionProtectionEnabled", False))' "$1"
}

# What a user runs against AWS is `sam deploy` with samconfig.toml's default config env
# (Architecture=x86_64, TableDeletionProtection=true, resolve_s3, capabilities). Here: the same
# command through samlocal, without the interactive confirmation.
deploy=(samlocal deploy --stack-name "$STACK" --no-confirm-changeset)
log "\$ ${deploy[*]}"
start=$SECONDS
# The lines "  PASS ..." / "  FAIL ..." are what CI counts.
if ! "${deploy[@]}" >.local/sam-deploy-local.log 2>&1; then
  tail -n 40 .local/sam-deploy-local.log >&2
  echo "  FAIL samlocal deploy of .aws-sam/build (log .local/sam-deploy-local.log)"
  exit 1
fi
echo "  PASS samlocal deploy of .aws-sam/build, functions on, in $((SECONDS - start)) s"

rc=0
log "\$ sasctl --stack $STACK smoke"
if target/debug/sasctl --stack "$STACK" smoke --timeout-secs 180; then
  echo "  PASS sasctl --stack $STACK smoke: a sim-order task ran to Processed through the deployed functions"
else
  rc=1
  echo "  FAIL sasctl --stack $STACK smoke"
fi

# The README's tear-down, as written: the stack was deployed with samconfig.toml's
# TableDeletionProtection=true; lift the protection on the table, then `sam delete`.
table="$(aws_table)"
if [ "$(stack_parameter TableDeletionProtection)" = true ]; then
  echo "  PASS the stack was deployed with samconfig.toml's TableDeletionProtection=true"
else
  echo "  FAIL the stack was not deployed with TableDeletionProtection=true"
  rc=1
fi
if [ "$(table_protected "$table")" != True ]; then
  # LocalStack 4.13.1's CloudFormation provider for AWS::DynamoDB::Table drops
  # DeletionProtectionEnabled (its create) and has no update; AWS sets it. Set it as AWS would.
  log "LocalStack's CloudFormation does not apply DeletionProtectionEnabled: setting it on $table as AWS does"
  "$TOOLS_VENV/bin/python" -c 'import boto3, sys
boto3.client("dynamodb").update_table(TableName=sys.argv[1], DeletionProtectionEnabled=True)' "$table"
fi
lift=(infra/aws.sh dynamodb update-table --table-name "$table" --no-deletion-protection-enabled)
log "\$ aws dynamodb update-table --table-name $table --no-deletion-protection-enabled"
if "${lift[@]}" >>.local/sam-deploy-local.log 2>&1 && [ "$(table_protected "$table")" = False ]; then
  echo "  PASS aws dynamodb update-table --no-deletion-protection-enabled lifted the protection"
else
  echo "  FAIL lifting the table's protection"
  rc=1
fi

log "\$ samlocal delete --stack-name $STACK --no-prompts"
start=$SECONDS
if samlocal delete --stack-name "$STACK" --no-prompts >>.local/sam-deploy-local.log 2>&1 && ! table_exists "$table"; then
  echo "  PASS samlocal delete removed the stack, the task table included, in $((SECONDS - start)) s"
else
  tail -n 20 .local/sam-deploy-local.log >&2
  echo "  FAIL samlocal delete"
  rc=1
fi
exit "$rc"
