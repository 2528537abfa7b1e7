#!/usr/bin/env python3
"""Deploy template.yaml onto LocalStack and check it, with boto3.

Run with the LocalStack venv's Python (it has boto3), after `source infra/env.sh`:

    .local/localstack/venv/bin/python infra/stack.py deploy NAME [Key=Value ...] [--code DIR]
    .local/localstack/venv/bin/python infra/stack.py outputs NAME
    .local/localstack/venv/bin/python infra/stack.py delete NAME
    .local/localstack/venv/bin/python infra/stack.py smoke      # deploy, verify, delete

(or `make stack-smoke`, or infra/stack.sh). CreateStack with the template body,
CAPABILITY_IAM + CAPABILITY_AUTO_EXPAND, DeployFunctions=false unless given. The SAM transform
checks every function's CodeUri before conditions are evaluated and accepts only s3:// URIs there:

- functions off (the default, the same call the project's Rust deployer makes): `CodeUri: ./`
  (what sam build needs) is rewritten to a placeholder S3 URI that nothing reads;
- functions on (`DeployFunctions=true Architecture=x86_64 --code DIR`, LocalStack started with the
  host Lambda executor): DIR holds each function's code as sam build lays it out,
  `<LogicalId>/bootstrap` (e.g. `.aws-sam/build` after `make sam-build`), or as
  `<LogicalId>.zip`; each is zipped, uploaded to LocalStack S3 (bucket CODE_BUCKET, key
  `<stack>/<LogicalId>-<sha256>.zip`) and its function's `CodeUri: ./` becomes that s3:// URI.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import time
import uuid
import zipfile
from pathlib import Path

import boto3
from botocore.config import Config

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = Path(os.environ.get("SAS_TEMPLATE", ROOT / "template.yaml"))
PLACEHOLDER_CODE_URI = "s3://sas-placeholder/functions.zip"
CODE_BUCKET = "sas-local-code"
CODE_URI_LINE = re.compile(r"^(\s*CodeUri:\s*)\./\s*$")
RESOURCE_LINE = re.compile(r"^  ([A-Za-z0-9]+):\s*$")  # a logical ID under Resources

OUTPUT_KEYS = [
    f"{queue}{kind}{attr}"
    for queue in ("Submission", "Scheduler", "Agent", "Supervisor")
    for kind in ("Queue", "Dlq")
    for attr in ("Url", "Arn")
] + ["TaskTableName", "TaskTableArn", "AlertTopicArn"]


def client(service: str):
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "http://localhost:4566")
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "test"),
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "test"),
        config=Config(retries={"max_attempts": 3, "mode": "standard"}),
    )


def localstack_body(template: str) -> str:
    """The template with `CodeUri: ./` replaced by a placeholder S3 URI (functions are off)."""
    body, count = re.subn(
        r"^(\s*CodeUri:\s*)\./\s*$", rf"\g<1>{PLACEHOLDER_CODE_URI}", template, flags=re.M
    )
    if count == 0:
        raise SystemExit("no `CodeUri: ./` found in template.yaml: has the layout changed?")
    return body


def function_code_uris() -> list[str]:
    """Logical IDs of the functions whose CodeUri is `./`, in template order."""
    current, found = None, []
    for line in TEMPLATE.read_text().splitlines():
        if match := RESOURCE_LINE.match(line):
            current = match.group(1)
        elif CODE_URI_LINE.match(line):
            found.append(current)
    return found


def zip_for(code_dir: Path, logical_id: str) -> bytes:
    """The function's code from DIR: <LogicalId>.zip as it is, or <LogicalId>/ zipped."""
    ready = code_dir / f"{logical_id}.zip"
    if ready.is_file():
        return ready.read_bytes()
    folder = code_dir / logical_id
    if not (folder / "bootstrap").is_file():
        raise SystemExit(f"--code {code_dir}: neither {ready.name} nor {logical_id}/bootstrap found")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            info = zipfile.ZipInfo(str(path.relative_to(folder)), date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (path.stat().st_mode & 0o777 | 0o100000) << 16  # keep the x bit
            info.create_system = 3
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes())
    return buf.getvalue()


def upload_code(name: str, code_dir: Path) -> dict[str, str]:
    """Upload each function's zip to LocalStack S3; returns logical ID -> s3:// URI."""
    s3 = client("s3")
    try:
        s3.create_bucket(Bucket=CODE_BUCKET)
    except (s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
        pass
    uris = {}
    for logical_id in function_code_uris():
        body = zip_for(code_dir, logical_id)
        key = f"{name}/{logical_id}-{hashlib.sha256(body).hexdigest()[:16]}.zip"
        s3.put_object(Bucket=CODE_BUCKET, Key=key, Body=body)
        uris[logical_id] = f"s3://{CODE_BUCKET}/{key}"
    return uris


def with_code_uris(template: str, uris: dict[str, str]) -> str:
    """The template with each function's `CodeUri: ./` replaced by its URI."""
    lines, current = [], None
    for line in template.splitlines(keepends=True):
        if match := RESOURCE_LINE.match(line):
            current = match.group(1)
        elif (match := CODE_URI_LINE.match(line)) and current in uris:
            line = f"{match.group(1)}{uris[current]}\n"
        lines.append(line)
    return "".join(lines)


def parse_args(args: list[str]) -> tuple[dict[str, str], Path | None]:
    params, code_dir = {"DeployFunctions": "false"}, None
    args = list(args)
    while args:
        arg = args.pop(0)
        if arg == "--code":
            if not args:
                raise SystemExit("--code needs a folder")
            code_dir = Path(args.pop(0))
            continue
        key, sep, value = arg.partition("=")
        if not sep:
            raise SystemExit(f"parameter {arg!r}: expected Key=Value")
        params[key] = value
    if params.get("DeployFunctions") == "true" and code_dir is None:
        raise SystemExit("DeployFunctions=true needs --code DIR (the functions' code; see the docstring)")
    return params, code_dir


def wait_stack(cfn, name: str, timeout: float = 180.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stack = cfn.describe_stacks(StackName=name)["Stacks"][0]
        status = stack["StackStatus"]
        if not status.endswith("_IN_PROGRESS"):
            return stack
        if time.monotonic() > deadline:
            raise SystemExit(f"stack {name}: still {status} after {timeout:.0f} s")
        time.sleep(0.5)


def failed_events(cfn, name: str) -> list[str]:
    events = cfn.describe_stack_events(StackName=name)["StackEvents"]
    return [
        f"{e['LogicalResourceId']}: {e.get('ResourceStatusReason')}"
        for e in events
        if "FAILED" in e["ResourceStatus"] and e.get("ResourceStatusReason")
    ]


def deploy(name: str, params: dict[str, str], code_dir: Path | None = None) -> dict[str, str]:
    cfn = client("cloudformation")
    body = TEMPLATE.read_text()
    if code_dir is not None:
        body = with_code_uris(body, upload_code(name, code_dir))
    elif params.get("DeployFunctions", "true") == "false":
        body = localstack_body(body)
    started = time.monotonic()
    cfn.create_stack(
        StackName=name,
        TemplateBody=body,
        Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in params.items()],
        Capabilities=["CAPABILITY_IAM", "CAPABILITY_AUTO_EXPAND"],
    )
    stack = wait_stack(cfn, name)
    if stack["StackStatus"] != "CREATE_COMPLETE":
        reasons = "\n  ".join(failed_events(cfn, name)) or stack.get("StackStatusReason")
        raise SystemExit(f"stack {name}: {stack['StackStatus']}\n  {reasons}")
    print(f"stack {name}: CREATE_COMPLETE in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def outputs(name: str) -> dict[str, str]:
    stack = client("cloudformation").describe_stacks(StackName=name)["Stacks"][0]
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def delete(name: str) -> None:
    cfn = client("cloudformation")
    started = time.monotonic()
    cfn.delete_stack(StackName=name)
    try:
        stack = wait_stack(cfn, name)
    except cfn.exceptions.ClientError:
        stack = {"StackStatus": "DELETE_COMPLETE"}  # gone
    if stack["StackStatus"] != "DELETE_COMPLETE":
        raise SystemExit(f"stack {name}: {stack['StackStatus']}: {failed_events(cfn, name)}")
    print(f"stack {name}: DELETE_COMPLETE in {time.monotonic() - started:.1f} s", file=sys.stderr)
    s3 = client("s3")  # the code zips uploaded by `deploy --code`
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=CODE_BUCKET, Prefix=f"{name}/"):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=CODE_BUCKET, Key=obj["Key"])
    except s3.exceptions.ClientError:  # no such bucket (nothing was uploaded), or no S3 service
        pass


def check(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def verify(out: dict[str, str]) -> None:
    missing = [k for k in OUTPUT_KEYS if k not in out]
    check(not missing, f"all {len(OUTPUT_KEYS)} outputs present (missing: {missing or 'none'})")

    ddb = client("dynamodb")
    table = ddb.describe_table(TableName=out["TaskTableName"])["Table"]
    indexes = {i["IndexName"]: i for i in table.get("GlobalSecondaryIndexes", [])}
    check(set(indexes) == {"ByCompleteBy", "ByProcessState"}, f"GSIs {sorted(indexes)}")
    check(
        [k["AttributeName"] for k in indexes["ByCompleteBy"]["KeySchema"]] == ["Shard", "CompleteBy"],
        "ByCompleteBy keys Shard/CompleteBy",
    )
    check(indexes["ByProcessState"]["Projection"]["ProjectionType"] == "INCLUDE", "ByProcessState INCLUDE")
    ttl = ddb.describe_time_to_live(TableName=out["TaskTableName"])["TimeToLiveDescription"]
    check(ttl.get("AttributeName") == "ExpiresAt" and ttl["TimeToLiveStatus"] == "ENABLED", "TTL on ExpiresAt")

    # Sparse index: only items carrying Shard + CompleteBy are in ByCompleteBy.
    tbl = out["TaskTableName"]
    ddb.put_item(TableName=tbl, Item={"TaskId": {"S": "done"}, "ProcessState": {"S": "Processed"},
                                      "UpdatedAt": {"N": "1"}})
    ddb.put_item(TableName=tbl, Item={"TaskId": {"S": "inflight"}, "ProcessState": {"S": "Processing"},
                                      "UpdatedAt": {"N": "2"}, "Shard": {"S": "0"},
                                      "CompleteBy": {"N": "1000"}})

    def expired(shard: str) -> list[str]:
        r = ddb.query(TableName=tbl, IndexName="ByCompleteBy",
                      # Shard is a DynamoDB reserved word: it needs an expression attribute name.
                      KeyConditionExpression="#shard = :s AND CompleteBy <= :now",
                      ExpressionAttributeNames={"#shard": "Shard"},
                      ExpressionAttributeValues={":s": {"S": shard}, ":now": {"N": "2000"}})
        return [i["TaskId"]["S"] for i in r["Items"]]

    check(expired("0") == ["inflight"], "sparse ByCompleteBy holds only the in-flight task")
    ddb.update_item(TableName=tbl, Key={"TaskId": {"S": "inflight"}}, UpdateExpression="REMOVE #shard, CompleteBy",
                    ExpressionAttributeNames={"#shard": "Shard"})
    check(expired("0") == [], "REMOVE Shard, CompleteBy drops it from the index")
    r = ddb.query(TableName=tbl, IndexName="ByProcessState",
                  KeyConditionExpression="ProcessState = :p", ExpressionAttributeValues={":p": {"S": "Processed"}})
    check([i["TaskId"]["S"] for i in r["Items"]] == ["done"], "ByProcessState query")

    # Redrive: after maxReceiveCount receives the message moves to the DLQ.
    sqs = client("sqs")
    for queue, limit in (("Submission", 3), ("Scheduler", 5), ("Agent", 3), ("Supervisor", 3)):
        attrs = sqs.get_queue_attributes(QueueUrl=out[f"{queue}QueueUrl"], AttributeNames=["All"])["Attributes"]
        policy = json.loads(attrs["RedrivePolicy"])
        check(policy["deadLetterTargetArn"] == out[f"{queue}DlqArn"] and int(policy["maxReceiveCount"]) == limit,
              f"{queue}Queue redrives to its DLQ after {limit} receives")
    # The checkov skips of CKV_AWS_27 in template.yaml rest on this: every queue has SSE-SQS.
    sse = {
        f"{queue}{kind}": sqs.get_queue_attributes(QueueUrl=out[f"{queue}{kind}Url"], AttributeNames=["All"])[
            "Attributes"
        ].get("SqsManagedSseEnabled")
        for queue in ("Submission", "Scheduler", "Agent", "Supervisor")
        for kind in ("Queue", "Dlq")
    }
    unencrypted = [name for name, enabled in sse.items() if enabled != "true"]
    check(not unencrypted, f"all 8 queues encrypted with SSE-SQS (not: {unencrypted or 'none'})")
    url, dlq = out["AgentQueueUrl"], out["AgentDlqUrl"]
    sqs.send_message(QueueUrl=url, MessageBody='{"v":1,"redrive":"test"}')
    received = 0
    for _ in range(10):
        msgs = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0, WaitTimeSeconds=1).get("Messages", [])
        received += len(msgs)
        if not msgs and received >= 3:
            break
    moved = sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=2).get("Messages", [])
    check(received == 3 and len(moved) == 1, f"redrive: {received} receives, then {len(moved)} message in AgentDLQ")

    sns = client("sns")
    attrs = sns.get_topic_attributes(TopicArn=out["AlertTopicArn"])["Attributes"]
    check(bool(attrs.get("KmsMasterKeyId")), "AlertTopic encrypted with its KMS key")


def main(argv: list[str]) -> None:
    if len(argv) < 1:
        raise SystemExit(__doc__)
    cmd, rest = argv[0], argv[1:]
    if cmd == "deploy" and rest:
        params, code_dir = parse_args(rest[1:])
        print(json.dumps(deploy(rest[0], params, code_dir), indent=2))
    elif cmd == "outputs" and len(rest) == 1:
        print(json.dumps(outputs(rest[0]), indent=2))
    elif cmd == "delete" and len(rest) == 1:
        delete(rest[0])
    elif cmd == "smoke":
        name = f"sas-smoke-{uuid.uuid4().hex[:8]}"
        params, code_dir = parse_args(rest)
        if params.get("DeployFunctions") == "true":
            raise SystemExit("smoke checks the stack with the functions off (it reads the queues itself)")
        out = deploy(name, params, code_dir)
        try:
            verify(out)
        finally:
            delete(name)
        print("stack smoke test: all checks passed")
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
