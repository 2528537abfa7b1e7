# shellcheck shell=bash
# Environment for working against the project's LocalStack. Source it, do not run it:
#
#   source infra/env.sh
#
# - AWS_ENDPOINT_URL points every AWS SDK and CLI at LocalStack (kept when already set, e.g. for a
#   LocalStack on another host or port).
# - Credentials are LocalStack's dummy ones (always set: real secrets have no business here).
# - Region defaults to us-east-1 when none is set.
# - Paths of the project-local installs (all under the git-ignored .local/).
# - The tools venv (sam, cfn-lint, awslocal, cargo-lambda) is appended to PATH when it exists, so
#   the system python3 is not shadowed; scripts that need the venv first put it first themselves.

_sas_env_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
SAS_ROOT="$(dirname -- "$_sas_env_dir")"
unset _sas_env_dir
export SAS_ROOT
export SAS_LOCAL_DIR="$SAS_ROOT/.local"

export LOCALSTACK_PORT="${LOCALSTACK_PORT:-4566}"
export LOCALSTACK_DIR="$SAS_LOCAL_DIR/localstack"
export LOCALSTACK_VENV="$LOCALSTACK_DIR/venv"
export LOCALSTACK_FS="$LOCALSTACK_DIR/fs"
export LOCALSTACK_LOG="$LOCALSTACK_DIR/localstack.log"
# LocalStack's temporary files (TMPDIR): the functions' code it unpacks (lambda/), S3 objects over
# 512 KB, its uploads. Nothing there outlives the process (no persistence): emptied at start and stop.
export LOCALSTACK_TMP="$LOCALSTACK_DIR/tmp"
export LOCALSTACK_PIDFILE="$LOCALSTACK_DIR/localstack.pid"
# The Lambda functions' role credentials (LocalStack's fake ones), kept by the host executor for
# tests whose endpoint verifies the functions' SigV4 signatures (HOST_LAMBDA_CREDENTIALS_DIR).
export HOST_LAMBDA_CREDENTIALS_DIR="${HOST_LAMBDA_CREDENTIALS_DIR:-$LOCALSTACK_DIR/credentials}"
export TOOLS_VENV="$SAS_LOCAL_DIR/tools/venv"
# checkov has its own venv (its pins clash with the tools venv); not put on PATH.
export CHECKOV_VENV="$SAS_LOCAL_DIR/tools/checkov-venv"

export AWS_ENDPOINT_URL="${AWS_ENDPOINT_URL:-http://localhost:$LOCALSTACK_PORT}"
export AWS_ACCESS_KEY_ID=test
export AWS_SECRET_ACCESS_KEY=test
unset AWS_SESSION_TOKEN
export AWS_REGION="${AWS_REGION:-${AWS_DEFAULT_REGION:-us-east-1}}"
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-$AWS_REGION}"

export SAM_CLI_TELEMETRY=0

case ":$PATH:" in
  *":$TOOLS_VENV/bin:"*) ;;
  *) if [ -d "$TOOLS_VENV/bin" ]; then export PATH="$PATH:$TOOLS_VENV/bin"; fi ;;
esac
