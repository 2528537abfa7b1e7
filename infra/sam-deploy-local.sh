#!/usr/bin/env bash
# make sam-deploy-local: the path to AWS, taken against LocalStack. SAM's own deploy (samlocal: SAM
# CLI with LocalStack's endpoint) packages `sam build`'s output (.aws-sam/build; built here with
# infra/sam-build.sh x86_64 when missing), uploads it to S3 and creates the stack through a change
# set, with the five functions on (LocalStack runs them as host processes). Then the post-deploy
# smoke check the README gives for AWS (`sasctl --stack NAME smoke`: one sim-order task to
# Processed, its timeline), then `samlocal delete`. Knob: SAM_DEPLOY_STACK (sas-samdeploy).
set -euo pipefail

# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
cd "$SAS_ROOT"

STACK="${SAM_DEPLOY_STACK:-sas-samdeploy}"
log() { printf '[sam-deploy-local] %s\n' "$*" >&2; }

infra/tools.sh install >/dev/null
if [ ! -f .aws-sam/build/template.yaml ]; then
  log "no sam build output: infra/sam-build.sh x86_64"
  infra/sam-build.sh x86_64
fi
cargo build -q -p sas-cli --bin sasctl
if ! infra/localstack.sh healthy; then
  trap 'infra/localstack.sh stop' EXIT
fi
infra/localstack.sh ensure
export PATH="$TOOLS_VENV/bin:$PATH"

# What a user runs against AWS is `sam deploy` with samconfig.toml's default config env
# (Architecture=x86_64, TableDeletionProtection=true, confirm_changeset=true). Here: the same
# command through samlocal, without the interactive confirmation and with a table that can be
# deleted at the end (samconfig.toml's other values: resolve_s3, capabilities).
deploy=(samlocal deploy --stack-name "$STACK" --no-confirm-changeset
  --parameter-overrides "Architecture=x86_64 TableDeletionProtection=false LogLevel=info")
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

log "\$ samlocal delete --stack-name $STACK --no-prompts"
start=$SECONDS
if samlocal delete --stack-name "$STACK" --no-prompts >>.local/sam-deploy-local.log 2>&1; then
  echo "  PASS samlocal delete in $((SECONDS - start)) s"
else
  tail -n 20 .local/sam-deploy-local.log >&2
  echo "  FAIL samlocal delete"
  rc=1
fi
exit "$rc"
