#!/usr/bin/env bash
# Write the --env-vars file for `sam local invoke` against a LocalStack stack (machines with Docker).
#
#   infra/sam-local-env.sh OUTPUTS_JSON ENDPOINT > .local/sam-env.json
#
# OUTPUTS_JSON: the stack outputs sasctl deploy-local writes (.local/outputs.json); ENDPOINT: where a
# function container reaches LocalStack (http://sas-localstack:4566 on the compose network). Every
# function gets the stack's resources; AWS_ENDPOINT_URL is only overridden when the template
# declares it, i.e. when sam local invoke is also given --parameter-overrides EndpointUrl=ENDPOINT.
set -euo pipefail
[ "$#" -eq 2 ] || { echo "usage: $0 OUTPUTS_JSON ENDPOINT" >&2; exit 2; }
python3 - "$1" "$2" <<'PY'
import json, sys
out = json.load(open(sys.argv[1]))
env = {
    "TASK_TABLE": out["TaskTableName"],
    "SUBMISSION_QUEUE_URL": out["SubmissionQueueUrl"],
    "SUBMISSION_DLQ_URL": out["SubmissionDlqUrl"],
    "SCHEDULER_QUEUE_URL": out["SchedulerQueueUrl"],
    "AGENT_QUEUE_URL": out["AgentQueueUrl"],
    "SUPERVISOR_QUEUE_URL": out["SupervisorQueueUrl"],
    "ALERT_TOPIC_ARN": out["AlertTopicArn"],
    "SUPERVISOR_SHARDS": out.get("SupervisorShards", "4"),
    "AWS_ENDPOINT_URL": sys.argv[2],
}
json.dump({"Parameters": env}, sys.stdout, indent=2)
print()
PY
