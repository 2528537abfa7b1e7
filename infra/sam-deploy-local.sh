#!/usr/bin/env bash
# make sam-deploy-local: the path to AWS, taken against LocalStack. SAM's own deploy (samlocal: SAM
# CLI with LocalStack's endpoint) packages `sam build`'s output (.aws-sam/build; built here with
# infra/sam-build.sh x86_64 when missing), uploads it to S3 and creates the stack through a change
# set, with the five functions on (LocalStack runs them as host processes). Then the post-deploy
# smoke check the book gives for AWS (`sasctl --stack NAME smoke`: one sim-order task to
# Processed, its timeline), the first-hour tutorial's blocks as written (a task sent from an
# application, its statuses read from its own reply queue), then the documented way to change a parameter of the deployed stack
# (`sam deploy --parameter-overrides LogLevel=DEBUG`), checking that every other parameter kept its
# value and that the task table is still protected against deletion (DynamoDB refuses to delete
# it), then the tear-down: lift the protection on the table, then `samlocal delete`.
# Knob: SAM_DEPLOY_STACK (sas-samdeploy).
set -euo pipefail

# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
cd "$SAS_ROOT"

STACK="${SAM_DEPLOY_STACK:-sas-samdeploy}"
log() { printf '[sam-deploy-local] %s\n' "$*" >&2; }

infra/sam-build.sh --if-missing x86_64
cargo build -q --workspace --bins # sasctl; --workspace as every build of the scripts (one feature set)
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

# The first-hour tutorial's own blocks, as the page gives them (docs/run-tutorial.py runs the ones
# marked `<!-- ci: run -->`): an application sends a task with the AWS CLI and reads its statuses
# on its own reply queue, the same with boto3, then sasctl status and list. `aws` is LocalStack's
# CLI (infra/aws.sh), `sasctl` the debug build, and the page's stack name is this stack's.
tutorial=docs/tutorials/first-hour-on-aws.md
shim="$(mktemp -d)"
work="$(mktemp -d)"
printf '#!/usr/bin/env bash\nexec %q "$@"\n' "$SAS_ROOT/infra/aws.sh" >"$shim/aws"
chmod +x "$shim/aws"
ln -s "$SAS_ROOT/target/debug/sasctl" "$shim/sasctl"
log "\$ docs/run-tutorial.py $tutorial --set stack=$STACK"
if (cd "$work" && PATH="$shim:$PATH" timeout 300 "$TOOLS_VENV/bin/python" "$SAS_ROOT/docs/run-tutorial.py" \
  "$SAS_ROOT/$tutorial" --set "stack=$STACK" --python "$TOOLS_VENV/bin/python") >.local/first-hour.log 2>&1; then
  echo "  PASS the first-hour tutorial's blocks ran as written ($(grep -c '^--- ' .local/first-hour.log) blocks)"
else
  tail -n 30 .local/first-hour.log >&2
  echo "  FAIL the first-hour tutorial's blocks (log .local/first-hour.log)"
  rc=1
fi
if grep -Eq '"task_id": ?"order-1001".*"state": ?"Processed"' "$work/statuses.txt" 2>/dev/null; then
  echo "  PASS order-1001, sent with the AWS CLI, ended Processed, read from its reply queue $STACK-reply-myapp"
else
  echo "  FAIL no Processed status of order-1001 on the reply queue (last batch: $(cat "$work/statuses.txt" 2>/dev/null))"
  rc=1
fi
if grep -q "order-1002 ended Processed" .local/first-hour.log; then
  echo "  PASS order-1002, sent with boto3, ended Processed, read from the same reply queue"
else
  echo "  FAIL order-1002 (boto3) did not end Processed on the reply queue"
  rc=1
fi
rm -rf -- "$shim" "$work"

# The documented update path: name only the parameter that changes. SAM sends UsePreviousValue
# for every other one, so samconfig.toml's Architecture and TableDeletionProtection stay as they
# were (on a first deploy, --parameter-overrides would replace samconfig.toml's instead).
update=(samlocal deploy --stack-name "$STACK" --no-confirm-changeset --parameter-overrides LogLevel=DEBUG)
log "\$ ${update[*]}"
start=$SECONDS
if "${update[@]}" >>.local/sam-deploy-local.log 2>&1 && [ "$(stack_parameter LogLevel)" = DEBUG ]; then
  echo "  PASS sam deploy --parameter-overrides LogLevel=DEBUG updated the stack in $((SECONDS - start)) s"
else
  tail -n 40 .local/sam-deploy-local.log >&2
  echo "  FAIL sam deploy --parameter-overrides LogLevel=DEBUG"
  rc=1
fi
for kv in Architecture=x86_64 TableDeletionProtection=true; do
  if [ "$(stack_parameter "${kv%%=*}")" = "${kv#*=}" ]; then
    echo "  PASS after the update the stack still has samconfig.toml's $kv"
  else
    echo "  FAIL after the update the stack has ${kv%%=*}=$(stack_parameter "${kv%%=*}"), not samconfig.toml's ${kv#*=}"
    rc=1
  fi
done
table="$(aws_table)"
if [ "$(table_protected "$table")" = True ]; then
  echo "  PASS the task table $table has DeletionProtectionEnabled"
else
  echo "  FAIL the task table $table is not protected against deletion"
  rc=1
fi
if refusal="$(infra/aws.sh dynamodb delete-table --table-name "$table" 2>&1)"; then
  echo "  FAIL DynamoDB deleted the protected task table"
  rc=1
elif grep -q "protected against deletion" <<<"$refusal"; then
  echo "  PASS DynamoDB refused to delete the protected task table"
else
  echo "  FAIL DeleteTable failed for another reason: $refusal"
  rc=1
fi

# The tear-down, as the book gives it: lift the protection on the table, then `sam delete`.
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
