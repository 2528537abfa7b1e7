#!/usr/bin/env bash
# The AWS CLI (v1, from LocalStack's venv) pointed at LocalStack:
#   infra/aws.sh sqs list-queues
#   infra/aws.sh cloudformation describe-stacks --stack-name NAME
# --endpoint-url is passed explicitly: this CLI ignores AWS_ENDPOINT_URL for some services (SQS).
set -euo pipefail

# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
[ -x "$LOCALSTACK_VENV/bin/aws" ] || { echo "run infra/localstack.sh install first" >&2; exit 1; }
exec "$LOCALSTACK_VENV/bin/aws" --endpoint-url "$AWS_ENDPOINT_URL" "$@"
